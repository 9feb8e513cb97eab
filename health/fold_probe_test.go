package health

import (
	"reflect"
	"testing"
	"time"

	"proxyfleet/messages"
)

// probeFold is a fold with probing: rise 2, fall 3, the given grace, and a
// clock the test moves.
type probeFold struct {
	t   *testing.T
	f   *Fold
	now time.Time
}

func newProbeFold(t *testing.T, grace time.Duration) *probeFold {
	pf := &probeFold{t: t, now: t0}
	pf.f = &Fold{Grace: grace, Rise: 2, Fall: 3, Now: func() time.Time { return pf.now }}
	return pf
}

func (pf *probeFold) at(d time.Duration) *probeFold { pf.now = t0.Add(d); return pf }

func (pf *probeFold) apply(e messages.StateEvent, changed bool) {
	pf.t.Helper()
	if e.At.IsZero() {
		e.At = pf.now
	}
	if got := pf.f.Apply(e); got != changed {
		pf.t.Fatalf("Apply(%s seq %d %s %s) changed = %v, want %v", e.ID, e.Seq, e.State, e.IP, got, changed)
	}
}

// target returns id's probe target, failing if it is not probed.
func (pf *probeFold) target(id string) Target {
	pf.t.Helper()
	for _, t := range pf.f.Targets() {
		if t.ID == id {
			return t
		}
	}
	pf.t.Fatalf("%s is not probed; targets %+v", id, pf.f.Targets())
	return Target{}
}

func (pf *probeFold) probed(id string) bool {
	for _, t := range pf.f.Targets() {
		if t.ID == id {
			return true
		}
	}
	return false
}

// probe applies results for id's current target, each a second after the
// one before, and checks whether the last one changed the rotation.
func (pf *probeFold) probe(id string, changed bool, oks ...bool) {
	pf.t.Helper()
	for i, ok := range oks {
		tg := pf.target(id)
		pf.now = pf.now.Add(time.Second)
		got := pf.f.ApplyProbe(ProbeResult{ID: id, Epoch: tg.Epoch, OK: ok, At: pf.now})
		if i == len(oks)-1 && got != changed {
			pf.t.Fatalf("probe %s ok=%v: changed = %v, want %v", id, ok, got, changed)
		}
		if i < len(oks)-1 && got {
			pf.t.Fatalf("probe %d of %s ok=%v changed the rotation early", i, id, ok)
		}
	}
}

func (pf *probeFold) want(addrs map[string]string) {
	pf.t.Helper()
	got := map[string]string{}
	for _, e := range pf.f.Snapshot() {
		got[e.ID] = e.Addr
	}
	if !reflect.DeepEqual(got, addrs) {
		pf.t.Fatalf("rotation = %v, want %v", got, addrs)
	}
}

const (
	prov    = messages.StateProvisioning
	running = messages.StateRunning
	failed  = messages.StateFailed
	delng   = messages.StateDeleting
	deleted = messages.StateDeleted
	a1      = "198.18.100.1:3128"
	a2      = "198.18.100.2:3128"
)

func TestProbeRise(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 1, prov, ""), false)
	if pf.probed("p1") {
		t.Fatal("a provisioning proxy is probed")
	}
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false) // running alone does not enter
	pf.want(map[string]string{})
	if tg := pf.target("p1"); tg.Addr != a1 {
		t.Fatalf("target %+v", tg)
	}
	pf.probe("p1", false, true)
	pf.probe("p1", false, false) // a failure restarts the count
	pf.probe("p1", false, true)
	pf.probe("p1", true, true) // two in a row
	pf.want(map[string]string{"p1": a1})
	if e := pf.f.Snapshot()[0]; !e.Since.Equal(pf.now) {
		t.Fatalf("since = %v, want the time of the rising probe %v", e.Since, pf.now)
	}
	if st := pf.f.Stats(); st.Entries != 1 || st.Exits != 0 || st.Probes != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestProbeFallThenRiseAgain(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.probe("p1", true, true, true)
	pf.probe("p1", false, false, false, true) // two failures, then a pass: still in
	pf.probe("p1", false, false, false)
	pf.want(map[string]string{"p1": a1})
	pf.probe("p1", true, false) // the third in a row
	pf.want(map[string]string{})
	// Still running: still probed, and back after rise passes.
	pf.probe("p1", true, true, true)
	pf.want(map[string]string{"p1": a1})
	if st := pf.f.Stats(); st.Entries != 2 || st.Exits != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestProbeOneProxysFailuresNeverMoveAnother(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	pf.probe("p1", true, true, true)
	pf.probe("p2", true, true, true)
	pf.probe("p1", true, false, false, false) // p1 times out three times
	pf.want(map[string]string{"p2": a2})
}

func TestProbeGraceKeepsProbingAtTheLastAddress(t *testing.T) {
	pf := newProbeFold(t, 30*time.Second)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.probe("p1", true, true, true)
	pf.at(10*time.Second).apply(ev("p1", 3, prov, ""), false)
	if !pf.f.InGrace("p1") || pf.target("p1").Addr != a1 {
		t.Fatalf("in grace %v, targets %+v", pf.f.InGrace("p1"), pf.f.Targets())
	}
	pf.probe("p1", false, true, true, false, false) // probed meanwhile; passes do not end the grace
	pf.want(map[string]string{"p1": a1})
	// Running again at the same address within the grace: stays, since kept.
	since := pf.f.Snapshot()[0].Since
	pf.at(20*time.Second).apply(ev("p1", 4, running, "198.18.100.1"), false)
	if pf.f.InGrace("p1") || !pf.f.Snapshot()[0].Since.Equal(since) {
		t.Fatalf("after running again: in grace %v, entry %+v", pf.f.InGrace("p1"), pf.f.Snapshot())
	}

	// Provisioning again; the grace runs out: demoted and no longer probed.
	pf.at(30*time.Second).apply(ev("p1", 5, prov, ""), false)
	if pf.f.Tick(t0.Add(59 * time.Second)) {
		t.Fatal("demoted before the grace ended")
	}
	if !pf.f.Tick(t0.Add(60 * time.Second)) {
		t.Fatal("not demoted when the grace ended")
	}
	pf.want(map[string]string{})
	if pf.probed("p1") {
		t.Fatal("probed after its grace ended without a running event")
	}
	// Running again: probed from scratch, rises again.
	pf.at(70*time.Second).apply(ev("p1", 6, running, "198.18.100.1"), false)
	pf.probe("p1", true, true, true)
	pf.want(map[string]string{"p1": a1})
}

func TestProbeFallDuringGrace(t *testing.T) {
	pf := newProbeFold(t, time.Minute)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.probe("p1", true, true, true)
	pf.apply(ev("p1", 3, prov, ""), false)
	pf.probe("p1", true, false, false, false)
	pf.want(map[string]string{})
	if pf.probed("p1") {
		t.Fatal("a proxy that fell on grace is still probed")
	}
	if _, ok := pf.f.NextDeadline(); ok {
		t.Fatal("a grace deadline is left for a proxy that fell")
	}
}

func TestProbeResultAfterDeleteIsIgnored(t *testing.T) {
	for _, state := range []string{failed, delng, deleted} {
		t.Run(state, func(t *testing.T) {
			pf := newProbeFold(t, 0)
			pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
			pf.probe("p1", true, true, true)
			inflight := pf.target("p1") // a probe starts...
			pf.apply(ev("p1", 3, state, ""), true)
			// ...and ends after the delete: ignored, whatever it says.
			if pf.f.ApplyProbe(ProbeResult{ID: "p1", Epoch: inflight.Epoch, OK: true, At: pf.now}) {
				t.Fatal("a late probe result changed the rotation")
			}
			pf.want(map[string]string{})
			if pf.probed("p1") || pf.f.Stats().ProbesIgnored != 1 {
				t.Fatalf("probed %v, stats %+v", pf.probed("p1"), pf.f.Stats())
			}
			// Created again at the same address: the old probe still
			// does not count; new ones do, from zero.
			pf.apply(ev("p1", 9, running, "198.18.100.1"), false)
			pf.f.ApplyProbe(ProbeResult{ID: "p1", Epoch: inflight.Epoch, OK: true, At: pf.now.Add(time.Second)})
			pf.probe("p1", false, true)
			pf.want(map[string]string{})
			pf.probe("p1", true, true)
			pf.want(map[string]string{"p1": a1})
		})
	}
}

func TestProbeAddressChangeStartsAgain(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.probe("p1", true, true, true)
	old := pf.target("p1")
	pf.apply(ev("p1", 3, running, "198.18.100.2"), true) // out: a new address is a new proxy
	pf.want(map[string]string{})
	if pf.f.ApplyProbe(ProbeResult{ID: "p1", Epoch: old.Epoch, OK: true, At: pf.now.Add(time.Second)}) {
		t.Fatal("a probe of the old address counted")
	}
	if tg := pf.target("p1"); tg.Addr != a2 || tg.Epoch == old.Epoch {
		t.Fatalf("target %+v after the move (old %+v)", tg, old)
	}
	pf.probe("p1", true, true, true)
	pf.want(map[string]string{"p1": a2})
}

func TestProbeOlderResultIgnored(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	tg := pf.target("p1")
	pf.f.ApplyProbe(ProbeResult{ID: "p1", Epoch: tg.Epoch, OK: true, At: t0.Add(10 * time.Second)})
	// A result of a probe started earlier, arriving later, is ignored.
	if pf.f.ApplyProbe(ProbeResult{ID: "p1", Epoch: tg.Epoch, OK: true, At: t0.Add(5 * time.Second)}) {
		t.Fatal("an older probe result made p1 rise")
	}
	pf.want(map[string]string{})
	if pf.f.Stats().ProbesIgnored != 1 {
		t.Fatalf("stats %+v", pf.f.Stats())
	}
	if pf.f.ApplyProbe(ProbeResult{ID: "nobody", Epoch: 1, OK: true, At: t0}) {
		t.Fatal("a result for an unknown proxy changed something")
	}
}

func TestProbeDuplicateAndOutOfOrderEvents(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 5, running, "198.18.100.1"), false)
	pf.probe("p1", false, true)
	// A duplicate running (a sweep's republish, or a redelivery) does not
	// restart the count; an older failed is ignored.
	pf.apply(ev("p1", 5, running, "198.18.100.1"), false)
	pf.apply(ev("p1", 6, running, "198.18.100.1"), false)
	pf.apply(ev("p1", 4, failed, ""), false)
	pf.probe("p1", true, true)
	pf.want(map[string]string{"p1": a1})
	pf.apply(ev("p1", 3, deleted, ""), false)
	pf.want(map[string]string{"p1": a1})
	if st := pf.f.Stats(); st.Ignored != 3 {
		t.Fatalf("ignored %d, want 3", st.Ignored)
	}
}

func TestSeedCountsAsRisen(t *testing.T) {
	pf := newProbeFold(t, 30*time.Second)
	for id, addr := range map[string]string{"p1": a1, "p2": a2, "p3": "198.18.100.3:3128", "p4": "198.18.100.4:3128", "p5": "198.18.100.5:3128", "gone": "198.18.100.9:3128"} {
		if !pf.f.Seed(id, addr, pf.now) {
			t.Fatalf("Seed(%s)", id)
		}
	}
	if pf.f.Seed("p1", a1, pf.now) {
		t.Fatal("seeded twice")
	}
	if pf.f.Len() != 6 || len(pf.f.Targets()) != 6 {
		t.Fatalf("after seeding: %d in, %d probed", pf.f.Len(), len(pf.f.Targets()))
	}
	before := pf.now.Add(-time.Hour)
	pf.apply(at(ev("p1", 7, running, "198.18.100.1"), -time.Hour), false) // confirmed, dated by its event
	pf.apply(ev("p2", 7, running, "198.18.100.22"), true)                 // elsewhere now: out, must rise
	pf.apply(ev("p3", 7, prov, ""), false)                                // on grace at its seeded address
	pf.apply(ev("p4", 7, deleted, ""), true)
	pf.apply(ev("p5", 7, running, "198.18.100.5"), false)
	if !pf.f.DropUnseen() {
		t.Fatal("DropUnseen changed nothing")
	}
	pf.want(map[string]string{"p1": a1, "p3": "198.18.100.3:3128", "p5": "198.18.100.5:3128"})
	if e := pf.f.Snapshot()[0]; !e.Since.Equal(before) {
		t.Fatalf("p1 since %v, want its running event's time %v", e.Since, before)
	}
	if !pf.f.InGrace("p3") || pf.target("p3").Addr != "198.18.100.3:3128" {
		t.Fatal("p3 is not on grace at its seeded address")
	}
	// Probes then decide: fall failures take a seeded proxy out.
	pf.probe("p5", true, false, false, false)
	pf.want(map[string]string{"p1": a1, "p3": "198.18.100.3:3128"})
	if pf.f.DropUnseen() {
		t.Fatal("DropUnseen changed something the second time")
	}
}

func TestAdoptOnTakeover(t *testing.T) {
	pf := newProbeFold(t, 0)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	pf.apply(ev("p3", 2, prov, ""), false)
	pf.probe("p1", false, true) // one pass short of rising here
	if !pf.f.Adopt("p1", a1, pf.now) {
		t.Fatal("p1 not adopted")
	}
	if pf.f.Adopt("p1", a1, pf.now) || pf.f.Adopt("p2", "198.18.100.99:3128", pf.now) || pf.f.Adopt("p3", "198.18.100.3:3128", pf.now) || pf.f.Adopt("px", a1, pf.now) {
		t.Fatal("adopted what it should not: in already, another address, not running, unknown")
	}
	pf.want(map[string]string{"p1": a1})
	pf.probe("p1", true, false, false, false)
	pf.want(map[string]string{})
}

// Without probing (Rise 0), a running event enters at once: the fold of
// the first cut, which TestFold covers; probe results change nothing then
// unless Fall is set.
func TestNoProbingEntersOnRunning(t *testing.T) {
	f := NewFold(0, func() time.Time { return t0 })
	if !f.Apply(at(ev("p1", 1, running, "198.18.100.1"), 0)) {
		t.Fatal("running did not enter without probing")
	}
	tg := f.Targets()[0]
	if f.ApplyProbe(ProbeResult{ID: "p1", Epoch: tg.Epoch, OK: false, At: t0}) {
		t.Fatal("a failure took a proxy out with Fall 0")
	}
}

// Rising names the candidates to probe again at once: running, not yet in
// the rotation, and no failure since the last pass. A failure leaves the
// proxy to the rounds until it passes again; so does a grace, and Rise 0.
func TestRising(t *testing.T) {
	pf := newProbeFold(t, time.Minute)
	rising := func(want bool) {
		t.Helper()
		tg, ok := pf.f.Rising("p1")
		if ok != want || (ok && tg != pf.target("p1")) {
			t.Fatalf("Rising = %+v, %v; want %v", tg, ok, want)
		}
	}
	rising(false) // unknown
	pf.apply(ev("p1", 1, prov, ""), false)
	rising(false)
	pf.apply(ev("p1", 2, running, "198.18.100.1"), false)
	rising(true)
	pf.probe("p1", false, true)
	rising(true) // one pass of two
	pf.probe("p1", false, false)
	rising(false) // failed: the rounds decide
	pf.probe("p1", false, true)
	rising(true) // passing again
	pf.probe("p1", true, true)
	rising(false) // in the rotation
	pf.apply(ev("p1", 3, prov, ""), false)
	rising(false) // on grace
	if _, ok := (&Fold{}).Rising("p1"); ok {
		t.Fatal("rising without probing (Rise 0)")
	}
}
