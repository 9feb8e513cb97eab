package pool_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
)

// A pool of 20 over three sim hosts fills, spread over the hosts; members
// whose domains vanish or die are back or replaced; it grows and shrinks
// (the oldest first); deleted, it leaves nothing: no member that is
// desired, no domain, no record.
func TestPoolFillsHealsResizesAndGoes(t *testing.T) {
	r := newRig(t, "h1", "h2", "h3")
	r.controller("c1")
	o := r.set(messages.PoolSet{Name: "eu", Size: 20, Spec: messages.PoolSpec{Labels: map[string]string{"team": "a"}}}, true)
	if o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool set --wait: %+v", o)
	}
	st := r.waitReady("eu", 20, 30*time.Second)
	per := map[string]int{}
	for _, m := range st.Record.Members {
		per[m.Host]++
		if h := r.hostOf(m.ID); h != m.Host {
			t.Errorf("%s recorded on %s, its domain is on %q", m.ID, m.Host, h)
		}
	}
	if per["h1"] < 6 || per["h2"] < 6 || per["h3"] < 6 {
		t.Errorf("members per host %v, want them spread (6 or 7 each)", per)
	}
	for _, p := range r.rot.Proxies() {
		if p.Labels["pool"] != "eu" || p.Labels["team"] != "a" {
			t.Errorf("%s has labels %v, want pool=eu and the spec's", p.ID, p.Labels)
		}
	}

	// Five members' domains deleted out of band: the fleet makes them
	// again (the worker's re-drive) or the pool replaces them.
	first := slicesOf(st.Record.Members)
	for _, id := range first[:5] {
		if err := os.Remove(filepath.Join(r.dir, r.hostOf(id), "domains", id+".json")); err != nil {
			t.Fatal(err)
		}
	}
	// Three more die behind the system's back (shut off): their create's
	// state is failed, and the pool replaces them with new members.
	dead := first[5:8]
	for _, id := range dead {
		if err := r.drv[r.hostOf(id)].Stop(id); err != nil {
			t.Fatal(err)
		}
	}
	pollUntil(t, "the dead members replaced and the pool full again", 30*time.Second, func() bool {
		st, err := r.pool("eu")
		if err != nil || st.Record.State != messages.PoolReady || st.Summary.Ready != 20 || st.Summary.Live != 20 {
			return false
		}
		for _, id := range dead {
			if _, ok := st.Record.Member(id); ok {
				return false
			}
		}
		return len(r.inRotation("eu")) == 20 && len(r.domains()) == 20
	})
	for _, id := range dead {
		if h := r.hostOf(id); h != "" {
			t.Errorf("the dead %s still has a domain on %s", id, h)
		}
	}

	// Grow to 25, then shrink to 10: the oldest go first.
	r.set(messages.PoolSet{Name: "eu", Size: 25}, true)
	st = r.waitReady("eu", 25, 30*time.Second)
	byAge := liveOf(st.Record.Members)
	slices.SortStableFunc(byAge, func(a, b messages.PoolMember) int { return a.Created.Compare(b.Created) })
	youngest := slicesOf(byAge[15:])
	r.set(messages.PoolSet{Name: "eu", Size: 10}, true)
	st = r.waitReady("eu", 10, 30*time.Second)
	if got := slicesOf(liveOf(st.Record.Members)); !sameSet(got, youngest) {
		t.Errorf("after shrinking to 10 the members are %v, want the 10 youngest %v", got, youngest)
	}
	pollUntil(t, "the shrunk members' domains gone", 30*time.Second, func() bool { return len(r.domains()) == 10 })

	// Delete: every member goes, then the record.
	ctx := ctxFor(t, time.Minute)
	o, err := r.cl.PoolDelete(ctx, "eu", "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool delete --wait: %+v %v", o, err)
	}
	if _, err := r.pool("eu"); err == nil {
		t.Error("pool eu still has a record after its delete is done")
	}
	pollUntil(t, "no domain left", 30*time.Second, func() bool { return len(r.domains()) == 0 })
	for id, d := range r.desired() {
		if d.Op != messages.OpDelete {
			t.Errorf("%s is still desired: %+v", id, d)
		}
	}
	if len(r.inRotation("eu")) != 0 {
		t.Errorf("members in the rotation after the delete: %v", r.inRotation("eu"))
	}
}

func slicesOf(ms []messages.PoolMember) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func liveOf(ms []messages.PoolMember) []messages.PoolMember {
	var out []messages.PoolMember
	for _, m := range ms {
		if m.Retired == nil {
			out = append(out, m)
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

func pollUntil(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	if !pollWait(bound, cond) {
		t.Fatalf("timed out after %s waiting for %s", bound, what)
	}
}

// max_age of a few seconds recycles every member at least once, and the
// rotation never holds fewer than min_ready of the pool in any sample
// (every 100 ms) from the moment it was first full; then a recycle of
// every member on demand does the same.
func TestPoolRecyclesWithoutAGap(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.controller("c1")
	r.set(messages.PoolSet{Name: "eu", Size: 6, Surge: ptr(2)}, true)
	st := r.waitReady("eu", 6, 30*time.Second)
	full := time.Now()
	first := slicesOf(st.Record.Members)

	r.set(messages.PoolSet{Name: "eu", Size: 6, Surge: ptr(2), MaxAge: messages.Duration(2 * time.Second)}, false)
	pollUntil(t, "every first member recycled", 30*time.Second, func() bool {
		for _, id := range first {
			if r.hostOf(id) != "" || slices.Contains(r.inRotation("eu"), id) {
				return false
			}
		}
		return true
	})
	// A second generation too: the members made to replace the first.
	st, err := r.pool("eu")
	if err != nil {
		t.Fatal(err)
	}
	second := slicesOf(liveOf(st.Record.Members))
	pollUntil(t, "the second generation recycled", 30*time.Second, func() bool {
		for _, id := range second {
			if r.hostOf(id) != "" {
				return false
			}
		}
		return true
	})
	r.set(messages.PoolSet{Name: "eu", Size: 6, Surge: ptr(2)}, true)
	st = r.waitReady("eu", 6, 30*time.Second)

	// On demand: every member, at once, make-before-break.
	before := slicesOf(liveOf(st.Record.Members))
	ctx := ctxFor(t, time.Minute)
	o, err := r.cl.PoolRecycle(ctx, messages.PoolRecycle{Name: "eu", All: true}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("pool recycle --all --wait: %+v %v", o, err)
	}
	st = r.waitReady("eu", 6, 30*time.Second)
	for _, id := range before {
		if _, ok := st.Record.Member(id); ok || r.hostOf(id) != "" {
			t.Errorf("%s survived its recycle", id)
		}
	}
	least, at, n := r.sample.fewest("eu", full)
	t.Logf("%d samples since the pool was full, fewest members in the rotation %d (at %s); %d creates", n, least, at.Format("15:04:05.000"), len(r.creates()))
	if least < 6 {
		t.Errorf("the rotation held %d members of eu at %s, fewer than min_ready 6", least, at.Format("15:04:05.000"))
	}
	for id, n := range r.creates() {
		if n != 1 {
			t.Errorf("%s created %d times", id, n)
		}
	}
}

// A broken image (every create fails on every host) makes size+surge
// creates, then one per backoff; the pool is degraded, its set --wait
// fails naming why. The image fixed, the pool fills.
func TestPoolBrokenImageBacksOff(t *testing.T) {
	r := newRig(t, "h1", "h2")
	for _, h := range r.hosts {
		if err := sim.InjectFault(filepath.Join(r.dir, h), sim.Fault{Op: "create", Class: fleet.ClassPermanent, Count: -1}); err != nil {
			t.Fatal(err)
		}
	}
	r.controller("c1")
	o := r.set(messages.PoolSet{Name: "bad", Size: 3}, true)
	if o.Final == nil || o.Final.Outcome != messages.OutcomeFailed || !strings.Contains(o.Final.Reason, "degraded") {
		t.Fatalf("pool set --wait of a broken pool: %+v", o.Final)
	}
	st, err := r.pool("bad")
	if err != nil || st.Record.State != messages.PoolDegraded || !strings.Contains(st.Record.Reason, "injected fault") {
		t.Fatalf("pool: %+v %v", st.Record, err)
	}
	// size+surge (4) at once, then one at a time, each after a backoff
	// that doubles: 0.5s, 1s, 2s (the gaps are lower bounds, which a slow
	// machine only widens).
	pollUntil(t, "7 creates of the broken pool", 30*time.Second, func() bool {
		first, _ := r.createsOf("bad")
		return len(first) >= 7
	})
	first, twice := r.createsOf("bad")
	if len(twice) > 0 {
		t.Errorf("members created under two command ids: %v", twice)
	}
	if d := first[3].at.Sub(first[0].at); d > 2*time.Second {
		t.Logf("the first 4 creates took %s", d)
	}
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second} {
		if gap := first[4+i].at.Sub(first[3+i].at); gap < want*8/10 {
			t.Errorf("create %d came %s after the one before, want a backoff of %s", 5+i, gap, want)
		}
	}
	for _, h := range r.hosts {
		if err := sim.ClearFaults(filepath.Join(r.dir, h)); err != nil {
			t.Fatal(err)
		}
	}
	st = r.waitReady("bad", 3, 30*time.Second)
	if st.Record.Failures != 0 {
		t.Errorf("failures %d after the pool filled", st.Record.Failures)
	}
}

func ptr[T any](v T) *T { return &v }

// The active controller's connection dies mid-fill (no lease released, no
// goodbye): the standby takes over after the lease's TTL and finishes; no
// member is created under two command ids, nor twice on a host.
func TestPoolStandbyTakesOver(t *testing.T) {
	r := newRig(t, "h1", "h2", "h3")
	c1, nc1, _ := r.controller("c1")
	c2, nc2, _ := r.controller("c2")
	pollUntil(t, "one controller active", 10*time.Second, func() bool { return c1.Active() != c2.Active() })
	active, activeNC, standby := c1, nc1, c2
	if c2.Active() {
		active, activeNC, standby = c2, nc2, c1
	}
	r.set(messages.PoolSet{Name: "eu", Size: 20}, true)
	r.waitReady("eu", 20, 30*time.Second)
	r.set(messages.PoolSet{Name: "eu", Size: 40}, false)
	pollUntil(t, "the grown pool's first new members", 10*time.Second, func() bool {
		first, _ := r.createsOf("eu")
		return len(first) > 20
	})
	activeNC.Close()
	pollUntil(t, "the standby active", 10*time.Second, func() bool { return standby.Active() })
	if active.Active() {
		t.Error("the cut-off controller still says it is active")
	}
	r.waitReady("eu", 40, 30*time.Second)
	first, twice := r.createsOf("eu")
	if len(twice) > 0 {
		t.Errorf("members created under two command ids: %v", twice)
	}
	if len(first) != 40 {
		t.Errorf("%d members' creates published, want 40", len(first))
	}
	for id, n := range r.creates() {
		if n != 1 {
			t.Errorf("%s created %d times on its host", id, n)
		}
	}
}
