package health_test

import (
	"strings"
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// egressConfig probes through the proxies to health's own /probe on
// 127.0.0.1, without credentials.
func egressConfig(t *testing.T) health.Config {
	return health.Config{ProbeListen: "127.0.0.1:0", Interval: 150 * time.Millisecond, Timeout: 120 * time.Millisecond,
		Rise: 2, Fall: 3, LeaseTTL: time.Second, Logger: testLogger(t)}
}

func inRotation(h *health.Health, id string) bool {
	rot, _ := h.Rotation()
	for _, e := range rot.Proxies {
		if e.ID == id {
			return true
		}
	}
	return false
}

// A proxy whose plan gave it addresses is probed naming each of them in
// turn (messages.HeaderEgress): over rounds every one is named, its
// requests leave from each, and it is in the rotation, checked ok.
func TestProbesNameEachEgressAddress(t *testing.T) {
	r := newRig(t)
	p := startEgressProxy(t, "127.0.0.2", "127.0.0.3", "127.0.0.4")
	h := r.start(egressConfig(t))
	r.publish(p.running("p1", 1))
	waitFor(t, "every address named, p1 in the rotation and checked ok", func() bool {
		for _, a := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			if p.namedCount(a) == 0 {
				return false
			}
		}
		return inRotation(h, "p1") && r.verdicts()["p1"] == messages.VerdictOK
	})
}

// A proxy whose request naming one of its addresses leaves from another
// (a NAT left in place for one address, or a rule binding another of its
// plan) is refused, egress mismatch, its reason naming both, and leaves
// the rotation; fixed, it comes back. Another proxy's probes go on.
func TestProbeRefusesAProxyLeavingFromAnotherAddressThanNamed(t *testing.T) {
	r := newRig(t)
	natted := startEgressProxy(t, "127.0.0.2", "127.0.0.3", "127.0.0.4")
	natted.leaveWrongly("127.0.0.3", "127.0.0.5")
	crossed := startEgressProxy(t, "127.0.0.6", "127.0.0.7", "127.0.0.8")
	crossed.leaveWrongly("127.0.0.8", "127.0.0.6")
	good := startEgressProxy(t, "127.0.0.9", "127.0.0.10")
	h := r.start(egressConfig(t))
	r.publish(natted.running("natted", 1), crossed.running("crossed", 1), good.running("good", 1))
	recs := r.waitVerdicts(map[string]string{"natted": messages.VerdictMismatch, "crossed": messages.VerdictMismatch, "good": messages.VerdictOK})
	for id, both := range map[string][]string{"natted": {"127.0.0.3", "127.0.0.5"}, "crossed": {"127.0.0.8", "127.0.0.6"}} {
		rec := recs[id]
		if !strings.HasPrefix(rec.Reason, health.ReasonMismatch+": ") || !strings.Contains(rec.Reason, both[0]) || !strings.Contains(rec.Reason, both[1]) {
			t.Errorf("%s: reason %q, want %s naming %s and %s", id, rec.Reason, health.ReasonMismatch, both[0], both[1])
		}
		t.Logf("%s: %s", id, rec.Reason)
	}
	waitFor(t, "good alone in the rotation", func() bool {
		return inRotation(h, "good") && !inRotation(h, "natted") && !inRotation(h, "crossed")
	})
	if m := h.Metrics(); m.EgressMismatches == 0 || m.ProbeFamilies["ipv4"] == 0 || m.Refused[messages.VerdictMismatch] != 2 {
		t.Errorf("metrics: %d mismatches, probes by family %v, refused %v", m.EgressMismatches, m.ProbeFamilies, m.Refused)
	}
	_, metrics := get(t, "http://"+h.Addr()+"/metrics")
	for _, line := range []string{"proxyfleet_health_egress_mismatches_total ", `proxyfleet_probes_by_family_total{family="ipv4"} `,
		`proxyfleet_probes_by_family_total{family="none"} 0`, `proxyfleet_health_egress_target{family="ipv4"} 1`} {
		if !containsLine(metrics, line) {
			t.Errorf("metrics lack %q", line)
		}
	}

	natted.leaveWrongly("127.0.0.3", "")
	crossed.leaveWrongly("127.0.0.8", "")
	r.waitVerdicts(map[string]string{"natted": messages.VerdictOK, "crossed": messages.VerdictOK, "good": messages.VerdictOK})
	waitFor(t, "every proxy back in the rotation", func() bool {
		return inRotation(h, "good") && inRotation(h, "natted") && inRotation(h, "crossed")
	})
}
