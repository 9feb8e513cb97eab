package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is how long a test waits for what it asserts: a bound for hangs,
// not a timing assertion.
const bound = 15 * time.Second

var subj = messages.NewSubjects("")

// rig is an embedded nats-server and a publisher of the rotation that
// plays health on the wire: it sends each change on the feed
// (messages.RotationChanges, each message following the one before) and
// answers the pages (messages.RotationPage). A proxy's entry is made, as
// health makes it, from its address (put), its latest event's host and
// labels (event) and its check's egress when the check is of its address
// (check); those are kept for proxies not in the rotation too.
type rig struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream

	mu      sync.Mutex
	addrs   map[string]string // the rotation: id -> address
	since   map[string]time.Time
	hosts   map[string]string
	labels  map[string]map[string]string
	checks  map[string][2]string // id -> address checked, egress
	sent    map[string]messages.RotationEntry
	version uint64
	pageMax int  // proxies per page
	drop    bool // the next message is lost
	reset   bool // the next message follows no version
}

func newRig(t *testing.T, serve bool) *rig {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	r := &rig{t: t, srv: srv, nc: nc, js: js, addrs: map[string]string{}, since: map[string]time.Time{},
		hosts: map[string]string{}, labels: map[string]map[string]string{}, checks: map[string][2]string{},
		sent: map[string]messages.RotationEntry{}, version: 100, pageMax: 100}
	if serve {
		r.setup()
	}
	return r
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// setup starts answering the pages, as a health process holding the
// lease does.
func (r *rig) setup() {
	r.t.Helper()
	sub, err := r.nc.Subscribe(subj.RotationGet(), r.answer)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func (r *rig) answer(msg *nats.Msg) {
	req, err := messages.DecodeRotationGet(msg.Data)
	if err != nil {
		r.t.Errorf("page request: %v", err)
		return
	}
	r.mu.Lock()
	ids := slices.Sorted(maps.Keys(r.sent))
	page := messages.RotationPage{V: 1, Version: r.version, Size: len(ids), Proxies: []messages.RotationEntry{}}
	limit := r.pageMax
	if req.Limit > 0 {
		limit = min(limit, req.Limit)
	}
	i, _ := slices.BinarySearch(ids, req.After)
	for ; i < len(ids); i++ {
		if ids[i] == req.After {
			continue
		}
		if len(page.Proxies) == limit {
			page.Next = page.Proxies[len(page.Proxies)-1].ID
			break
		}
		page.Proxies = append(page.Proxies, r.sent[ids[i]])
	}
	r.mu.Unlock()
	body, _ := json.Marshal(page)
	_ = msg.Respond(body)
}

// entryLocked is id's entry as health would make it.
func (r *rig) entryLocked(id string) (messages.RotationEntry, bool) {
	addr, ok := r.addrs[id]
	if !ok {
		return messages.RotationEntry{}, false
	}
	e := messages.RotationEntry{ID: id, Addr: addr, Host: r.hosts[id], Since: r.since[id], Labels: r.labels[id]}
	if c := r.checks[id]; c[0] == addr {
		e.Egress = c[1]
	}
	return e, true
}

// publishLocked sends what changed of id's entry, if anything did.
func (r *rig) publishLocked(id string) {
	r.t.Helper()
	e, in := r.entryLocked(id)
	old, was := r.sent[id]
	var c messages.RotationChange
	switch {
	case !in && !was:
		return
	case !in:
		c = messages.RotationChange{Op: messages.ChangeLeft, ID: id}
		delete(r.sent, id)
	case was && reflect.DeepEqual(old, e):
		return
	default:
		c = messages.RotationChange{Op: messages.ChangeEntered, ID: id, Proxy: &e}
		if was {
			c.Op = messages.ChangeChanged
		}
		r.sent[id] = e
	}
	prev := r.version
	r.version += 1 + uint64(rand.IntN(3)) // versions skip, as health's do
	if r.reset {
		prev, r.reset = 0, false
	}
	m := messages.RotationChanges{V: 1, Version: r.version, Prev: prev, Size: len(r.sent),
		Changes: []messages.RotationChange{c}, At: time.Now().UTC()}
	if r.drop {
		r.drop = false
		return
	}
	body, _ := json.Marshal(m)
	if err := r.nc.Publish(subj.RotationChanges(), body); err != nil {
		r.t.Fatal(err)
	}
}

// put puts id in the rotation at addr, as health does.
func (r *rig) put(id, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addrs[id] != addr {
		r.since[id] = time.Now().UTC()
	}
	r.addrs[id] = addr
	r.publishLocked(id)
}

func (r *rig) del(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.addrs, id)
	r.publishLocked(id)
}

// event records id's host and labels, as its latest state event says.
func (r *rig) event(id, host string, labels map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts[id], r.labels[id] = host, labels
	r.publishLocked(id)
}

// check records health's check of id at addr.
func (r *rig) check(id, addr, egress string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[id] = [2]string{addr, egress}
	r.publishLocked(id)
}

// dropNext loses the next message of the feed (the rotation moves on).
func (r *rig) dropNext() { r.mu.Lock(); r.drop = true; r.mu.Unlock() }

// resetNext makes the next message follow no version, as a new
// publisher's first does.
func (r *rig) resetNext() { r.mu.Lock(); r.reset = true; r.mu.Unlock() }

// testLogger writes to the test's log, and nothing once it has ended.
type testLogger struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// config is a Config with short timings, logging to the test.
func config(t *testing.T) Config {
	l := &testLogger{t: t}
	t.Cleanup(func() { l.mu.Lock(); l.done = true; l.mu.Unlock() })
	return Config{
		User: "fleet", Password: "secret",
		CheckInterval: 100 * time.Millisecond, RetryMax: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// follow is Follow with the rig's own connection, closed when the test
// ends.
func (r *rig) follow(cfg Config) *Rotation {
	r.t.Helper()
	nc, _ := r.srv.Connect(r.t)
	rot, err := Follow(ctxFor(r.t, bound), nc, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		if err := rot.Close(); err != nil {
			r.t.Errorf("close: %v", err)
		}
	})
	return rot
}

// fleet puts n proxies p1..pn in the rotation (127.0.0.1:1000+i) with
// events carrying labels(i), and waits until rot shows them all.
func (r *rig) fleet(rot *Rotation, n int, labels func(i int) map[string]string) []Proxy {
	r.t.Helper()
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("p%d", i)
		var l map[string]string
		if labels != nil {
			l = labels(i)
		}
		r.event(id, "h1", l)
		r.put(id, fmt.Sprintf("127.0.0.1:%d", 1000+i))
	}
	poll.Until(r.t, fmt.Sprintf("%d proxies with their events", n), bound, func() bool {
		ps := rot.Proxies()
		if len(ps) != n {
			return false
		}
		for _, p := range ps {
			if p.Host != "h1" {
				return false
			}
		}
		return true
	})
	return rot.Proxies()
}

// TestFollowsTheFeed: a proxy that enters appears; its host, labels and
// egress come with its entry and change with it; a change closes the
// Changed channel; one that leaves is removed.
func TestFollowsTheFeed(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	if rot.Len() != 0 {
		t.Fatalf("empty rotation: Len %d", rot.Len())
	}
	ch := rot.Changed()
	r.put("p1", "198.18.100.1:3128")
	poll.Until(t, "p1 in the rotation", bound, func() bool { return rot.Len() == 1 })
	select {
	case <-ch:
	case <-time.After(bound):
		t.Fatal("Changed not closed by a change")
	}
	p, _ := rot.Get("p1")
	if p.Addr != "198.18.100.1:3128" || p.Host != "" || p.Labels != nil || p.Since.IsZero() {
		t.Fatalf("p1 before its event: %+v", p)
	}
	if got, err := rot.Pick(Selector{}); err != nil || got.ID != "p1" {
		t.Fatalf("Pick without labels known: %+v, %v", got, err)
	}
	if _, err := rot.Pick(Selector{Labels: map[string]string{"team": "a"}}); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Pick by labels before they are known: %v, want ErrEmpty", err)
	}

	r.event("p1", "h1", map[string]string{"team": "a", "region": "eu"})
	poll.Until(t, "p1's host and labels", bound, func() bool {
		p, _ := rot.Get("p1")
		return p.Host == "h1" && maps.Equal(p.Labels, map[string]string{"team": "a", "region": "eu"})
	})

	// Checks of another address or of a proxy not in the rotation must
	// not show. The check of p1's own address comes after them on the
	// feed: once its egress shows, the rotation has had the others, and
	// it must have changed once.
	changes := rot.Stats().Changes
	r.check("p1", "198.18.100.9:3128", "203.0.113.9") // another address: not p1's egress
	r.check("p2", "198.18.100.2:3128", "203.0.113.2") // not in the rotation
	r.check("p1", "198.18.100.1:3128", "203.0.113.7")
	poll.Until(t, "p1's egress", bound, func() bool { p, _ := rot.Get("p1"); return p.Egress == "203.0.113.7" })
	if n := rot.Stats().Changes - changes; n != 1 || rot.Len() != 1 {
		t.Fatalf("%d changes for the checks, %d proxies: want 1 change, p1's own check, and p1 alone", n, rot.Len())
	}

	// An address change keeps labels, loses the egress of the old one.
	r.put("p1", "198.18.100.5:3128")
	poll.Until(t, "p1's new address", bound, func() bool {
		p, _ := rot.Get("p1")
		return p.Addr == "198.18.100.5:3128" && p.Egress == "" && p.Labels["team"] == "a"
	})

	r.del("p1")
	poll.Until(t, "p1 out of the rotation", bound, func() bool { return rot.Len() == 0 })
	if _, err := rot.Pick(Selector{}); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Pick of an empty rotation: %v", err)
	}
	st := rot.Stats()
	if st.Changes < 5 || st.EmptyPicks != 2 || st.Restarts != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReadyAfterCatchUp: Follow returns with the whole rotation read from
// the pages (no proxy without its labels or egress).
func TestReadyAfterCatchUp(t *testing.T) {
	r := newRig(t, true)
	const n = 300
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		addr := fmt.Sprintf("198.18.%d.%d:3128", i/250, i%250+1)
		r.event(id, "h1", map[string]string{"n": fmt.Sprint(i)})
		r.put(id, addr)
		r.check(id, addr, "203.0.113.1")
	}
	rot := r.follow(config(t))
	ps := rot.Proxies()
	if len(ps) != n {
		t.Fatalf("ready with %d proxies, want %d", len(ps), n)
	}
	for _, p := range ps {
		if p.Host != "h1" || p.Labels["n"] == "" || p.Egress != "203.0.113.1" {
			t.Fatalf("ready with an incomplete proxy: %+v", p)
		}
	}
	for i := 1; i < len(ps); i++ {
		if ps[i-1].ID >= ps[i].ID {
			t.Fatalf("Proxies not sorted by id: %s before %s", ps[i-1].ID, ps[i].ID)
		}
	}
}

// TestReadyWaitsForAPublisher: with no health process answering for the
// rotation, Ready waits; once one answers, it is read.
func TestReadyWaitsForAPublisher(t *testing.T) {
	r := newRig(t, false)
	nc, _ := r.srv.Connect(t)
	rot, err := New(nc, config(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	go func() { done <- rot.Run(ctx) }()
	select {
	case <-rot.Ready():
		t.Fatal("ready without a publisher")
	case <-time.After(time.Second):
	}
	r.setup()
	r.put("p1", "198.18.100.1:3128")
	select {
	case <-rot.Ready():
	case <-time.After(bound):
		t.Fatal("not ready once a publisher answers")
	}
	poll.Until(t, "p1", bound, func() bool { return rot.Len() == 1 })
	if err := rot.Run(ctx); err == nil {
		t.Fatal("a second Run while running: no error")
	}
}

// TestFollowTimesOut: Follow gives up when ctx ends before Ready, and
// leaves nothing running.
func TestFollowTimesOut(t *testing.T) {
	r := newRig(t, false)
	nc, _ := r.srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Follow(ctx, nc, config(t)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Follow without a publisher: %v, want the deadline", err)
	}
}

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 5, nil)
	count := map[string]int{}
	for range 500 {
		p, err := rot.Pick(Selector{})
		if err != nil {
			t.Fatal(err)
		}
		count[p.ID]++
	}
	for id, c := range count {
		if c != 100 {
			t.Fatalf("round robin: %s picked %d times of 500 over 5: %v", id, c, count)
		}
	}
	if len(count) != 5 {
		t.Fatalf("round robin picked %v", count)
	}
}

func TestRandomSpreads(t *testing.T) {
	r := newRig(t, true)
	cfg := config(t)
	cfg.Strategy = Random
	rot := r.follow(cfg)
	r.fleet(rot, 5, nil)
	count := map[string]int{}
	for range 5000 {
		p, err := rot.Pick(Selector{})
		if err != nil {
			t.Fatal(err)
		}
		count[p.ID]++
	}
	// 1000 expected each; sd ~28: 700..1300 is more than 10 sd.
	for id, c := range count {
		if c < 700 || c > 1300 {
			t.Fatalf("random: %s picked %d times of 5000 over 5: %v", id, c, count)
		}
	}
	if len(count) != 5 {
		t.Fatalf("random picked %v", count)
	}
}

func TestLeastBusyPicksTheIdlest(t *testing.T) {
	r := newRig(t, true)
	cfg := config(t)
	cfg.Strategy = LeastBusy
	rot := r.follow(cfg)
	ps := r.fleet(rot, 4, nil)
	// p1: 3 in flight, p2: 1, p3: 2, p4: 2.
	var releases []func()
	for i, n := range []int{3, 1, 2, 2} {
		for range n {
			releases = append(releases, rot.Acquire(ps[i]))
		}
	}
	for range 10 {
		if p, _ := rot.Pick(Selector{}); p.ID != "p2" {
			t.Fatalf("least busy: picked %s, want p2 (1 in flight)", p.ID)
		}
	}
	// p2 takes two more (3), p3 and p4 (2) are the idlest: both get picks.
	r2a, r2b := rot.Acquire(ps[1]), rot.Acquire(ps[1])
	got := map[string]bool{}
	for range 10 {
		p, _ := rot.Pick(Selector{})
		got[p.ID] = true
	}
	if !maps.Equal(got, map[string]bool{"p3": true, "p4": true}) {
		t.Fatalf("least busy with a tie of p3 and p4: picked %v", got)
	}
	// release is idempotent: releasing p1's three twice over leaves it at 0.
	for _, rel := range releases[:3] {
		rel()
		rel()
	}
	if p, _ := rot.Pick(Selector{}); p.ID != "p1" {
		t.Fatalf("least busy after p1's releases: picked %s", p.ID)
	}
	r2a()
	r2b()
	if got := ps[0]; got.ID != "p1" {
		t.Fatal(got)
	}
	if rot.idx.members["p1"].inflight.Load() != 0 || rot.idx.members["p2"].inflight.Load() != 1 {
		t.Fatalf("in flight: p1 %d, p2 %d", rot.idx.members["p1"].inflight.Load(), rot.idx.members["p2"].inflight.Load())
	}
}

// TestPickSessionStable: a key stays on its proxy; of 1,000 keys over 5
// proxies, when one leaves only its keys move, and they spread over the
// others.
func TestPickSessionStable(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 5, nil)
	before := map[string]string{}
	held := map[string]int{}
	for i := range 1000 {
		key := fmt.Sprintf("user-%d", i)
		p, err := rot.PickSession(key, Selector{})
		if err != nil {
			t.Fatal(err)
		}
		before[key] = p.ID
		held[p.ID]++
		if again, _ := rot.PickSession(key, Selector{}); again.ID != p.ID {
			t.Fatalf("key %s: %s then %s", key, p.ID, again.ID)
		}
		// The walk that checks each proxy (any exclusion) agrees with
		// the one over the hashes alone.
		if slow, _ := rot.PickSession(key, Selector{Exclude: []string{"none"}}); slow.ID != p.ID {
			t.Fatalf("key %s: %s, and %s with an exclusion of no proxy", key, p.ID, slow.ID)
		}
	}
	for id, n := range held {
		if n < 120 || n > 280 { // 200 expected
			t.Fatalf("session keys spread unevenly: %s holds %d: %v", id, n, held)
		}
	}
	r.del("p3")
	poll.Until(t, "p3 out", bound, func() bool { return rot.Len() == 4 })
	moved, stayed := 0, 0
	for key, was := range before {
		p, err := rot.PickSession(key, Selector{})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case was == "p3":
			moved++
		case p.ID != was:
			t.Fatalf("key %s moved from %s to %s though %s stayed", key, was, p.ID, was)
		default:
			stayed++
		}
	}
	t.Logf("p3 held %d of 1000 keys, which moved; %d stayed put", moved, stayed)
	if moved != held["p3"] || stayed != 1000-held["p3"] {
		t.Fatalf("moved %d, stayed %d; p3 held %d", moved, stayed, held["p3"])
	}
	// Excluded or cooling down, a key's proxy is passed over; back, it
	// has its keys again.
	key := "user-1"
	home := before[key]
	if home == "p3" {
		key, home = "user-2", before["user-2"]
	}
	if p, _ := rot.PickSession(key, Selector{Exclude: []string{home}}); p.ID == home || p.ID == "" {
		t.Fatalf("excluded home %s picked: %+v", home, p)
	}
	if p, _ := rot.PickSession(key, Selector{}); p.ID != home {
		t.Fatalf("key %s not back home on %s: %s", key, home, p.ID)
	}
}

func TestSelector(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 6, func(i int) map[string]string {
		region := "eu"
		if i > 3 {
			region = "us"
		}
		return map[string]string{"region": region, "tier": fmt.Sprint(i % 2)}
	})
	r.put("p7", "127.0.0.1:1007") // no labels
	poll.Until(t, "p7", bound, func() bool { return rot.Len() == 7 })

	eu := Selector{Labels: map[string]string{"region": "eu"}}
	got := map[string]bool{}
	for range 30 {
		p, err := rot.Pick(eu)
		if err != nil {
			t.Fatal(err)
		}
		got[p.ID] = true
	}
	if !maps.Equal(got, map[string]bool{"p1": true, "p2": true, "p3": true}) {
		t.Fatalf("region=eu picked %v", got)
	}
	both := Selector{Labels: map[string]string{"region": "us", "tier": "0"}}
	for range 10 {
		if p, err := rot.Pick(both); err != nil || (p.ID != "p4" && p.ID != "p6") {
			t.Fatalf("region=us,tier=0 picked %+v, %v", p, err)
		}
		if p, err := rot.PickSession("k", both); err != nil || (p.ID != "p4" && p.ID != "p6") {
			t.Fatalf("session region=us,tier=0 picked %+v, %v", p, err)
		}
	}
	ex := Selector{Labels: map[string]string{"region": "eu"}, Exclude: []string{"p1", "p3"}}
	for range 10 {
		if p, err := rot.Pick(ex); err != nil || p.ID != "p2" {
			t.Fatalf("eu excluding p1, p3 picked %+v, %v", p, err)
		}
	}
	ex.Exclude = append(ex.Exclude, "p2")
	_, err := rot.Pick(ex)
	if !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), "region:eu") || !strings.Contains(err.Error(), "p2") {
		t.Fatalf("eu excluding all of eu: %v", err)
	}
	if _, err := rot.PickSession("k", Selector{Labels: map[string]string{"region": "mars"}}); !errors.Is(err, ErrEmpty) {
		t.Fatalf("region=mars: %v", err)
	}
	all := map[string]bool{}
	for range 70 {
		p, _ := rot.Pick(Selector{})
		all[p.ID] = true
	}
	if len(all) != 7 || !all["p7"] {
		t.Fatalf("no selector picked %v (p7, with no labels, must be among them)", all)
	}
	// A label change moves a proxy between sets.
	r.event("p1", "h1", map[string]string{"region": "us", "tier": "1"})
	poll.Until(t, "p1 in us", bound, func() bool { p, _ := rot.Get("p1"); return p.Labels["region"] == "us" })
	for range 10 {
		if p, _ := rot.Pick(eu); p.ID == "p1" {
			t.Fatal("p1 picked for eu after moving to us")
		}
	}
}

// TestReport: Report publishes the report on the proxy's subject and cools
// the proxy down here: picks pass it over while another matches, and take
// it when it is the only one, until the cooldown ends.
func TestReport(t *testing.T) {
	r := newRig(t, true)
	var mu sync.Mutex
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg := config(t)
	cfg.Reporter = "gw-test"
	cfg.Cooldown = 10 * time.Second
	cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	rot := r.follow(cfg)
	ps := r.fleet(rot, 2, nil)

	sub, err := r.nc.SubscribeSync(subj.ReportAll())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	reason := strings.Repeat("é", 200) // 400 bytes
	if err := rot.Report(ps[0], reason); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(bound)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "proxy.report.p1" {
		t.Fatalf("report on %s", msg.Subject)
	}
	var rep messages.Report
	dec := json.NewDecoder(strings.NewReader(string(msg.Data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	want := messages.Report{V: 1, ID: "p1", Addr: ps[0].Addr, Reason: strings.Repeat("é", 128), By: "gw-test", At: now}
	if rep != want {
		t.Fatalf("report\n%+v, want\n%+v", rep, want)
	}

	for range 20 {
		if p, _ := rot.Pick(Selector{}); p.ID != "p2" {
			t.Fatalf("picked %s in its cooldown while p2 matches", p.ID)
		}
		if p, _ := rot.PickSession(fmt.Sprint(time.Now().UnixNano()), Selector{}); p.ID != "p2" {
			t.Fatalf("session picked %s in its cooldown while p2 matches", p.ID)
		}
	}
	only := Selector{Exclude: []string{"p2"}}
	if p, err := rot.Pick(only); err != nil || p.ID != "p1" {
		t.Fatalf("the only match in its cooldown: %+v, %v", p, err)
	}
	if p, err := rot.PickSession("k", only); err != nil || p.ID != "p1" {
		t.Fatalf("session: the only match in its cooldown: %+v, %v", p, err)
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	got := map[string]bool{}
	for range 4 {
		p, _ := rot.Pick(Selector{})
		got[p.ID] = true
	}
	if !got["p1"] {
		t.Fatalf("p1 not picked after its cooldown: %v", got)
	}
	if err := rot.Report(Proxy{ID: "Bad.ID"}, "x"); err == nil {
		t.Fatal("report of an invalid id: no error")
	}
	if st := rot.Stats(); st.Reports != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGapReadsAgain: a message that does not follow the version held (one
// was lost) makes the follower read the rotation again, which brings what
// the lost one carried.
func TestGapReadsAgain(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 2, nil)
	r.dropNext()
	r.put("p3", "127.0.0.1:1003") // lost
	r.put("p4", "127.0.0.1:1004")
	poll.Until(t, "p3 and p4 after reading again", bound, func() bool { return rot.Len() == 4 })
	if _, ok := rot.Get("p3"); !ok || rot.Stats().Restarts != 1 {
		t.Fatalf("after the gap: p3 %v, stats %+v", ok, rot.Stats())
	}
	r.del("p1")
	poll.Until(t, "p1 out: the feed followed again", bound, func() bool { return rot.Len() == 3 })
	if rot.Stats().Restarts != 1 {
		t.Fatalf("stats %+v", rot.Stats())
	}
}

// TestResetReadsAgain: a new publisher's first message follows no
// version; the follower reads the rotation again, which may differ from
// the old publisher's in ways no message said.
func TestResetReadsAgain(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 2, nil)
	// The new publisher has p2 elsewhere, and says so in no message.
	r.mu.Lock()
	r.addrs["p2"] = "127.0.0.1:2002"
	r.sent["p2"], _ = r.entryLocked("p2")
	r.mu.Unlock()
	r.resetNext()
	r.put("p3", "127.0.0.1:1003")
	poll.Until(t, "p2's new address after reading again", bound, func() bool {
		p, _ := rot.Get("p2")
		return p.Addr == "127.0.0.1:2002" && rot.Len() == 3
	})
	if st := rot.Stats(); st.Restarts != 1 || st.Version != r.version {
		t.Fatalf("stats %+v, publisher at %d", st, r.version)
	}
}

// TestLostLastMessageFound: a lost message that no other follows is found
// by a look at the publisher's version after the feed is silent for
// CheckInterval: the follower reads the rotation again.
func TestLostLastMessageFound(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 2, nil)
	r.dropNext()
	r.put("p3", "127.0.0.1:1003")
	poll.Until(t, "p3 found by a look", bound, func() bool { return rot.Len() == 3 })
	if st := rot.Stats(); st.Restarts != 1 || st.Version != r.version {
		t.Fatalf("stats %+v, publisher at %d", st, r.version)
	}
}

// TestBadMessageIgnored: a message of the feed that does not decode is
// ignored; the next one applies.
func TestBadMessageIgnored(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 1, nil)
	if err := r.nc.Publish(subj.RotationChanges(), []byte(`{"v":1,"version":"x"}`)); err != nil {
		t.Fatal(err)
	}
	r.put("p2", "127.0.0.1:1002")
	poll.Until(t, "p2", bound, func() bool { return rot.Len() == 2 })
	if st := rot.Stats(); st.Restarts != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRunEndsWithClosedConnection: a closed connection keeps Run from
// following: it returns an error.
func TestRunEndsWithClosedConnection(t *testing.T) {
	r := newRig(t, true)
	nc, _ := r.srv.Connect(t)
	rot, err := New(nc, config(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rot.Run(context.Background()) }()
	<-rot.Ready()
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("Run with its connection closed: %v", err)
		}
	case <-time.After(bound):
		t.Fatal("Run still running on a closed connection")
	}
}

func TestNewRefuses(t *testing.T) {
	r := newRig(t, false)
	if _, err := New(nil, Config{}); err == nil {
		t.Error("no connection: no error")
	}
	if _, err := New(r.nc, Config{Strategy: "fastest"}); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Errorf("unknown strategy: %v", err)
	}
	if _, err := New(r.nc, Config{Subjects: messages.Subjects{Prefix: "a..b"}}); err == nil {
		t.Error("bad prefix: no error")
	}
}

func TestCut(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{{"abc", 5, "abc"}, {"abcdef", 3, "abc"}, {"aé", 2, "a"}, {"aé", 3, "aé"}} {
		if got := cut(c.in, c.n); got != c.want {
			t.Errorf("cut(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// TestReadOnce: Read returns the whole rotation, read over several pages,
// exactly at the publisher's version, sorted by id, with each entry whole;
// with no publisher it says no one answers.
func TestReadOnce(t *testing.T) {
	r := newRig(t, true)
	r.pageMax = 3
	const n = 10
	for i := range n {
		id := fmt.Sprintf("p%02d", i)
		r.put(id, fmt.Sprintf("127.0.0.1:%d", 2000+i))
		r.event(id, "h1", map[string]string{"tier": fmt.Sprint(i % 2)})
	}
	r.check("p03", "127.0.0.1:2003", "203.0.113.3")
	r.del("p09")
	rot, err := Read(ctxFor(t, bound), r.nc, subj)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	version, sent := r.version, maps.Clone(r.sent)
	r.mu.Unlock()
	if rot.Version != version || len(rot.Proxies) != len(sent) {
		t.Fatalf("read %d proxies at version %d, the publisher has %d at %d", len(rot.Proxies), rot.Version, len(sent), version)
	}
	for i, e := range rot.Proxies {
		if i > 0 && rot.Proxies[i-1].ID >= e.ID {
			t.Errorf("not sorted: %s before %s", rot.Proxies[i-1].ID, e.ID)
		}
		if !reflect.DeepEqual(e, sent[e.ID]) {
			t.Errorf("%s: %+v, the publisher has %+v", e.ID, e, sent[e.ID])
		}
	}

	none := newRig(t, false)
	if _, err := Read(ctxFor(t, bound), none.nc, subj); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("no publisher: %v, want ErrNoResponders", err)
	}
}
