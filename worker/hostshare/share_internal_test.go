package hostshare

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

func members(n int, hosts []string) []messages.WorkerRecord {
	out := make([]messages.WorkerRecord, n)
	for i := range out {
		out[i] = messages.WorkerRecord{ID: fmt.Sprintf("host%d-%d", i, 1000+i), State: messages.WorkerActive, Hosts: hosts}
	}
	return out
}

func hostNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d", i+1)
	}
	return out
}

// Every host gets an owner, nobody gets more than ceil(H/W), and every
// worker computes the same assignment whatever the order it read the
// records in.
func TestAssignIsFairAndTheSameForEveryone(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for h := 1; h <= 24; h++ {
		for w := 1; w <= 7; w++ {
			ms := members(w, hostNames(h))
			got := assign(ms)
			if len(got) != h {
				t.Fatalf("H=%d W=%d: %d hosts owned", h, w, len(got))
			}
			load := map[string]int{}
			for _, id := range got {
				load[id]++
			}
			limit := (h + w - 1) / w
			for id, n := range load {
				if n > limit {
					t.Errorf("H=%d W=%d: %s owns %d, more than %d", h, w, id, n, limit)
				}
			}
			shuffled := slices.Clone(ms)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := assign(shuffled); fmt.Sprint(again) != fmt.Sprint(got) {
				t.Fatalf("H=%d W=%d: the order of the records changed the assignment:\n%v\n%v", h, w, got, again)
			}
		}
	}
}

// A host goes only to a worker that can execute it, and none is left
// without an owner when the only workers that can are full.
func TestAssignRespectsWhatEachWorkerExecutes(t *testing.T) {
	ms := []messages.WorkerRecord{
		{ID: "a", Hosts: []string{"h1", "h2", "h3", "h4"}},
		{ID: "b", Hosts: []string{"h1"}},
		{ID: "c"}, // intake only: not counted
	}
	got := assign(ms)
	if len(got) != 4 {
		t.Fatalf("owned: %v", got)
	}
	for h, id := range got {
		if id == "b" && h != "h1" {
			t.Errorf("%s went to b, which cannot execute it", h)
		}
	}
}

// Liveness: an active record younger than the window, stored within the
// bucket's TTL; the worker itself always.
func TestLiveMembers(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	self := messages.WorkerRecord{ID: "me", State: messages.WorkerActive, Hosts: []string{"h1"}}
	rec := func(id, state string, age time.Duration) member {
		return member{rec: messages.WorkerRecord{ID: id, State: state, At: now.Add(-age), Hosts: []string{"h1"}}, stored: now.Add(-age)}
	}
	recs := map[string]member{
		"fresh":    rec("fresh", messages.WorkerActive, time.Second),
		"old":      rec("old", messages.WorkerActive, 6*time.Second),
		"draining": rec("draining", messages.WorkerDraining, 0),
		"me":       rec("me", messages.WorkerDraining, time.Hour), // its own view wins
	}
	ahead := rec("ahead", messages.WorkerActive, -time.Hour) // its writer's clock runs ahead
	ahead.stored = now.Add(-2 * topology.WorkersTTL)
	recs["ahead"] = ahead
	var ids []string
	for _, r := range liveMembers(recs, self, now, 6*time.Second) {
		ids = append(ids, r.ID)
	}
	if want := []string{"fresh", "me"}; !slices.Equal(ids, want) {
		t.Errorf("live: %v, want %v", ids, want)
	}
}

// fakeHost is a Host that records what it is told.
type fakeHost struct {
	want, pulling bool
	pin           string
}

func (h *fakeHost) Want(pull bool) { h.want = pull }
func (h *fakeHost) Pulling() bool  { return h.pulling }
func (h *fakeHost) Pin() string    { return h.pin }

// benchMembership is the membership of worker 0 of workers, each
// executing every one of hosts and pulling its share, as their records
// say, at now.
func benchMembership(workers, hosts int, now time.Time) *Membership {
	names := hostNames(hosts)
	own := map[string]Host{}
	for _, h := range names {
		own[h] = &fakeHost{}
	}
	ms := members(workers, names)
	owners := assign(ms)
	m := &Membership{
		cfg: Config{Hosts: own, Liveness: 6 * time.Second, Heartbeat: 2 * time.Second,
			Now: func() time.Time { return now }, Log: slog.New(slog.DiscardHandler)},
		kick: make(chan struct{}, 1), recs: map[string]member{}, wanted: map[string]bool{}, idle: map[string]idleOwner{},
		self: ms[0], viewed: true,
	}
	for _, r := range ms {
		for _, h := range names {
			if owners[h] == r.ID {
				r.Pulling = append(r.Pulling, h)
				r.Owned = append(r.Owned, h)
			}
		}
		r.At = now
		m.recs[r.ID] = member{rec: r, stored: now, pulls: pullSet(r)}
	}
	return m
}

// BenchmarkMembershipReconcile: what a worker does on every heartbeat of
// every worker (each renews its record every Heartbeat): with 500 hosts
// and 10 workers, 5 reconciles a second of a membership that has not
// changed.
func BenchmarkMembershipReconcile(b *testing.B) {
	m := benchMembership(10, 500, time.Unix(1_000_000, 0))
	m.reconcile()
	b.ReportAllocs()
	for b.Loop() {
		m.reconcile()
	}
}

// The assignment is computed again when, and only when, the live members
// or their hosts change: a heartbeat reuses it, a worker gone or a host
// added makes it anew, and the share follows.
func TestAssignmentFollowsTheMembership(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	m := benchMembership(3, 12, now)
	shareOf := func(owners map[string]string) []string {
		var s []string
		for h, id := range owners {
			if id == m.self.ID {
				s = append(s, h)
			}
		}
		slices.Sort(s)
		return s
	}
	live := func() []messages.WorkerRecord { return liveMembers(m.recs, m.self, now, m.cfg.Liveness) }
	m.reconcile()
	first := m.assignedOwners
	if want := shareOf(assign(live())); !slices.Equal(m.share, want) || len(want) != 4 {
		t.Fatalf("share %v, want %v (4 of 12)", m.share, want)
	}
	// A heartbeat: a newer record, the same members and hosts.
	id := fmt.Sprintf("host%d-%d", 1, 1001)
	mem := m.recs[id]
	mem.rec.At = now.Add(time.Millisecond)
	mem.rec.Hosts = slices.Clone(mem.rec.Hosts) // decoded anew, equal
	m.recs[id] = mem
	m.reconcile()
	if fmt.Sprintf("%p", m.assignedOwners) != fmt.Sprintf("%p", first) {
		t.Error("a heartbeat computed the assignment again")
	}
	// A worker gone: its hosts are shared over the other two.
	delete(m.recs, id)
	m.reconcile()
	if want := shareOf(assign(live())); !slices.Equal(m.share, want) || len(want) != 6 {
		t.Fatalf("after a worker left: share %v, want %v (6 of 12)", m.share, want)
	}
	// The other one can execute a host more: computed again.
	other := fmt.Sprintf("host%d-%d", 2, 1002)
	mem = m.recs[other]
	mem.rec.Hosts = append(slices.Clone(mem.rec.Hosts), "h13")
	m.recs[other] = mem
	m.reconcile()
	if got := m.assignedOwners["h13"]; got != other {
		t.Errorf("h13 assigned to %q, want %s, the only worker that executes it", got, other)
	}
}

// A view that lags (its watch behind a loaded server, or stopped) counts
// no record dead for its own lag: every record, this worker's own among
// them, is as old as the view; judged by the reader's clock alone,
// "fresh" and "peer" would count dead here. Only a record older than the
// view's newest by the window is dead.
func TestLiveMembersOfALaggingView(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	self := messages.WorkerRecord{ID: "me", State: messages.WorkerActive, Hosts: []string{"h1"}}
	rec := func(id string, age time.Duration) member {
		return member{rec: messages.WorkerRecord{ID: id, State: messages.WorkerActive, At: now.Add(-age), Hosts: []string{"h1"}}, stored: now.Add(-age)}
	}
	lag := 20 * time.Second
	recs := map[string]member{
		"me":   rec("me", lag),
		"peer": rec("peer", lag+time.Second),
		"dead": rec("dead", lag+6*time.Second),
	}
	var ids []string
	for _, r := range liveMembers(recs, self, now, 6*time.Second) {
		ids = append(ids, r.ID)
	}
	if want := []string{"me", "peer"}; !slices.Equal(ids, want) {
		t.Errorf("live: %v, want %v", ids, want)
	}
}

// A watch that delivers nothing for Liveness after this worker wrote its
// record is stuck; one that has delivered since, or before any write,
// is not.
func TestMembershipNoticesAStuckWatch(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	m := &Membership{cfg: Config{Liveness: 6 * time.Second, Heartbeat: 2 * time.Second, Now: func() time.Time { return now }},
		viewed: true, watcher: stuckWatcher{}}
	m.heard, m.wrote = now.Add(-7*time.Second), now.Add(-time.Second)
	if !m.stuck() {
		t.Error("silent for 7s since a write 1s ago: not counted stuck")
	}
	m.heard = now.Add(-500 * time.Millisecond)
	if m.stuck() {
		t.Error("delivered 0.5s ago: counted stuck")
	}
	m.heard, m.wrote = now.Add(-7*time.Second), now.Add(-8*time.Second)
	if m.stuck() {
		t.Error("nothing written since it last delivered: counted stuck")
	}
}

// stuckWatcher is a KeyWatcher that never delivers.
type stuckWatcher struct{}

func (stuckWatcher) Updates() <-chan jetstream.KeyValueEntry { return nil }
func (stuckWatcher) Stop() error                             { return nil }

// kvEntry is a KV entry as the watch delivers one.
type kvEntry struct {
	jetstream.KeyValueEntry
	key   string
	value []byte
	at    time.Time
}

func (e kvEntry) Key() string                     { return e.key }
func (e kvEntry) Value() []byte                   { return e.value }
func (e kvEntry) Created() time.Time              { return e.at }
func (e kvEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// A heartbeat that repeats a member's lists is read as the record it is,
// and one that changes them is read anew: the lists a repeat takes from
// the last record are never stale.
func TestDecodeTakesRepeatedListsFromTheLastRecord(t *testing.T) {
	now := time.Now()
	m := &Membership{cfg: Config{Now: func() time.Time { return now }, Log: slog.New(slog.DiscardHandler)},
		recs: map[string]member{}}
	rec := messages.WorkerRecord{V: 1, ID: "w2", State: messages.WorkerActive, Hosts: []string{"h1", "h2", "h3"},
		Pulling: []string{"h2"}, Owned: []string{"h2"}, Started: now, At: now}
	put := func(r messages.WorkerRecord) member {
		t.Helper()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		m.apply(kvEntry{key: r.ID, value: b, at: r.At})
		got, ok := m.recs[r.ID]
		if !ok {
			t.Fatalf("record of %s not kept", r.ID)
		}
		return got
	}
	check := func(got member, want messages.WorkerRecord) {
		t.Helper()
		if !slices.Equal(got.rec.Hosts, want.Hosts) || !slices.Equal(got.rec.Pulling, want.Pulling) ||
			!slices.Equal(got.rec.Owned, want.Owned) || !got.rec.At.Equal(want.At) {
			t.Errorf("record %+v, want %+v", got.rec, want)
		}
		for _, h := range want.Hosts {
			_, pulls := got.pulls[h]
			if want := slices.Contains(want.Pulling, h) || slices.Contains(want.Owned, h); pulls != want {
				t.Errorf("pulls %s: %v, want %v", h, pulls, want)
			}
		}
	}
	check(put(rec), rec)
	rec.At = now.Add(2 * time.Second) // a heartbeat: same lists
	check(put(rec), rec)
	rec.At = now.Add(4 * time.Second)
	rec.Pulling, rec.Owned = []string{"h1", "h3"}, nil // the share moved
	check(put(rec), rec)
	rec.At = now.Add(6 * time.Second)
	rec.Hosts = []string{"h1", "h3"}
	check(put(rec), rec)
}
