package main

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"proxyfleet/addrplan"
	"proxyfleet/config"
	"proxyfleet/messages"
)

// egressPlan is the address plan of a test's host entry: the n-th /28 of
// the test host's block left free for tests' own plans
// (TESTHOST_EGRESS_IPV4_FREE), and the n-th /120 of its IPv6 /64's free
// half at 16 addresses a proxy, the gateways left to the network's own
// addresses. Each test that runs proxies with a plan takes an n of its
// own, so no two tests' entries give one address.
func egressPlan(t *testing.T, n int) *addrplan.Config {
	t.Helper()
	get := func(k string) netip.Prefix {
		p, err := netip.ParsePrefix(os.Getenv(k))
		if err != nil {
			t.Fatalf("%s = %q: %v (run make testhost)", k, os.Getenv(k), err)
		}
		return p
	}
	v4, v6 := get("TESTHOST_EGRESS_IPV4_FREE"), get("TESTHOST_EGRESS_IPV6_FREE")
	b4, b6 := v4.Addr().As4(), v6.Addr().As16()
	b4[3] += byte(16 * n)
	b6[14] += byte(n)
	return &addrplan.Config{
		IPv4:         []string{netip.PrefixFrom(netip.AddrFrom4(b4), 28).String()},
		IPv6:         []string{netip.PrefixFrom(netip.AddrFrom16(b6), 120).String()},
		IPv6PerProxy: 16,
		ReuseAfter:   time.Hour,
	}
}

// Two real Debian guests on one host with a plan get distinct IPv4
// addresses of the plan, configured by cloud-init from their seeds (no
// DHCP lease), reported at once (source plan) and seen by a target as the
// source of their requests; the first's delete frees its addresses, and a
// create right after gets none of them (reuse_after).
func TestRealGuestsLeaveFromTheirPlannedAddresses(t *testing.T) {
	plan := egressPlan(t, 0)
	e, rot := realGuestRig(t, "th-egress", func(c *config.Config) { c.Hosts[0].Addresses = plan })
	p, err := addrplan.New("th-egress", *plan)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"egress-a", "egress-b"}
	e.cleanupProxies(append(ids, "egress-c")...)
	token := "egress-" + time.Now().Format("150405.000")
	targetURL, requests := recordingTarget(t, rootIP(), token)
	// The target by a name only the host network's DNS (libvirt's
	// dnsmasq) knows: a static guest is told no resolver but the one the
	// plan defaults to, the network's own address.
	targetName := "egress-target.pftest.test"
	addDNSHost(t, e.cfg.Hosts[0].Network, rootIP(), targetName)
	byName := strings.Replace(targetURL, rootIP(), targetName, 1)

	var cmds []string
	for _, id := range ids {
		cmds = append(cmds, e.createReal(id))
	}
	e.waitDone(8*time.Minute, cmds...)
	planned := map[string]messages.StateEvent{}
	for _, id := range ids {
		ev := e.lastEvent(id)
		a, err := netip.ParseAddr(ev.IP)
		if ev.State != messages.StateRunning || err != nil || ev.Source != messages.SourcePlan || p.Slot4Of(a) == 0 {
			t.Fatalf("%s: last event %+v, want running at an address of the plan (source plan)", id, ev)
		}
		egress, err := messages.ExpandEgress(ev.Egress)
		if err != nil || len(egress) != 17 || egress[0] != a {
			t.Errorf("%s: egress %v (%v), want its IPv4 address and 16 IPv6 addresses", id, ev.Egress, err)
		}
		planned[id] = ev
	}
	if planned[ids[0]].IP == planned[ids[1]].IP {
		t.Fatalf("both proxies have %s", planned[ids[0]].IP)
	}
	for _, id := range ids {
		ev := planned[id]
		waitUntil(t, id+" in the rotation", 4*time.Minute, func() bool { return rot.has(id) })
		// cloud-init configured the address: the agent lists it, and no
		// DHCP lease was taken.
		dom := "pf-" + id
		if out := virsh(t, "domifaddr", dom, "--source", "agent"); !containsAddr(out, ev.IP) {
			t.Errorf("%s: the agent does not list %s:\n%s", id, ev.IP, out)
		}
		if out := virsh(t, "domifaddr", dom, "--source", "lease"); containsAddr(out, ev.IP) || len(leases(out)) > 0 {
			t.Errorf("%s: a DHCP lease was taken:\n%s", id, out)
		}
		before := len(requests())
		addr := net.JoinHostPort(ev.IP, "3128")
		if got, err := e.through(addr, targetURL); err != nil || got != token {
			t.Fatalf("through %s: %q, %v", addr, got, err)
		}
		var from string
		for _, r := range requests()[before:] {
			if r.header.Get("User-Agent") != "proxyfleet-health" {
				from, _, _ = net.SplitHostPort(r.remote)
			}
		}
		if from != ev.IP {
			t.Errorf("%s: the target saw the request come from %q, want %s", id, from, ev.IP)
		}
		if got, err := e.through(addr, byName); err != nil || got != token {
			t.Errorf("through %s to %s: %q, %v; want the target's token (the name resolved by the network's DNS)", addr, byName, got, err)
		}
	}

	// The second's guest leaves from another address (a secondary
	// address of the routed block, not its plan's, which squid is made to
	// bind in place of its plan's): health refuses it, egress mismatch.
	other := netip.MustParseAddr(planned[ids[1]].IP)
	for p.Slot4Of(other) != 0 || other == netip.MustParseAddr(planned[ids[0]].IP) {
		other = other.Next()
	}
	dom := "pf-" + ids[1]
	agentExec(t, dom, "/usr/sbin/ip", "addr", "add", other.String()+"/32", "dev", "eth0")
	planIP := strings.ReplaceAll(planned[ids[1]].IP, ".", `\.`)
	agentExec(t, dom, "/usr/bin/sed", "-i", "-E",
		`s/^tcp_outgoing_address `+planIP+`( |$)/tcp_outgoing_address `+other.String()+`\1/`, "/etc/squid/squid.conf")
	if conf := agentExec(t, dom, "/usr/bin/cat", "/etc/squid/squid.conf"); !strings.Contains(conf, "tcp_outgoing_address "+other.String()) {
		t.Fatalf("squid.conf binds no %s:\n%s", other, conf)
	}
	// squid keeps its connections to the probe target: new ones take the
	// new source.
	agentExec(t, dom, "/usr/bin/systemctl", "restart", "squid")
	waitUntil(t, ids[1]+" refused: egress mismatch", 2*time.Minute, func() bool {
		c, ok := e.check(ids[1])
		return ok && c.Verdict == messages.VerdictMismatch && strings.Contains(c.Reason, other.String()) && !rot.has(ids[1])
	})

	// A delete frees the first's addresses; a create right after gets
	// another address.
	freed := planned[ids[0]].IP
	e.waitDone(3*time.Minute, e.command(messages.OpDelete, ids[0]))
	c := e.createReal("egress-c")
	e.waitDone(8*time.Minute, c)
	if ev := e.lastEvent("egress-c"); ev.IP == freed || ev.IP == planned[ids[1]].IP || ev.Source != messages.SourcePlan {
		t.Errorf("a create right after the delete: %+v; want another address of the plan than %s and %s", ev, freed, planned[ids[1]].IP)
	}
}

// addDNSHost makes names resolve to ip in network's DNS (libvirt's
// dnsmasq, the one a guest with a plan is told) until the test ends; an
// entry a killed run left is replaced.
func addDNSHost(t *testing.T, network, ip string, names ...string) {
	t.Helper()
	host := "<host ip='" + ip + "'>"
	for _, n := range names {
		host += "<hostname>" + n + "</hostname>"
	}
	host += "</host>"
	drop := func() {
		_ = exec.Command("virsh", "-c", "qemu:///system", "net-update", network, "delete", "dns-host", host, "--live").Run()
	}
	drop()
	virsh(t, "net-update", network, "add", "dns-host", host, "--live")
	t.Cleanup(drop)
}

// containsAddr says whether virsh domifaddr's output lists ip.
func containsAddr(out, ip string) bool {
	for _, l := range leases(out) {
		if l == ip {
			return true
		}
	}
	return false
}

// leases are the addresses virsh domifaddr's output lists.
func leases(out string) []string {
	var as []string
	for _, f := range strings.Fields(out) {
		if pr, err := netip.ParsePrefix(f); err == nil && !pr.Addr().IsLinkLocalUnicast() {
			as = append(as, pr.Addr().String())
		}
	}
	return as
}
