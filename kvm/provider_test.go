package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/bcrypt"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// testhostAll reads every TESTHOST_* setting (see testhostEnv).
func testhostAll(t *testing.T) map[string]string {
	t.Helper()
	env := testhostEnv(t)
	b, err := os.ReadFile(filepath.Join("..", ".testhost", "env"))
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimPrefix(strings.TrimSpace(line), "export ")
			if k, v, ok := strings.Cut(line, "="); ok && env[k] == "" {
				env[k] = strings.Trim(v, `'"`)
			}
		}
	}
	for _, k := range []string{"TESTHOST_POOL", "TESTHOST_NETWORK", "TESTHOST_GUEST_KERNEL", "TESTHOST_GUEST_DISK"} {
		if v := os.Getenv(k); v != "" {
			env[k] = v
		}
		if env[k] == "" {
			t.Fatalf("test host setting %s missing\n%s", k, testhostHint)
		}
	}
	return env
}

// testGuestImage is the project's test guest as an image source.
func testGuestImage(env map[string]string) ImageSource {
	return ImageSource{
		Name: "testguest", URL: "file://" + env["TESTHOST_GUEST_DISK"], SHA256: env["TESTHOST_GUEST_DISK_SHA256"], Format: "raw",
		Kernel:  &ArtifactSource{URL: "file://" + env["TESTHOST_GUEST_KERNEL"], SHA256: env["TESTHOST_GUEST_KERNEL_SHA256"]},
		Initrd:  &ArtifactSource{URL: "file://" + env["TESTHOST_GUEST_INITRD"], SHA256: env["TESTHOST_GUEST_INITRD_SHA256"]},
		Cmdline: strings.Trim(env["TESTHOST_GUEST_CMDLINE"], "'"),
	}
}

// testhostEntry is the test host as a host entry, reached over its own sshd
// inside the namespace.
func testhostEntry(env map[string]string, name string) HostOptions {
	return HostOptions{
		Name:    name,
		Address: env["TESTHOST_SSH_ADDR"], User: env["TESTHOST_SSH_USER"], KeyFile: env["TESTHOST_SSH_KEY"], KnownHosts: env["TESTHOST_KNOWN_HOSTS"],
		Pool: env["TESTHOST_POOL"], Network: env["TESTHOST_NETWORK"], DomainType: DomainQEMU,
		Budgets: Budgets{Call: 20 * time.Second, TransferStall: 10 * time.Second, Close: 5 * time.Second, Connect: 10 * time.Second, Keepalive: 5 * time.Second},
	}
}

func newTestProvider(t *testing.T, env map[string]string, mod func(*Options)) *Provider {
	t.Helper()
	cfg := Options{
		Host:   testhostEntry(env, "th1"),
		Images: []ImageSource{testGuestImage(env)},
		Proxy:  testGuestProxy,
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func testID(prefix string) string { return fmt.Sprintf("%s-%06d", prefix, rand.IntN(1000000)) }

func testSpec(id string) fleet.Spec {
	return fleet.Spec{ID: id, Image: "testguest", CPUs: 1, MemoryMiB: 128, CommandID: "cmd-" + id, SpecHash: "0123456789abcdef"}
}

// cleanupProxy deletes id when the test ends, whatever happened.
func cleanupProxy(t *testing.T, p *Provider, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.Delete(ctx, id); err != nil {
			t.Errorf("clean up %s: %v", id, err)
		}
	})
}

// awaitRunning polls Get until the proxy runs with an address.
func awaitRunning(t *testing.T, p *Provider, id string, bound time.Duration) fleet.Instance {
	t.Helper()
	var last fleet.Instance
	var lastErr error
	if !poll.WaitEvery(bound, 500*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		last, lastErr = p.Get(ctx, id)
		return lastErr == nil && last.State == messages.StateRunning
	}) {
		t.Fatalf("%s not running within %s: last %+v, %v", id, bound, last, lastErr)
	}
	return last
}

// guest asks the test guest's control API (port 9090) something.
func guest(t *testing.T, method, ip, path string) string {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+ip+":9090"+path, nil)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var body string
	var lastErr error
	if !poll.WaitEvery(5*time.Second, 500*time.Millisecond, func() bool {
		resp, err := c.Do(req)
		if err != nil {
			lastErr = err
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("%s", resp.Status)
			return false
		}
		body = strings.TrimSpace(string(b))
		return true
	}) {
		t.Fatalf("%s %s%s: %v", method, ip, path, lastErr)
	}
	return body
}

// TestProvider_roundTrip creates a real proxy on the test host over SSH,
// watches it boot, reads its address from the agent and, with the agent
// stopped, from the lease, checks the guest read its seed, and deletes it.
func TestProvider_roundTrip(t *testing.T) {
	env := testhostAll(t)
	p := newTestProvider(t, env, nil)
	id := testID("rt")
	cleanupProxy(t, p, id)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	spec := testSpec(id)
	in, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if in.State != messages.StateProvisioning || in.IP != "" {
		t.Errorf("right after create: %+v, want provisioning without an address", in)
	}
	if in.CommandID != spec.CommandID || in.SpecHash != spec.SpecHash {
		t.Errorf("mark read back as %+v", in)
	}
	in = awaitRunning(t, p, id, 2*time.Minute)
	// The DHCP lease may answer before the guest agent is up; once the
	// agent answers, it is the source.
	poll.WaitEvery(time.Minute, 500*time.Millisecond, func() bool {
		if got, err := p.Get(ctx, id); err == nil && got.State == messages.StateRunning {
			in = got
		}
		return in.Source == messages.SourceAgent
	})
	if !strings.HasPrefix(in.IP, "198.18.100.") || in.Source != messages.SourceAgent {
		t.Errorf("running: %+v, want an address in 198.18.100.0/24 from the agent", in)
	}
	if got := guest(t, "GET", in.IP, "/instance-id"); got != instanceID(spec) {
		t.Errorf("guest instance-id %q, want %q (from the seed)", got, instanceID(spec))
	}

	// Idempotent: a second create finds the marked domain.
	again, err := p.Create(ctx, fleet.Spec{ID: id, Image: "testguest", CPUs: 1, MemoryMiB: 128, CommandID: "other", SpecHash: "other"})
	if err != nil || again.CommandID != spec.CommandID {
		t.Errorf("second create: %+v %v, want the first domain", again, err)
	}

	guest(t, "POST", in.IP, "/agent/stop")
	var got fleet.Instance
	if !poll.WaitEvery(time.Minute, 500*time.Millisecond, func() bool {
		got, err = p.Get(ctx, id)
		return err == nil && got.State == messages.StateRunning && got.Source == messages.SourceLease
	}) {
		t.Fatalf("with the agent stopped: %+v %v, want running from the lease", got, err)
	}
	if got.IP != in.IP {
		t.Errorf("lease address %s, agent said %s", got.IP, in.IP)
	}
	guest(t, "POST", in.IP, "/agent/start")

	list, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasInstance(list, id) {
		t.Errorf("List does not have %s: %+v", id, list)
	}
	// Another host entry on the same daemon does not list it, so its
	// sweeps never touch this entry's domains.
	other := newTestProvider(t, env, func(c *Options) { c.Host.Name = "th-other" })
	if list, err := other.List(ctx); err != nil || hasInstance(list, id) {
		t.Errorf("another entry lists %s: %+v %v", id, list, err)
	}
	vols, err := p.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(vols, overlayVolumeName(id)) || !contains(vols, seedVolumeName(id)) {
		t.Errorf("ListVolumes = %v, want the overlay and seed of %s", vols, id)
	}

	if err := p.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := p.Get(ctx, id); fleet.ClassOf(err) != fleet.ClassNotFound {
		t.Errorf("get after delete: %v, want not found", err)
	}
	vols, _ = p.ListVolumes(ctx)
	for _, v := range vols {
		if strings.Contains(v, id) {
			t.Errorf("volume %s left after delete", v)
		}
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Errorf("delete of an absent proxy: %v", err)
	}
}

func hasInstance(list []fleet.Instance, id string) bool {
	for _, in := range list {
		if in.ID == id {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestProvider_failedCreateCleansUp: a create that fails after making its
// volumes removes them.
func TestProvider_failedCreateCleansUp(t *testing.T) {
	env := testhostAll(t)
	p := newTestProvider(t, env, func(c *Options) { c.Host.Network = "no-such-network" })
	id := testID("fc")
	cleanupProxy(t, p, id)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := p.Create(ctx, testSpec(id))
	if err == nil {
		t.Fatal("create on a missing network succeeded")
	}
	if _, err := p.Get(ctx, id); fleet.ClassOf(err) != fleet.ClassNotFound {
		t.Errorf("domain left after a failed create: %v", err)
	}
	vols, _ := p.ListVolumes(ctx)
	for _, v := range vols {
		if strings.Contains(v, id) {
			t.Errorf("volume %s left after a failed create", v)
		}
	}
}

// TestProvider_notOursIsRefused: a domain with our name but no mark is never
// reported, started or deleted.
func TestProvider_notOursIsRefused(t *testing.T) {
	env := testhostAll(t)
	p := newTestProvider(t, env, nil)
	id := testID("no")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	xml := fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>32</memory><os><type>hvm</type></os></domain>`, domainName(id))
	err := p.call(ctx, func(l *libvirt.Libvirt) error { _, err := l.DomainDefineXML(xml); return err })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.call(context.Background(), func(l *libvirt.Libvirt) error {
			d, err := l.DomainLookupByName(domainName(id))
			if err != nil {
				return err
			}
			return l.DomainUndefine(d)
		})
	})
	// A volume with the name of its id's seed goes with the domain: a
	// refused delete leaves it too.
	volXML, err := plainVolumeXML(seedVolumeName(id), 4096, "raw")
	if err != nil {
		t.Fatal(err)
	}
	err = p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(p.opts.Host.Pool)
		if err != nil {
			return err
		}
		_, err = l.StorageVolCreateXML(sp, volXML, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.deleteVolume(context.Background(), seedVolumeName(id)) })
	if _, err := p.Get(ctx, id); !errors.Is(err, ErrNotOurs) || fleet.ClassOf(err) != fleet.ClassPermanent {
		t.Errorf("get of a foreign domain: %v, want permanent ErrNotOurs", err)
	}
	if err := p.Delete(ctx, id); !errors.Is(err, ErrNotOurs) {
		t.Errorf("delete of a foreign domain: %v, want ErrNotOurs", err)
	}
	if d, _, s := artifacts(t, p, id); !d || !s {
		t.Errorf("after a refused delete: domain %v, seed %v; want both left alone", d, s)
	}
	if list, _ := p.List(ctx); hasInstance(list, id) {
		t.Error("List reports a foreign domain")
	}
}

// testGuestProxy is the proxy configuration of the tests' proxies: a
// credential and an allow-list, as the test host's config has.
var testGuestProxy = GuestProxy{
	User: "fleet", Password: "pw-for-tests",
	Allow: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("198.18.0.1/32")},
}

// The fuzz targets render the default user-data, with its bcrypt hash, on
// every input: at the lowest cost.
func init() { bcryptCost = bcrypt.MinCost }
