package health

import (
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
)

// checkFold is a probeFold whose proxies require credentials: rise 2, fall
// 3, open checks every minute.
func newCheckFold(t *testing.T) *probeFold {
	pf := newProbeFold(t, 0)
	pf.f.CheckOpen, pf.f.OpenInterval = true, time.Minute
	return pf
}

// result applies one probe result for id's current target, a second after
// the last, and returns whether the rotation changed.
func (pf *probeFold) result(id string, r ProbeResult) bool {
	pf.t.Helper()
	tg := pf.target(id)
	pf.now = pf.now.Add(time.Second)
	r.ID, r.Epoch, r.At = id, tg.Epoch, pf.now
	return pf.f.ApplyProbe(r)
}

func (pf *probeFold) needsOpen(id string) bool {
	pf.t.Helper()
	return pf.target(id).CheckOpen
}

func (pf *probeFold) record(id string) messages.CheckRecord {
	pf.t.Helper()
	r, ok := pf.f.Check(id)
	if !ok {
		pf.t.Fatalf("%s has no check record; records %+v", id, pf.f.Checks())
	}
	return r
}

var (
	pass         = ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true}
	passRefused  = ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true, Open: OpenRefused}
	passOpen     = ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true, Open: OpenAnswered}
	passUnknown  = ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true, Open: OpenInconclusive}
	passLeaky    = ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true, Leak: "leaky: X-Forwarded-For carries the client's address", Open: OpenRefused}
	passNoReport = ProbeResult{OK: true, Open: OpenRefused}
	fail         = ProbeResult{OK: false}
)

// A candidate enters only once an open check was conclusive and found it
// refusing: passes with an inconclusive check (or none) admit nothing,
// and every probe of a candidate not in the rotation checks.
func TestFoldOpenCheckGatesAdmission(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	if !pf.needsOpen("p1") {
		t.Fatal("a new candidate's probe does not check for an open proxy")
	}
	for _, r := range []ProbeResult{passUnknown, passUnknown, pass} {
		if pf.result("p1", r) {
			t.Fatal("entered without a conclusive open check")
		}
	}
	pf.want(map[string]string{})
	if _, ok := pf.f.Check("p1"); ok {
		t.Fatalf("a record before any conclusive check: %+v", pf.f.Checks())
	}
	if _, ok := pf.f.Rising("p1"); ok {
		t.Fatal("a candidate that passed rise probes but waits for an open check is probed in a loop")
	}
	if !pf.result("p1", passRefused) {
		t.Fatal("did not enter on a conclusive clean check")
	}
	pf.want(map[string]string{"p1": a1})
	if e := pf.f.Snapshot()[0]; e.Egress != "203.0.113.7" {
		t.Fatalf("entry %+v, want the egress", e)
	}
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK || r.Addr != a1 || r.Egress != "203.0.113.7" || r.Reason != "" || !r.At.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("record %+v", r)
	}
}

// In the rotation, the open check is due again after OpenInterval (and
// after an inconclusive one, at every probe until one is conclusive); an
// inconclusive check takes nobody out.
func TestFoldOpenCheckInterval(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.result("p1", passRefused)
	pf.result("p1", pass)
	pf.want(map[string]string{"p1": a1})
	checked := pf.now.Add(-time.Second) // the refused check's time
	for pf.now.Before(checked.Add(time.Minute - time.Second)) {
		if pf.needsOpen("p1") {
			t.Fatalf("open check due %v after the last one", pf.now.Sub(checked))
		}
		pf.result("p1", pass)
	}
	pf.now = checked.Add(time.Minute)
	if !pf.needsOpen("p1") {
		t.Fatal("open check not due after OpenInterval")
	}
	if pf.result("p1", passUnknown) {
		t.Fatal("an inconclusive check changed the rotation")
	}
	pf.want(map[string]string{"p1": a1})
	if !pf.needsOpen("p1") {
		t.Fatal("after an inconclusive check, the next probe does not check again")
	}
	pf.result("p1", passRefused)
	if pf.needsOpen("p1") {
		t.Fatal("open check still due after a conclusive one")
	}
}

// A proxy found open leaves at once, is never probed in a loop, stays out
// while it answers, and comes back once a conclusive check finds it
// refusing again.
func TestFoldOpenProxyLeavesAndComesBack(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	pf.result("p1", passRefused)
	pf.result("p1", pass)
	pf.result("p2", passRefused)
	pf.result("p2", pass)
	pf.want(map[string]string{"p1": a1, "p2": a2})
	gen := pf.f.ChecksGen()
	pf.now = pf.now.Add(time.Minute)
	if !pf.result("p1", passOpen) {
		t.Fatal("an open proxy did not leave at once")
	}
	pf.want(map[string]string{"p2": a2})
	if r := pf.record("p1"); r.Verdict != messages.VerdictOpen || r.Reason != ReasonOpen || pf.f.ChecksGen() == gen {
		t.Fatalf("record %+v, gen %d (was %d)", r, pf.f.ChecksGen(), gen)
	}
	if _, ok := pf.f.Rising("p1"); ok {
		t.Fatal("a refused proxy is rising")
	}
	if !pf.needsOpen("p1") || !pf.probed("p1") {
		t.Fatal("a refused proxy is not probed with an open check")
	}
	for range 5 {
		if pf.result("p1", passOpen) || pf.result("p1", passUnknown) {
			t.Fatal("an open proxy entered")
		}
	}
	if st := pf.f.Stats(); st.RefusedOpen != 1 {
		t.Fatalf("refusals %d, want 1 (counted once per refusal)", st.RefusedOpen)
	}
	if open, leaky, _ := pf.f.Refused(); open != 1 || leaky != 0 {
		t.Fatalf("refused %d open, %d leaky", open, leaky)
	}
	// Fixed: the next conclusive check brings it back (it kept passing).
	if !pf.result("p1", passRefused) {
		t.Fatal("a fixed proxy did not come back")
	}
	pf.want(map[string]string{"p1": a1, "p2": a2})
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK || r.Reason != "" {
		t.Fatalf("record %+v after the fix", r)
	}
}

// A leak (the client's address or the credentials in a header) refuses
// the proxy until a probe whose request the target reported shows none; a
// probe whose target reported nothing changes nothing either way.
func TestFoldLeakyProxy(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.result("p1", passLeaky)
	pf.result("p1", passLeaky)
	pf.result("p1", passNoReport)
	pf.want(map[string]string{})
	if r := pf.record("p1"); r.Verdict != messages.VerdictLeaky || r.Reason != passLeaky.Leak || r.Egress != "203.0.113.7" {
		t.Fatalf("record %+v", r)
	}
	if !pf.result("p1", passRefused) {
		t.Fatal("not in after a clean report")
	}
	pf.want(map[string]string{"p1": a1})
	if !pf.result("p1", passLeaky) {
		t.Fatal("a proxy found leaky in the rotation did not leave at once")
	}
	if st := pf.f.Stats(); st.RefusedLeaky != 2 {
		t.Fatalf("refusals %d, want 2", st.RefusedLeaky)
	}
	// Open and leaky at once: open, both reasons named.
	pf.result("p1", ProbeResult{OK: true, Reported: true, Leak: "leaky: Via carries the client's address", Open: OpenAnswered})
	if r := pf.record("p1"); r.Verdict != messages.VerdictOpen || r.Reason != ReasonOpen+"; leaky: Via carries the client's address" {
		t.Fatalf("record %+v", r)
	}
}

// Without credentials (CheckOpen false) there is no open check: a report
// is enough for a record, and a probe passing rise times admits.
func TestFoldWithoutCredentials(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	if pf.needsOpen("p1") {
		t.Fatal("an open check without credentials")
	}
	pf.result("p1", pass)
	if !pf.result("p1", pass) {
		t.Fatal("did not enter")
	}
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK || r.Egress != "203.0.113.7" {
		t.Fatalf("record %+v", r)
	}
	// A prober that finds nothing (a TCP connect, a fake) makes no record.
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	pf.probe("p2", true, true, true)
	if _, ok := pf.f.Check("p2"); ok || len(pf.f.Checks()) != 1 {
		t.Fatalf("records %+v, want only p1's", pf.f.Checks())
	}
}

// A record changes (and ChecksGen moves) only when its address, egress,
// verdict or reason does: not on every probe. It goes when the proxy stops
// being a candidate, and a new address starts from nothing.
func TestFoldChecksChangeOnlyWithTheirContent(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.result("p1", passRefused)
	pf.result("p1", pass)
	gen := pf.f.ChecksGen()
	at := pf.record("p1").At
	for range 10 {
		pf.result("p1", pass)
		pf.result("p1", fail)
	}
	pf.result("p1", passRefused)
	if pf.f.ChecksGen() != gen || !pf.record("p1").At.Equal(at) {
		t.Fatalf("probes that found the same moved the records: gen %d, was %d", pf.f.ChecksGen(), gen)
	}
	// A new egress is a change, of the record and of the rotation entry.
	if !pf.result("p1", ProbeResult{OK: true, Egress: "203.0.113.8", Reported: true}) {
		t.Fatal("a new egress of a proxy in the rotation is no change of the rotation")
	}
	if pf.f.ChecksGen() == gen || pf.record("p1").Egress != "203.0.113.8" || pf.f.Snapshot()[0].Egress != "203.0.113.8" {
		t.Fatalf("egress not followed: %+v %+v", pf.record("p1"), pf.f.Snapshot())
	}
	// A new address: the record of the old one goes, nothing is known of
	// the new one until it is checked.
	gen = pf.f.ChecksGen()
	pf.apply(ev("p1", 3, running, "198.18.100.2"), true)
	if _, ok := pf.f.Check("p1"); ok || pf.f.ChecksGen() == gen {
		t.Fatalf("record after an address change: %+v", pf.f.Checks())
	}
	pf.result("p1", passRefused)
	if r := pf.record("p1"); r.Addr != a2 {
		t.Fatalf("record %+v, want the new address", r)
	}
	for _, state := range []string{failed, delng, deleted} {
		pf := newCheckFold(t)
		pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
		pf.result("p1", passOpen)
		gen := pf.f.ChecksGen()
		pf.apply(ev("p1", 3, state, ""), false)
		if len(pf.f.Checks()) != 0 || pf.f.ChecksGen() == gen {
			t.Fatalf("%s: records %+v", state, pf.f.Checks())
		}
		if open, _, _ := pf.f.Refused(); open != 0 {
			t.Fatalf("%s: still counted refused", state)
		}
	}
}

// A candidate of the sim driver enters on its running event, also with
// probing and credentials, and is never probed (its address is made up).
func TestFoldSimProxyEntersOnItsEvent(t *testing.T) {
	pf := newCheckFold(t)
	e := ev("s1", 2, running, "198.18.100.1")
	e.Source = messages.SourceSim
	pf.apply(e, true)
	pf.want(map[string]string{"s1": a1})
	if pf.probed("s1") || pf.f.TargetsLen() != 0 {
		t.Fatalf("a sim proxy is probed: %+v", pf.f.Targets())
	}
	if _, ok := pf.f.Rising("s1"); ok {
		t.Fatal("a sim proxy is rising")
	}
	// Another source (a real VM) at the same address is probed as any.
	e = ev("p1", 2, running, "198.18.100.2")
	e.Source = messages.SourceLease
	pf.apply(e, false)
	if !pf.probed("p1") {
		t.Fatal("a lease-sourced proxy is not probed")
	}
}

// A takeover adopts no proxy this process found open or leaky.
func TestFoldAdoptSkipsRefused(t *testing.T) {
	pf := newCheckFold(t)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.result("p1", passOpen)
	if pf.f.Adopt("p1", a1, pf.now) {
		t.Fatal("adopted an open proxy")
	}
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	pf.result("p2", passRefused)
	if !pf.f.Adopt("p2", a2, pf.now) {
		t.Fatal("did not adopt a proxy one pass short of rising")
	}
}

// A proxy in the rotation on grace that is found open leaves, and is no
// longer probed until it reports running again.
func TestFoldOpenOnGrace(t *testing.T) {
	pf := newCheckFold(t)
	pf.f.Grace = time.Hour
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.result("p1", passRefused)
	pf.result("p1", pass)
	pf.apply(ev("p1", 3, prov, ""), false)
	if !pf.f.InGrace("p1") {
		t.Fatal("not on grace")
	}
	pf.now = pf.now.Add(time.Minute)
	if !pf.result("p1", passOpen) {
		t.Fatal("an open proxy on grace did not leave")
	}
	if pf.probed("p1") {
		t.Fatal("probed after leaving on grace")
	}
}

// A proxy whose plan gave it addresses must leave from one of them: one
// whose requests reach the target from another address (a NAT left in
// place) is refused (egress mismatch), never enters, and comes back once
// its requests leave from a planned address; a proxy without a plan may
// leave from any address.
func TestFoldRefusesEgressMismatch(t *testing.T) {
	pf := newCheckFold(t)
	e := ev("p1", 2, running, "198.18.101.5")
	e.Egress = []string{"198.18.101.5", "2001:db8:101::10/124"}
	pf.apply(e, false)
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	natted := ProbeResult{OK: true, Egress: "203.0.113.7", Reported: true, Open: OpenRefused}
	for range 3 {
		if pf.result("p1", natted) {
			t.Fatal("a proxy leaving from an address not of its plan entered")
		}
		pf.result("p2", natted)
	}
	pf.want(map[string]string{"p2": a2})
	r := pf.record("p1")
	if r.Verdict != messages.VerdictMismatch || !strings.HasPrefix(r.Reason, ReasonMismatch+": ") || !strings.Contains(r.Reason, "203.0.113.7") {
		t.Fatalf("record %+v", r)
	}
	if _, _, mismatch := pf.f.Refused(); mismatch != 1 || pf.f.Stats().RefusedMismatch != 1 {
		t.Fatalf("refused mismatch %d, refusals %d", mismatch, pf.f.Stats().RefusedMismatch)
	}
	// Its requests leave from one of its IPv6 addresses now: admitted.
	planned := ProbeResult{OK: true, Egress: "2001:db8:101::1a", Reported: true, Open: OpenRefused}
	pf.result("p1", planned)
	pf.result("p1", planned)
	pf.want(map[string]string{"p1": "198.18.101.5:3128", "p2": a2})
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK {
		t.Fatalf("record after a planned egress %+v", r)
	}
}
