package health

import (
	"slices"
	"testing"
	"time"
)

// TestFoldTellsAdmissions: the fold tells how long each proxy waited from
// its running event to its admission, once per running event: at once
// without probing, after its rising probes with them; not for a proxy
// that comes back after falling, nor for one loaded from the bucket or
// adopted, and again for a new address.
func TestFoldTellsAdmissions(t *testing.T) {
	var waits []time.Duration
	told := func(want ...time.Duration) {
		t.Helper()
		if !slices.Equal(waits, want) {
			t.Fatalf("admissions told %v, want %v", waits, want)
		}
		waits = nil
	}

	// Without probing: the event's own time to the fold's clock.
	now := t0
	f := &Fold{Now: func() time.Time { return now }, Admitted: func(d time.Duration) { waits = append(waits, d) }}
	now = t0.Add(300 * time.Millisecond)
	f.Apply(at(ev("a", 1, running, "198.18.0.1"), 0))
	told(300 * time.Millisecond)
	f.Apply(at(ev("a", 2, running, "198.18.0.1"), time.Second)) // the same address again
	told()
	// An event from a clock ahead of the fold's is taken as now.
	f.Apply(at(ev("b", 1, running, "198.18.0.2"), time.Hour))
	told(0)
	f.Seed("c", "198.18.0.3:3128", now)
	f.Apply(at(ev("c", 1, running, "198.18.0.3"), 0)) // confirms the seeded proxy
	told()

	// With probing (rise 2, fall 3): from the running event to the
	// second passing probe.
	pf := newProbeFold(t, 0)
	pf.f.Admitted = func(d time.Duration) { waits = append(waits, d) }
	pf.apply(ev("p", 1, running, "198.18.0.4"), false)
	pf.probe("p", true, true, true)
	told(2 * time.Second)
	pf.probe("p", true, false, false, false) // falls
	pf.probe("p", true, true, true)          // and comes back: no new admission
	told()
	pf.apply(ev("p", 2, running, "198.18.0.5"), true) // a new address: out, a candidate again
	pf.probe("p", true, true, true)
	told(2 * time.Second)
	// Adopted by a standby taking over: not an admission of its event.
	pf.apply(ev("q", 1, running, "198.18.0.6"), false)
	if !pf.f.Adopt("q", "198.18.0.6:3128", pf.now) {
		t.Fatal("q not adopted")
	}
	pf.probe("q", true, false, false, false)
	pf.probe("q", true, true, true)
	told()
}
