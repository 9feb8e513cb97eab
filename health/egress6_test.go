package health_test

import (
	"strings"
	"testing"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// With an IPv6 probe target (health's own /probe served on ::1 too), a
// proxy's IPv6 addresses are named like its IPv4 ones, each probe going
// to the target of the named address's family: a proxy leaving from
// each is in the rotation; one whose request naming an IPv6 address
// leaves from another is refused, egress mismatch.
func TestProbesNameIPv6AddressesToTheIPv6Target(t *testing.T) {
	r := newRig(t)
	good := startEgressProxy(t, "127.0.0.2", "::1")
	crossed := startEgressProxy(t, "127.0.0.3", "::1", "2001:db8::5")
	crossed.leaveWrongly("2001:db8::5", "::1")
	cfg := egressConfig(t)
	cfg.ProbeListenIPv6 = "[::1]:0"
	h := r.start(cfg)
	if a := h.ProbeAddrIPv6(); !strings.HasPrefix(a, "[::1]:") {
		t.Fatalf("IPv6 probe target on %q", a)
	}
	r.publish(good.running("good", 1), crossed.running("crossed", 1))
	recs := r.waitVerdicts(map[string]string{"good": messages.VerdictOK, "crossed": messages.VerdictMismatch})
	if rec := recs["crossed"]; !strings.Contains(rec.Reason, "2001:db8::5") || !strings.Contains(rec.Reason, "::1") {
		t.Errorf("crossed: reason %q, want one naming 2001:db8::5 and ::1", rec.Reason)
	}
	waitFor(t, "good's two addresses named, it alone in the rotation", func() bool {
		return good.namedCount("::1") > 0 && good.namedCount("127.0.0.2") > 0 && inRotation(h, "good") && !inRotation(h, "crossed")
	})
	m := h.Metrics()
	if m.ProbeFamilies["ipv6"] == 0 || m.ProbeFamilies["ipv4"] == 0 || !m.EgressTargets["ipv6"] {
		t.Errorf("probes by family %v, targets %v", m.ProbeFamilies, m.EgressTargets)
	}
}

// Without an IPv6 probe target (the default), no IPv6 address is named:
// the proxy's IPv4 address is, and the metrics say IPv6 has no target.
func TestWithoutAnIPv6TargetNoIPv6AddressIsNamed(t *testing.T) {
	r := newRig(t)
	p := startEgressProxy(t, "127.0.0.2", "::1")
	h := r.start(egressConfig(t))
	r.publish(p.running("p1", 1))
	waitFor(t, "p1 in the rotation, its IPv4 address named 3 times", func() bool {
		return inRotation(h, "p1") && p.namedCount("127.0.0.2") >= 3
	})
	if n := p.namedCount("::1"); n != 0 {
		t.Errorf("::1 named %d times without an IPv6 target", n)
	}
	_, metrics := get(t, "http://"+h.Addr()+"/metrics")
	for _, line := range []string{`proxyfleet_health_egress_target{family="ipv6"} 0`, `proxyfleet_probes_by_family_total{family="ipv6"} 0`} {
		if !containsLine(metrics, line) {
			t.Errorf("metrics lack %q", line)
		}
	}
}

// An IPv6 target is checked at start: one whose host is an IPv4
// address, a listen address that is not IPv6, or one beside an IPv4
// target that is an IPv6 address already.
func TestIPv6TargetIsChecked(t *testing.T) {
	r := newRig(t)
	for _, cfg := range []health.Config{
		{ProbeListen: "127.0.0.1:0", TargetIPv6: "http://127.0.0.1/probe"},
		{ProbeListen: "127.0.0.1:0", ProbeListenIPv6: "127.0.0.1:0"},
		{ProbeListen: "127.0.0.1:0", ProbeListenIPv6: "[::]:0"},
		{ProbeListen: "[::1]:0", ProbeListenIPv6: "[::1]:0"},
		{ProbeListenIPv6: "[::1]:0"},
	} {
		if _, err := health.New(r.js, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
