package health_test

import (
	"encoding/json"
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/messages"
)

func (r *rig) report(id, addr, reason string) {
	r.t.Helper()
	body, err := json.Marshal(messages.Report{V: 1, ID: id, Addr: addr, Reason: reason, By: "test", At: time.Now().UTC()})
	if err != nil {
		r.t.Fatal(err)
	}
	r.reportRaw(subj.Report(id), body)
}

func (r *rig) reportRaw(subject string, body []byte) {
	r.t.Helper()
	if err := r.nc.Publish(subject, body); err != nil {
		r.t.Fatal(err)
	}
	if err := r.nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
}

func reportsSeen(h *health.Health) uint64 {
	var n uint64
	for _, v := range h.Metrics().Reports {
		n += v
	}
	return n
}

// A report makes health probe the proxy at once (rounds are an hour
// apart here), and only its own probe counts: a healthy proxy reported 200
// times stays in the rotation, and the reports after the first within the
// per-proxy interval ask for nothing.
func TestReportProbesAtOnceAndNeverRemovesAHealthyProxy(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	h := r.start(health.Config{Prober: p, Interval: time.Hour, Timeout: time.Second, Rise: 2, Fall: 3, LeaseTTL: time.Second})
	waitFor(t, "the lease", h.Holder)
	const addr = "198.18.100.1:3128"
	r.publish(leaseEvent("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitSnapshot(map[string]string{"p1": addr})
	before := p.count(addr)

	r.report("p1", addr, "connect: connection refused")
	waitFor(t, "the reported proxy probed", func() bool { return p.count(addr) == before+1 })
	if n := h.Metrics().Reports[health.ReportProbed]; n != 1 {
		t.Fatalf("reports probed = %d, want 1", n)
	}
	for range 200 {
		r.report("p1", addr, "connect: connection refused")
	}
	waitFor(t, "201 reports counted", func() bool { return reportsSeen(h) == 201 })
	m := h.Metrics()
	if m.Reports[health.ReportProbed] != 1 || m.Reports[health.ReportLimited] != 200 {
		t.Fatalf("reports by outcome %v, want 1 probed and 200 limited (one probe per proxy per interval)", m.Reports)
	}
	if n := p.count(addr); n != before+1 {
		t.Fatalf("the proxy was probed %d times for 201 reports, want 1", n-before)
	}
	if got := addrs(getRotation(t, h).Proxies); got["p1"] != addr {
		t.Fatalf("a healthy proxy reported 201 times left the rotation: %v, want p1 at %s", got, addr)
	}
}

// A reported proxy whose probe fails is probed again at once until it has
// failed Fall times in a row and left: a dead proxy leaves within a few
// probe timeouts of the first report, not Fall rounds.
func TestReportOfADeadProxyTakesItOutWithoutWaitingForRounds(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	// One probe at a time: probes run in the order they are asked for.
	h := r.start(health.Config{Prober: p, Interval: time.Hour, Timeout: time.Second, Rise: 2, Fall: 3, LeaseTTL: time.Second,
		Concurrency: 1})
	waitFor(t, "the lease", h.Holder)
	const a1, a2 = "198.18.100.1:3128", "198.18.100.2:3128"
	r.publish(leaseEvent("p1", 1, messages.StateRunning, "198.18.100.1"), leaseEvent("p2", 1, messages.StateRunning, "198.18.100.2"))
	r.waitSnapshot(map[string]string{"p1": a1, "p2": a2})
	before := p.count(a1)
	p.set(a1, true)
	r.report("p1", a1, "CONNECT answered 502 Bad Gateway")
	r.waitSnapshot(map[string]string{"p2": a2})
	if n := p.count(a1) - before; n != 3 {
		t.Fatalf("the dead proxy was probed %d times after the report, want 3 (fall)", n)
	}
	// It is no longer followed: a failing proxy out of the rotation
	// waits for the rounds. Another probe of it, asked for when its last
	// one ended, would run before p2's, reported now.
	before2 := p.count(a2)
	r.report("p2", a2, "timeout")
	waitFor(t, "the reported p2 probed", func() bool { return p.count(a2) == before2+1 })
	if n := p.count(a1) - before; n != 3 {
		t.Fatalf("probed %d times, want still 3", n)
	}
}

// Reports of another address, of no proxy, or not understood ask for no
// probe; and over ReportRate, reports of many proxies are dropped.
func TestReportsThatAskForNothing(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	h := r.start(health.Config{Prober: p, Interval: time.Hour, Timeout: time.Second, Rise: 2, Fall: 3, LeaseTTL: time.Second,
		ReportRate: 1})
	waitFor(t, "the lease", h.Holder)
	want := map[string]string{}
	var evs []messages.StateEvent
	for i := range 5 {
		ip := "198.18.100." + string(rune('1'+i))
		id := "p" + string(rune('1'+i))
		evs = append(evs, leaseEvent(id, 1, messages.StateRunning, ip))
		want[id] = ip + ":3128"
	}
	r.publish(evs...)
	r.waitSnapshot(want)
	total := func() int {
		n := 0
		for _, a := range want {
			n += p.count(a)
		}
		return n
	}
	before := total()

	r.report("p1", "198.18.100.9:3128", "refused")                                       // stale
	r.report("nobody", "", "refused")                                                    // unknown
	r.reportRaw(subj.Report("p1"), []byte("{not json"))                                  // invalid
	r.reportRaw(subj.Report("p1"), []byte(`{"v":1,"id":"p2","reason":"wrong subject"}`)) // invalid
	waitFor(t, "4 reports counted", func() bool { return reportsSeen(h) == 4 })
	m := h.Metrics().Reports
	if m[health.ReportStale] != 1 || m[health.ReportUnknown] != 1 || m[health.ReportInvalid] != 2 || m[health.ReportProbed] != 0 {
		t.Fatalf("reports by outcome %v", m)
	}

	for id, a := range want {
		r.report(id, a, "refused")
	}
	waitFor(t, "9 reports counted", func() bool { return reportsSeen(h) == 9 })
	m = h.Metrics().Reports
	if m[health.ReportProbed] < 1 || m[health.ReportProbed] > 2 || m[health.ReportProbed]+m[health.ReportLimited] != 5 {
		t.Fatalf("5 proxies reported at once at a rate of 1/s: %v, want 1 or 2 probed and the rest limited", m)
	}
	waitFor(t, "the probes asked for", func() bool { return uint64(total()-before) == m[health.ReportProbed] })
}
