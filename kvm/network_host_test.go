package kvm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// debianImage is the stock Debian guest (deploy/guest/, built by make
// testhost into .guest/) as an image source.
func debianImage(t *testing.T, env map[string]string) ImageSource {
	t.Helper()
	for _, k := range []string{"TESTHOST_DEBIAN_DISK", "TESTHOST_DEBIAN_DISK_SHA256", "TESTHOST_DEBIAN_KERNEL",
		"TESTHOST_DEBIAN_KERNEL_SHA256", "TESTHOST_DEBIAN_INITRD", "TESTHOST_DEBIAN_INITRD_SHA256", "TESTHOST_DEBIAN_CMDLINE"} {
		if env[k] == "" {
			t.Fatalf("%s is not set: make testhost builds the Debian guest into .guest/\n%s", k, testhostHint)
		}
	}
	return ImageSource{
		Name: "proxy-debian", URL: "file://" + env["TESTHOST_DEBIAN_DISK"], SHA256: env["TESTHOST_DEBIAN_DISK_SHA256"], Format: "qcow2",
		Kernel:  &ArtifactSource{URL: "file://" + env["TESTHOST_DEBIAN_KERNEL"], SHA256: env["TESTHOST_DEBIAN_KERNEL_SHA256"]},
		Initrd:  &ArtifactSource{URL: "file://" + env["TESTHOST_DEBIAN_INITRD"], SHA256: env["TESTHOST_DEBIAN_INITRD_SHA256"]},
		Cmdline: strings.Trim(env["TESTHOST_DEBIAN_CMDLINE"], "'"),
	}
}

// TestStaticNetwork_debianGuest: the stock Debian guest (cloud-init 22.4.2
// rendering for ifupdown) configures the network its seed's network-config
// gives it: a /32 from 198.18.101.0/24 and two /128s from
// 2001:db8:101::/64, outside the test network's own prefixes, with on-link
// default routes to the test network's bridge (its IPv6 address, or
// fe80::1 where the network has none), and no address of its own from
// router advertisements. Seen through the guest agent (its addresses, and
// `ip route` run by guest-exec); over the network only where the test host
// routes those prefixes to its bridge (then asserted). Get reports the
// plan's address with Source plan and the plan's Egress, before the guest
// boots and once the agent confirms it; List reports the same.
func TestStaticNetwork_debianGuest(t *testing.T) {
	env := testhostAll(t)
	p, img := netProvider(t, env)
	id := testID("net")
	cleanupProxy(t, p, id)

	gw4, gw6 := bridgeAddrs(t, p)
	host := 10 + rand.IntN(240)
	n := fleet.Network{
		MAC:         fmt.Sprintf("52:54:00:%02x:%02x:%02x", rand.IntN(256), rand.IntN(256), rand.IntN(256)),
		IPv4:        netip.MustParseAddr(fmt.Sprintf("198.18.101.%d", host)),
		IPv4Gateway: gw4,
		IPv6: []netip.Addr{netip.MustParseAddr(fmt.Sprintf("2001:db8:101::%x", host)),
			netip.MustParseAddr(fmt.Sprintf("2001:db8:101::%x:1", host))},
		IPv6Gateway: gw6,
	}
	spec := fleet.Spec{ID: id, Image: img.Name, CPUs: 1, MemoryMiB: 512, CommandID: "cmd-" + id, SpecHash: "0123456789abcdef", Network: n}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	in, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	want := fleet.Instance{ID: id, State: messages.StateRunning, IP: n.IPv4.String(), Source: messages.SourcePlan,
		CommandID: spec.CommandID, SpecHash: spec.SpecHash, CreatedAt: in.CreatedAt, Egress: n.Egress()}
	if !reflect.DeepEqual(in, want) {
		t.Fatalf("create returned %+v, want %+v (the plan's address, the agent not up yet)", in, want)
	}

	dom, m, err := p.lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if m.Addr != n.IPv4 || !reflect.DeepEqual(m.Egress, n.Egress()) {
		t.Fatalf("mark records %v of %v", m.Addr, m.Egress)
	}

	// Until the agent reports the planned addresses: each state Get
	// reports on the way is logged (the agent may answer before the
	// guest configured its interface: provisioning, "address mismatch").
	var states []string
	var agentAddrs []string
	if !poll.WaitEvery(6*time.Minute, 2*time.Second, func() bool {
		got, err := p.Get(ctx, id)
		s := fmt.Sprintf("%s %q", got.State, got.Reason)
		if err != nil {
			s = "error " + err.Error()
		}
		if len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
			t.Logf("%5.1fs Get: %s", time.Since(start).Seconds(), s)
		}
		ifaces, err := p.interfaces(ctx, dom, libvirt.DomainInterfaceAddressesSrcAgent)
		if err != nil {
			return false
		}
		agentAddrs = agentAddrs[:0]
		for _, ifc := range ifaces {
			for _, a := range ifc.Addrs {
				agentAddrs = append(agentAddrs, ifc.Name+" "+a.Addr)
			}
		}
		for _, a := range n.Egress() {
			if !slices.Contains(agentAddrs, "eth0 "+a.String()) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the agent never reported %v on eth0; last: %v; console: virsh console %s", n.Egress(), agentAddrs, domainName(id))
	}
	t.Logf("%5.1fs the agent reports %v", time.Since(start).Seconds(), agentAddrs)

	got, err := p.Get(ctx, id)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}
	list, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(in fleet.Instance) bool { return in.ID == id })
	if i < 0 || list[i].IP != n.IPv4.String() || list[i].Source != messages.SourcePlan || !reflect.DeepEqual(list[i].Egress, n.Egress()) {
		t.Fatalf("List has %+v", list)
	}

	// The on-link default routes ifupdown made of gateway4 and gateway6.
	r4 := agentExec(t, p, dom, "/bin/ip", "-4", "route", "show", "default")
	r6 := agentExec(t, p, dom, "/bin/ip", "-6", "route", "show", "default")
	t.Logf("guest routes:\n%s%s", r4, r6)
	if !strings.Contains(r4, fmt.Sprintf("default via %s dev eth0 onlink", gw4)) || strings.Count(r4, "default") != 1 {
		t.Errorf("want one on-link IPv4 default route via %s:\n%s", gw4, r4)
	}
	if !strings.Contains(r6, fmt.Sprintf("default via %s dev eth0", gw6)) || !strings.Contains(r6, "onlink") || strings.Count(r6, "default") != 1 {
		t.Errorf("want one on-link IPv6 default route via %s (none from router advertisements):\n%s", gw6, r6)
	}
	if ra := agentExec(t, p, dom, "/bin/cat", "/proc/sys/net/ipv6/conf/eth0/accept_ra"); strings.TrimSpace(ra) != "0" {
		t.Errorf("eth0 accept_ra is %q, want 0", ra)
	}
	// Only the plan's addresses and the link-local one: none from RAs.
	a := agentExec(t, p, dom, "/bin/ip", "-br", "addr", "show", "dev", "eth0")
	t.Logf("guest eth0: %s", a)
	for _, f := range strings.Fields(a)[2:] {
		if pf := netip.MustParsePrefix(f); !pf.Addr().IsLinkLocalUnicast() && !slices.Contains(n.Egress(), pf.Addr()) {
			t.Errorf("eth0 has %s, not the plan's", f)
		}
	}

	// Over the network: squid's port from the root namespace, where the
	// test host routes the plan's prefixes to its bridge.
	for _, ip := range []netip.Addr{n.IPv4, n.IPv6[0]} {
		if !routedToTestHost(t, ip, env) {
			t.Logf("%s: the test host routes no prefix of it; not reached over the network", ip)
			continue
		}
		var dialErr error
		if !poll.WaitEvery(2*time.Minute, time.Second, func() bool {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), "3128"), 2*time.Second)
			if err == nil {
				c.Close()
			}
			dialErr = err
			return err == nil
		}) {
			t.Errorf("%s not reachable from the root namespace: %v", net.JoinHostPort(ip.String(), "3128"), dialErr)
			continue
		}
		t.Logf("%5.1fs %s answers from the root namespace", time.Since(start).Seconds(), net.JoinHostPort(ip.String(), "3128"))
	}
}

// netProvider is a provider of the host entry "thnet", the static network
// tests' own, with the Debian guest image: the Debian base is cached for
// that entry alone, and no other test's sweep of its entry's images
// removes it.
func netProvider(t *testing.T, env map[string]string) (*Provider, ImageSource) {
	t.Helper()
	img := debianImage(t, env)
	p := newTestProvider(t, env, func(o *Options) {
		o.Host = testhostEntry(env, "thnet")
		o.Images = []ImageSource{img}
	})
	return p, img
}

// bridgeAddrs are the test network's own addresses, the on-link gateways
// of a static network on it: its IPv4 one, and its IPv6 one or fe80::1
// where it has none.
func bridgeAddrs(t *testing.T, p *Provider) (v4, v6 netip.Addr) {
	t.Helper()
	var doc string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		nw, err := l.NetworkLookupByName(p.opts.Host.Network)
		if err != nil {
			return err
		}
		doc, err = l.NetworkGetXMLDesc(nw, 0)
		return err
	})
	if err != nil {
		t.Fatalf("network %s: %v", p.opts.Host.Network, err)
	}
	var nw libvirtxml.Network
	if err := nw.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	v6 = netip.MustParseAddr("fe80::1")
	for _, ip := range nw.IPs {
		a, err := netip.ParseAddr(ip.Address)
		switch {
		case err != nil:
		case a.Is4():
			v4 = a
		case ip.Family == "ipv6":
			v6 = a
		}
	}
	if !v4.IsValid() {
		t.Fatalf("network %s has no IPv4 address:\n%s", p.opts.Host.Network, doc)
	}
	return v4, v6
}

// routedToTestHost reports whether the root namespace routes ip through
// a gateway on the link to the test host's namespace (the one its
// TESTHOST_NS_IP is on).
func routedToTestHost(t *testing.T, ip netip.Addr, env map[string]string) bool {
	t.Helper()
	route := func(dst string) (via, dev string) {
		out, err := exec.Command("ip", "route", "get", dst).CombinedOutput()
		if err != nil {
			return "", ""
		}
		f := strings.Fields(string(out))
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "via":
				via = f[i+1]
			case "dev":
				dev = f[i+1]
			}
		}
		return via, dev
	}
	_, nsDev := route(env["TESTHOST_NS_IP"])
	via, dev := route(ip.String())
	return nsDev != "" && via != "" && dev == nsDev
}

// agentExec runs path with args in the guest through its agent
// (guest-exec) and returns its standard output; any failure fails t.
func agentExec(t *testing.T, p *Provider, dom libvirt.Domain, path string, args ...string) string {
	t.Helper()
	out, err := tryAgentExec(p, dom, path, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryAgentExec is agentExec returning its failure: no agent yet, or a
// command that did not exit 0 within 30 s.
func tryAgentExec(p *Provider, dom libvirt.Domain, path string, args ...string) (string, error) {
	agent := func(cmd any, out any) error {
		b, err := json.Marshal(cmd)
		if err != nil {
			return err
		}
		var ret libvirt.OptString
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = p.call(ctx, func(l *libvirt.Libvirt) error {
			var err error
			ret, err = l.QEMUDomainAgentCommand(dom, string(b), 10, 0)
			return err
		})
		if err != nil {
			return err
		}
		if len(ret) == 0 {
			return fmt.Errorf("no answer to %s", b)
		}
		return json.Unmarshal([]byte(ret[0]), &struct {
			Return any `json:"return"`
		}{out})
	}
	var started struct {
		PID int `json:"pid"`
	}
	if err := agent(map[string]any{"execute": "guest-exec",
		"arguments": map[string]any{"path": path, "arg": args, "capture-output": true}}, &started); err != nil {
		return "", fmt.Errorf("guest-exec %s: %w", path, err)
	}
	var st struct {
		Exited   bool   `json:"exited"`
		ExitCode int    `json:"exitcode"`
		OutData  string `json:"out-data"`
	}
	if !poll.Wait(30*time.Second, func() bool {
		return agent(map[string]any{"execute": "guest-exec-status", "arguments": map[string]any{"pid": started.PID}}, &st) == nil && st.Exited
	}) {
		return "", fmt.Errorf("guest-exec %s %v: not done within 30s", path, args)
	}
	out, err := base64.StdEncoding.DecodeString(st.OutData)
	if err != nil || st.ExitCode != 0 {
		return "", fmt.Errorf("guest-exec %s %v: exit %d, %v", path, args, st.ExitCode, err)
	}
	return string(out), nil
}

// TestStaticNetworkIPv4Only_debianGuest: a guest whose plan gives it an
// IPv4 address alone has IPv6 off on eth0 once cloud-init has run (the
// default user-data's), and holds no IPv6 address or route there, so
// nothing but the plan's address is there for squid to leave from,
// whatever a router on the link advertises.
func TestStaticNetworkIPv4Only_debianGuest(t *testing.T) {
	env := testhostAll(t)
	p, img := netProvider(t, env)
	id := testID("net4")
	cleanupProxy(t, p, id)
	gw4, _ := bridgeAddrs(t, p)
	// .211 to .220 of the IPv4 block: no other test takes them.
	n := fleet.Network{
		MAC:         fmt.Sprintf("52:54:00:%02x:%02x:%02x", rand.IntN(256), rand.IntN(256), rand.IntN(256)),
		IPv4:        netip.MustParseAddr(fmt.Sprintf("198.18.101.%d", 211+rand.IntN(10))),
		IPv4Gateway: gw4,
	}
	spec := fleet.Spec{ID: id, Image: img.Name, CPUs: 1, MemoryMiB: 512, CommandID: "cmd-" + id, SpecHash: "0123456789abcdef", Network: n}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := p.Create(ctx, spec); err != nil {
		t.Fatalf("create: %v", err)
	}
	dom, _, err := p.lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// cloud-init's bootcmd has run once the file it writes in the same
	// stage is there; its sysctl runs before that.
	var last string
	if !poll.WaitEvery(6*time.Minute, 2*time.Second, func() bool {
		out, err := tryAgentExec(p, dom, "/bin/cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6", noIPv6Path)
		last = fmt.Sprintf("%q %v", out, err)
		return err == nil && strings.HasPrefix(out, "1\n")
	}) {
		t.Fatalf("IPv6 never turned off on eth0; last: %s; console: virsh console %s", last, domainName(id))
	}
	t.Logf("%5.1fs IPv6 is off on eth0", time.Since(start).Seconds())
	a := agentExec(t, p, dom, "/bin/ip", "-6", "addr", "show", "dev", "eth0")
	r := agentExec(t, p, dom, "/bin/ip", "-6", "route", "show")
	if strings.TrimSpace(a) != "" || strings.Contains(r, "eth0") {
		t.Errorf("eth0 has IPv6 left:\n%s\n%s", a, r)
	}
	a4 := agentExec(t, p, dom, "/bin/ip", "-br", "-4", "addr", "show", "dev", "eth0")
	if !strings.Contains(a4, n.IPv4.String()+"/32") {
		t.Errorf("eth0 lacks the plan's address %s: %s", n.IPv4, a4)
	}
}
