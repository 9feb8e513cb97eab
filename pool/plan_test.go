package pool

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"proxyfleet/messages"
)

// world simulates the fleet around one pool for the plan alone: a member
// enters the rotation boot after it is made (unless creates fail), leaves
// it as soon as it is retired, and its deleted event comes a little later.
type world struct {
	t       *testing.T
	now     time.Time
	rec     messages.PoolRecord
	boot    time.Duration
	failing bool // every create fails (a broken image)
	// bans counts, by member, the sites its addresses are banned on.
	bans    map[string]int
	retired []retirement // every retirement, in order
	hosts   []hostRoom
	rng     *rand.Rand

	created   []string // every member made, in order
	createdAt map[string]time.Time
	failedAt  map[string]time.Time
	answers   []answer
	minSeen   int // fewest members in the rotation since the pool first was full
	full      bool
	maxLive   int
}

func newWorld(t *testing.T, size, minReady, surge int, maxAge time.Duration) *world {
	w := &world{
		t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), boot: 300 * time.Millisecond,
		rng:       rand.New(rand.NewPCG(1, 2)),
		createdAt: map[string]time.Time{}, failedAt: map[string]time.Time{}, minSeen: -1,
		hosts: []hostRoom{{name: "h1", max: 100}, {name: "h2", max: 100}, {name: "h3", max: 100}},
	}
	w.rec = messages.PoolRecord{V: 1, Name: "eu", Op: "set", Seq: 1, CommandID: "c1", Size: size, MinReady: minReady, Surge: surge,
		MaxAge: messages.Duration(maxAge), ReadyTimeout: messages.Duration(5 * time.Second),
		Pending: []messages.PoolPending{{CommandID: "c1", Op: messages.OpPoolSet, Seq: 1}}}
	return w
}

func (w *world) observe() map[string]observed {
	obs := map[string]observed{}
	for _, m := range w.rec.Members {
		var o observed
		switch {
		case m.Retired != nil:
			if w.now.Sub(m.Retired.At) >= 100*time.Millisecond {
				o.ev = &messages.StateEvent{ID: m.ID, State: messages.StateDeleted, CommandID: messages.MemberDeleteID(w.rec.Name, m.ID)}
			}
		case !w.failedAt[m.ID].IsZero():
			o.ev = &messages.StateEvent{ID: m.ID, State: messages.StateFailed, CommandID: messages.MemberCreateID(w.rec.Name, m.ID), Reason: "image broken"}
		case w.now.Sub(w.createdAt[m.ID]) >= w.boot:
			o.in = true
		}
		obs[m.ID] = o
	}
	return obs
}

// pass runs one plan and applies it as the controller would (every
// command published, every answer given).
func (w *world) pass() planned {
	n := 0
	p := plan(&w.rec, planEnv{
		now: w.now, obs: w.observe(), bans: w.bans,
		hosts: func() []hostRoom { return w.hosts },
		newID: func() string { n++; return fmt.Sprintf("%06d", w.rng.IntN(1e6)) },
		rand:  w.rng.Float64, backoffInitial: time.Second, backoffMax: 8 * time.Second,
	})
	w.rec = p.rec
	w.retired = append(w.retired, p.retired...)
	for i := range w.rec.Members {
		m := &w.rec.Members[i]
		if !m.Published {
			m.Published = true
			w.created = append(w.created, m.ID)
			w.createdAt[m.ID] = w.now
			if w.failing {
				w.failedAt[m.ID] = w.now
			}
		}
		if m.Retired != nil {
			m.Retired.Published = true
		}
	}
	for _, a := range p.answers {
		w.answers = append(w.answers, a)
		w.rec.Pending = slices.DeleteFunc(w.rec.Pending, func(pd messages.PoolPending) bool { return pd.CommandID == a.p.CommandID })
	}
	// Count what the rotation holds now.
	ready, live := 0, 0
	for _, m := range w.rec.Members {
		if m.Retired == nil {
			live++
			if w.observe()[m.ID].in {
				ready++
			}
		}
	}
	w.maxLive = max(w.maxLive, live)
	if ready >= w.rec.Size {
		w.full = true
	}
	if w.full && (w.minSeen < 0 || ready < w.minSeen) {
		w.minSeen = ready
	}
	return p
}

// run passes every step for d.
func (w *world) run(d, step time.Duration) {
	for end := w.now.Add(d); w.now.Before(end); w.now = w.now.Add(step) {
		w.pass()
	}
}

func (w *world) live() []messages.PoolMember {
	var out []messages.PoolMember
	for _, m := range w.rec.Members {
		if m.Retired == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestPlanFillsSpreadsAndAnswers(t *testing.T) {
	w := newWorld(t, 6, 6, 1, 0)
	w.hosts[2].max = 1 // h3 has room for one
	p := w.pass()
	if len(p.created) != 6 {
		t.Fatalf("first pass made %d members, want 6", len(p.created))
	}
	per := map[string]int{}
	for _, m := range w.rec.Members {
		per[m.Host]++
	}
	if per["h1"] != 3 || per["h2"] != 2 || per["h3"] != 1 {
		t.Fatalf("members per host %v, want fewest of the pool first, within room", per)
	}
	if w.rec.State != messages.PoolFilling {
		t.Fatalf("state %s, want filling", w.rec.State)
	}
	w.run(time.Second, 100*time.Millisecond)
	if w.rec.State != messages.PoolReady || len(w.created) != 6 {
		t.Fatalf("state %s after %d creates, want ready after 6", w.rec.State, len(w.created))
	}
	if len(w.answers) != 1 || w.answers[0].outcome != messages.OutcomeDone {
		t.Fatalf("answers %+v, want the set done", w.answers)
	}

	// No room anywhere: degraded, naming the hosts.
	w2 := newWorld(t, 2, 2, 1, 0)
	w2.hosts = []hostRoom{{name: "h1", used: 20, max: 20}, {name: "h2", max: 20, quarantined: true}}
	w2.pass()
	if w2.rec.State != messages.PoolDegraded || w2.rec.Reason != "no room on any host: h1 full (20 of 20), h2 quarantined" {
		t.Fatalf("state %s %q", w2.rec.State, w2.rec.Reason)
	}
}

// Recycling by age replaces every member, make-before-break: the pool's
// members in the rotation never fall below min_ready once it was full, and
// never more than size+surge are live.
func TestPlanRecyclesMakeBeforeBreak(t *testing.T) {
	for _, tc := range []struct{ size, minReady, surge int }{{5, 5, 1}, {5, 3, 2}, {20, 20, 3}, {1, 1, 1}} {
		t.Run(fmt.Sprintf("size%d-min%d-surge%d", tc.size, tc.minReady, tc.surge), func(t *testing.T) {
			w := newWorld(t, tc.size, tc.minReady, tc.surge, 3*time.Second)
			w.run(2*time.Second, 100*time.Millisecond)
			first := slices.Clone(w.created)
			if len(first) != tc.size {
				t.Fatalf("%d made before any was old, want %d", len(first), tc.size)
			}
			w.run(20*time.Second, 100*time.Millisecond)
			for _, id := range first {
				if _, ok := w.rec.Member(id); ok {
					t.Errorf("%s is still a member after 20s with max_age 3s", id)
				}
			}
			if w.minSeen < tc.minReady {
				t.Errorf("the rotation held %d of the pool at worst, below min_ready %d", w.minSeen, tc.minReady)
			}
			if w.maxLive > tc.size+tc.surge {
				t.Errorf("%d live members at most, more than size+surge %d", w.maxLive, tc.size+tc.surge)
			}
			t.Logf("%d creates, fewest in the rotation %d, most live %d", len(w.created), w.minSeen, w.maxLive)
			if len(w.created) < 2*tc.size {
				t.Errorf("%d creates in 22s with max_age 3s", len(w.created))
			}
		})
	}
}

func TestPlanRecycleCommand(t *testing.T) {
	w := newWorld(t, 4, 4, 2, 0)
	w.run(time.Second, 100*time.Millisecond)
	live := w.live()
	marked := []string{live[0].ID, live[1].ID}
	for i := range w.rec.Members {
		if slices.Contains(marked, w.rec.Members[i].ID) {
			w.rec.Members[i].Recycle = "r1"
		}
	}
	w.rec.Pending = append(w.rec.Pending, messages.PoolPending{CommandID: "r1", Op: messages.OpPoolRecycle, Seq: 2})
	w.full, w.minSeen = false, -1
	w.run(3*time.Second, 100*time.Millisecond)
	for _, id := range marked {
		if _, ok := w.rec.Member(id); ok {
			t.Errorf("%s still a member after its recycle", id)
		}
	}
	if last := w.answers[len(w.answers)-1]; last.p.CommandID != "r1" || last.outcome != messages.OutcomeDone {
		t.Fatalf("answers %+v, want the recycle done", w.answers)
	}
	if w.minSeen < 4 || len(w.live()) != 4 || len(w.created) != 6 {
		t.Fatalf("min %d, live %d, created %d", w.minSeen, len(w.live()), len(w.created))
	}
}

// A broken image makes size+surge creates, then one per backoff, which
// doubles; the pool is degraded and its set failed. Fixed, it fills again.
func TestPlanBrokenBacksOff(t *testing.T) {
	w := newWorld(t, 5, 5, 1, 0)
	w.failing = true
	w.run(60*time.Second, 100*time.Millisecond)
	// 6 at once, then after 1, 2, 4, 8, 8... seconds: 6 + at most 1+ (60-15)/8+4.
	t.Logf("%d creates in 60s", len(w.created))
	if n := len(w.created); n < 6 || n > 6+12 {
		t.Fatalf("%d creates in 60s with every create failing", n)
	}
	if w.rec.State != messages.PoolDegraded || w.rec.Reason == "" {
		t.Fatalf("state %s %q, want degraded with a reason", w.rec.State, w.rec.Reason)
	}
	if len(w.answers) != 1 || w.answers[0].outcome != messages.OutcomeFailed {
		t.Fatalf("answers %+v, want the set failed", w.answers)
	}
	before := len(w.created)
	w.run(60*time.Second, 100*time.Millisecond)
	if n := len(w.created) - before; n > 8 {
		t.Fatalf("%d creates in the next 60s, want at most one per 8s", n)
	}
	w.failing = false
	w.run(20*time.Second, 100*time.Millisecond)
	if w.rec.State != messages.PoolReady || w.rec.Failures != 0 {
		t.Fatalf("after the fix: state %s, failures %d", w.rec.State, w.rec.Failures)
	}
}

// A member that leaves the rotation and stays out for ready_timeout is
// replaced; one that fails is replaced at once.
func TestPlanReplacesTheBroken(t *testing.T) {
	w := newWorld(t, 3, 3, 1, 0)
	w.run(time.Second, 100*time.Millisecond)
	gone := w.live()[0].ID
	w.boot = time.Hour // what is made now never comes up
	w.createdAt[gone] = w.now
	w.run(4*time.Second, 100*time.Millisecond)
	if m, _ := w.rec.Member(gone); m.Retired != nil {
		t.Fatalf("%s retired before ready_timeout", gone)
	}
	w.boot = 300 * time.Millisecond
	w.createdAt[gone] = w.now.Add(time.Hour) // out of the rotation, for good
	w.run(6*time.Second, 100*time.Millisecond)
	if _, ok := w.rec.Member(gone); ok {
		t.Fatalf("%s still a member after ready_timeout out of the rotation", gone)
	}
	if len(w.live()) != 3 || w.rec.State != messages.PoolReady {
		t.Fatalf("live %d, state %s", len(w.live()), w.rec.State)
	}
}

func TestPlanShrinksAndDeletes(t *testing.T) {
	w := newWorld(t, 6, 6, 1, 0)
	w.run(time.Second, 100*time.Millisecond)
	oldest := w.created[:3]
	for i := range w.rec.Members { // the first three made are the oldest
		if slices.Contains(oldest, w.rec.Members[i].ID) {
			w.rec.Members[i].Created = w.rec.Members[i].Created.Add(-time.Minute)
		}
	}
	w.rec.Size, w.rec.MinReady = 3, 3
	p := w.pass()
	var shrunk []string
	for _, r := range p.retired {
		if r.why == messages.RetireShrink {
			shrunk = append(shrunk, r.id)
		}
	}
	slices.Sort(shrunk)
	want := slices.Sorted(slices.Values(oldest))
	if !slices.Equal(shrunk, want) {
		t.Fatalf("shrink retired %v, want the oldest %v", shrunk, want)
	}
	w.rec.Op, w.rec.Seq = messages.OpDelete, 2
	w.rec.Pending = append(w.rec.Pending, messages.PoolPending{CommandID: "d1", Op: messages.OpPoolDelete, Seq: 2})
	p = w.pass()
	if p.gone || len(w.live()) != 0 || w.rec.State != messages.PoolDeleting {
		t.Fatalf("after delete: gone %v, live %d, state %s", p.gone, len(w.live()), w.rec.State)
	}
	w.now = w.now.Add(200 * time.Millisecond)
	p = w.pass()
	if !p.gone || len(w.rec.Members) != 0 {
		t.Fatalf("members %d left, gone %v", len(w.rec.Members), p.gone)
	}
	if a := w.answers[len(w.answers)-1]; a.p.CommandID != "d1" || a.outcome != messages.OutcomeDone {
		t.Fatalf("answers %+v", w.answers)
	}
}

// A set that changes the spec (an image, labels) has every member made
// with the old one replaced, make-before-break; one that drops a host from
// spec.hosts has that host's members replaced on the others.
func TestPlanRollsANewSpec(t *testing.T) {
	w := newWorld(t, 4, 4, 1, 0)
	w.run(time.Second, 100*time.Millisecond)
	first := slices.Clone(w.created)
	w.rec.Spec = messages.PoolSpec{Image: "img2"}
	w.full, w.minSeen = false, -1
	w.run(10*time.Second, 100*time.Millisecond)
	for _, id := range first {
		if _, ok := w.rec.Member(id); ok {
			t.Errorf("%s, made with the old spec, is still a member", id)
		}
	}
	if w.minSeen < 4 || w.rec.State != messages.PoolReady {
		t.Fatalf("fewest in the rotation %d, state %s", w.minSeen, w.rec.State)
	}
	w.rec.Spec.Hosts = []string{"h1", "h2"}
	w.run(10*time.Second, 100*time.Millisecond)
	for _, m := range w.live() {
		if m.Host == "h3" {
			t.Errorf("%s is still on h3, which spec.hosts no longer names", m.ID)
		}
	}
	if w.minSeen < 4 || w.rec.State != messages.PoolReady || len(w.live()) != 4 {
		t.Fatalf("fewest in the rotation %d, state %s, live %d", w.minSeen, w.rec.State, len(w.live()))
	}
}

// A member whose addresses are banned on recycle_after_bans sites is
// replaced make-before-break and stays due once its bans end; one banned
// on fewer is kept, and a pool without the setting keeps them all.
func TestPlanRecyclesTheBurned(t *testing.T) {
	w := newWorld(t, 3, 3, 1, 0)
	w.rec.RecycleAfterBans = 2
	w.run(time.Second, 100*time.Millisecond)
	live := w.live()
	if len(live) != 3 || w.rec.State != messages.PoolReady {
		t.Fatalf("live %d, state %s", len(live), w.rec.State)
	}
	burned, kept := live[0].ID, live[1].ID
	w.bans = map[string]int{burned: 2, kept: 1}
	p := w.pass()
	if m, _ := w.rec.Member(burned); m.BannedOn != 2 || m.Retired != nil || !slices.Equal(p.burned, []string{burned}) {
		t.Fatalf("burned member %+v, pass found %v burned; want it marked, not yet retired", m, p.burned)
	}
	if m, _ := w.rec.Member(kept); m.BannedOn != 0 {
		t.Fatalf("%s, banned on 1 site, marked burned", kept)
	}
	if w.rec.State != messages.PoolRecycling || len(p.created) != 1 {
		t.Fatalf("state %s, %d made; want recycling with its replacement made first", w.rec.State, len(p.created))
	}
	w.bans = nil // its bans end: it stays due
	w.run(3*time.Second, 100*time.Millisecond)
	if _, ok := w.rec.Member(burned); ok {
		t.Fatalf("%s is still a member", burned)
	}
	if _, ok := w.rec.Member(kept); !ok {
		t.Fatalf("%s, banned on fewer sites than recycle_after_bans, was retired", kept)
	}
	var recycles []retirement
	for _, r := range w.retired {
		if r.why == messages.RetireRecycle {
			recycles = append(recycles, r)
		}
	}
	if len(recycles) != 1 || recycles[0].id != burned || recycles[0].cause != messages.RecycleBans {
		t.Fatalf("recycles %+v, want %s's for its bans", recycles, burned)
	}
	if w.minSeen < 3 || len(w.live()) != 3 || len(w.created) != 4 || w.rec.State != messages.PoolReady {
		t.Fatalf("fewest in the rotation %d, live %d, created %d, state %s", w.minSeen, len(w.live()), len(w.created), w.rec.State)
	}

	off := newWorld(t, 2, 2, 1, 0)
	off.run(time.Second, 100*time.Millisecond)
	off.bans = map[string]int{off.live()[0].ID: 50}
	off.run(time.Second, 100*time.Millisecond)
	if len(off.created) != 2 || off.live()[0].BannedOn != 0 {
		t.Fatalf("without recycle_after_bans: %d made, %+v", len(off.created), off.live()[0])
	}
}
