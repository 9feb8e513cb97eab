package kvm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// runningGuest creates a test guest through p and waits until it runs. It
// is deleted through cleanup (a provider with ordinary budgets: a destroy
// of a running guest can take longer than a fault test's short budget).
func runningGuest(t *testing.T, p, cleanup *Provider, prefix string) fleet.Instance {
	t.Helper()
	id := testID(prefix)
	cleanupProxy(t, cleanup, id)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := p.Create(ctx, testSpec(id)); err != nil {
		t.Fatalf("create: %v", err)
	}
	return awaitRunning(t, p, id, 2*time.Minute)
}

// TestGet_everyAddressSourceFailingIsTransient: an unreadable address is
// never a missing one. With the guest agent stopped, the DHCP lease file
// unreadable and ARP failing (it fails on every call on this libvirt), no
// source can answer. That is not "no address yet": Get must fail
// transient, and stay transient though the agent's error carries a code
// that alone would be permanent.
func TestGet_everyAddressSourceFailingIsTransient(t *testing.T) {
	env := testhostAll(t)
	p := newTestProvider(t, env, nil)
	in := runningGuest(t, p, p, "h3a")
	guest(t, "POST", in.IP, "/agent/stop")
	t.Cleanup(func() { guest(t, "POST", in.IP, "/agent/start") })

	// The guest may run (its agent answered) before libvirt's lease
	// helper has written its lease to the status file: a copy taken
	// before that, written back below, would lose the lease for good.
	status := "/var/lib/libvirt/dnsmasq/pfbr0.status"
	var orig []byte
	poll.Until(t, "the guest's lease in "+status, time.Minute, func() bool {
		b, err := os.ReadFile(status)
		orig = b
		return err == nil && bytes.Contains(b, []byte(`"`+in.IP+`"`))
	})
	t.Cleanup(func() { _ = os.WriteFile(status, orig, 0o644) })
	if err := os.WriteFile(status, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}

	flushNeighbours(t, env)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := p.Get(ctx, in.ID)
	if err == nil {
		t.Fatalf("Get = %+v, want an error: every address source failed", got)
	}
	if !errors.Is(err, ErrNoAddressSource) || fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("Get error %v (class %s), want transient ErrNoAddressSource", err, fleet.ClassOf(err))
	}
	t.Logf("every source failed: %v", err)

	// With the lease file back, the lease answers again.
	_ = os.WriteFile(status, orig, 0o644)
	got, err = p.Get(ctx, in.ID)
	if err != nil || got.State != messages.StateRunning || got.Source != messages.SourceLease {
		t.Fatalf("with the lease readable: %+v %v, want running from the lease", got, err)
	}
}

// flushNeighbours empties the test host's neighbour table. This libvirt's
// ARP source errors ("wrong nlmsg len") only while the table fits in one
// netlink read: the stale entries guests of earlier tests leave (IPv6 ones
// above all) make it answer cleanly with whatever that read held.
func flushNeighbours(t *testing.T, env map[string]string) {
	t.Helper()
	ns := env["TESTHOST_NETNS"]
	if ns == "" {
		ns = "pftest"
	}
	if out, err := exec.Command("ip", "-n", ns, "neigh", "flush", "all").CombinedOutput(); err != nil {
		t.Fatalf("flush the neighbour table of %s: %v\n%s", ns, err, out)
	}
}

// TestGet_deadLinkDuringAddressIsTransient: the link dying under the
// address read (here: stalled in a fault proxy until the call's budget
// kills it) is a transient error, never a running proxy without an address.
func TestGet_deadLinkDuringAddressIsTransient(t *testing.T) {
	env := testhostAll(t)
	s := startSSHD(t)
	fp := s.proxy(t)
	lc := LinkConfig{SSH: s.sshConfig(t, fp.Addr()), Budgets: Budgets{Call: 2 * time.Second, Connect: 2 * time.Second, TransferStall: 5 * time.Second, Close: time.Second}}
	p := newTestProvider(t, env, func(c *Options) { c.Link = &lc })
	in := runningGuest(t, p, newTestProvider(t, env, nil), "h3b")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dom, _, err := p.lookup(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	fp.Stall()
	ip, src, err := p.address(ctx, dom)
	fp.Pass()
	if err == nil {
		t.Fatalf("address = %q from %q with a dead link, want a transient error", ip, src)
	}
	if !errors.Is(err, ErrLinkDead) || fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("address error %v (class %s), want transient ErrLinkDead", err, fleet.ClassOf(err))
	}
	// The next call redials and the proxy is running again.
	got, err := p.Get(ctx, in.ID)
	if err != nil || got.State != messages.StateRunning {
		t.Fatalf("after the stall: %+v %v", got, err)
	}
}
