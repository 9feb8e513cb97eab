package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
	"proxyfleet/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bound is how long a test waits for what it asserts: a bound for hangs,
// not a timing assertion.
const bound = 15 * time.Second

var subj = messages.NewSubjects("")

// rig is an embedded nats-server with the topology set up, and an admin
// connection that plays health and the workers.
type rig struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newRig(t *testing.T, setup bool) *rig {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	r := &rig{t: t, srv: srv, nc: nc, js: js}
	if setup {
		r.setup()
	}
	return r
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// setup creates every stream and bucket, as proxyfleet setup does.
func (r *rig) setup() {
	r.t.Helper()
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctxFor(r.t, bound), r.js); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) kv(bucket string) jetstream.KeyValue {
	r.t.Helper()
	kv, err := r.js.KeyValue(ctxFor(r.t, bound), bucket)
	if err != nil {
		r.t.Fatal(err)
	}
	return kv
}

// put puts id in the rotation at addr, as health does.
func (r *rig) put(id, addr string) {
	r.t.Helper()
	if _, err := r.kv(messages.BucketRotation).Put(ctxFor(r.t, bound), id, []byte(addr)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) del(id string) {
	r.t.Helper()
	if err := r.kv(messages.BucketRotation).Delete(ctxFor(r.t, bound), id); err != nil {
		r.t.Fatal(err)
	}
}

// event publishes a running event of id on host with labels, as a worker
// does.
func (r *rig) event(id, host string, labels map[string]string) {
	r.t.Helper()
	body, _ := json.Marshal(messages.StateEvent{
		V: 1, ID: id, State: messages.StateRunning, Host: host, IP: "198.18.100.1", Port: 3128,
		Source: messages.SourceLease, Seq: 1, At: time.Now().UTC(), Labels: labels,
	})
	if _, err := r.js.Publish(ctxFor(r.t, bound), subj.State(id), body); err != nil {
		r.t.Fatal(err)
	}
}

// check writes health's check record of id.
func (r *rig) check(id, addr, egress string) {
	r.t.Helper()
	body, _ := json.Marshal(messages.CheckRecord{V: 1, ID: id, Addr: addr, Egress: egress, Verdict: messages.VerdictOK, At: time.Now().UTC()})
	if _, err := r.kv(messages.BucketChecks).Put(ctxFor(r.t, bound), id, body); err != nil {
		r.t.Fatal(err)
	}
}

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

// TestFollowsSources: a proxy put in PROXY_ROTATION appears; its event's
// host and labels show, and its check's egress when the address matches;
// a change closes the Changed channel; a delete removes it.
func TestFollowsSources(t *testing.T) {
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

	r.check("p1", "198.18.100.9:3128", "203.0.113.9") // another address: not p1's egress
	r.check("p2", "198.18.100.2:3128", "203.0.113.2") // not in the rotation
	time.Sleep(300 * time.Millisecond)                // nothing to wait for: it must not show
	if p, _ := rot.Get("p1"); p.Egress != "" {
		t.Fatalf("egress of a check of another address: %+v", p)
	}
	r.check("p1", "198.18.100.1:3128", "203.0.113.7")
	poll.Until(t, "p1's egress", bound, func() bool { p, _ := rot.Get("p1"); return p.Egress == "203.0.113.7" })

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

// TestReadyAfterCatchUp: Follow returns with everything already in the
// sources read (no proxy without its labels or egress); with the buckets
// missing at start, Ready waits for them.
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

func TestReadyWaitsForMissingTopology(t *testing.T) {
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
		t.Fatal("ready without any stream or bucket")
	case <-time.After(time.Second):
	}
	r.setup()
	r.put("p1", "198.18.100.1:3128")
	select {
	case <-rot.Ready():
	case <-time.After(bound):
		t.Fatal("not ready once the topology exists")
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
		t.Fatalf("Follow without a topology: %v, want the deadline", err)
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
	r.put("p7", "127.0.0.1:1007") // no event: labels unknown
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
		t.Fatalf("no selector picked %v (p7, labels unknown, must be among them)", all)
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

// TestEventsStreamRecreated: PROXY_EVENTS deleted and created anew is
// noticed, its consumer made anew, the new stream's events read, and what
// the new stream does not have dropped; membership stays throughout.
func TestEventsStreamRecreated(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 2, func(i int) map[string]string { return map[string]string{"gen": "old"} })

	if err := r.js.DeleteStream(ctxFor(t, bound), messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the events source to break", bound, func() bool { return rot.Stats().Restarts >= 1 })
	if rot.Len() != 2 {
		t.Fatalf("membership lost with the events stream: %d", rot.Len())
	}
	if _, err := rot.Pick(Selector{}); err != nil {
		t.Fatalf("pick while events are gone: %v", err)
	}
	r.setup()
	r.event("p1", "h2", map[string]string{"gen": "new"})
	poll.Until(t, "p1's event from the new stream, p2's old one dropped", bound, func() bool {
		p1, _ := rot.Get("p1")
		p2, _ := rot.Get("p2")
		return p1.Host == "h2" && p1.Labels["gen"] == "new" && p2.Host == "" && p2.Labels == nil
	})
	if rot.Len() != 2 {
		t.Fatalf("membership after the events stream came back: %d", rot.Len())
	}
	// New events keep flowing.
	r.event("p2", "h3", nil)
	poll.Until(t, "p2's new event", bound, func() bool { p, _ := rot.Get("p2"); return p.Host == "h3" })
}

// TestEventsConsumerDeleted: the ordered consumer deleted on the server is
// made anew.
func TestEventsConsumerDeleted(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 1, nil)
	st, err := r.js.Stream(ctxFor(t, bound), messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctxFor(t, bound))
	n := 0
	for name := range names.Name() {
		if err := st.DeleteConsumer(ctxFor(t, bound), name); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no consumer on PROXY_EVENTS")
	}
	r.event("p1", "h9", nil)
	poll.Until(t, "p1's event after its consumer was deleted", bound, func() bool { p, _ := rot.Get("p1"); return p.Host == "h9" })
}

// TestRotationBucketRecreated: PROXY_ROTATION deleted keeps the membership
// known; created anew, what it holds is the rotation.
func TestRotationBucketRecreated(t *testing.T) {
	r := newRig(t, true)
	rot := r.follow(config(t))
	r.fleet(rot, 2, nil)
	if err := r.js.DeleteKeyValue(ctxFor(t, bound), messages.BucketRotation); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the rotation source to break", bound, func() bool { return rot.Stats().Restarts >= 1 })
	time.Sleep(300 * time.Millisecond) // a few looks at a missing bucket
	if rot.Len() != 2 {
		t.Fatalf("membership while the bucket is missing: %d", rot.Len())
	}
	r.setup()
	r.put("p2", "127.0.0.1:2002")
	poll.Until(t, "the new bucket's rotation", bound, func() bool {
		ps := rot.Proxies()
		return len(ps) == 1 && ps[0].ID == "p2" && ps[0].Addr == "127.0.0.1:2002" && ps[0].Host == "h1"
	})
}

// TestKVWatcherStops: a KV watcher whose updates channel closes (the
// subscription ended under it) is made anew, and reads every key again.
func TestKVWatcherStops(t *testing.T) {
	r := newRig(t, true)
	cfg := config(t)
	rot, err := New(r.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	watchers := make(chan jetstream.KeyWatcher, 16)
	rot.watchHook = func(bucket string, w jetstream.KeyWatcher) {
		if bucket == messages.BucketRotation {
			watchers <- w
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rot.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	<-rot.Ready()
	r.fleet(rot, 2, nil)
	w := <-watchers
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the watcher made anew", bound, func() bool { return rot.Stats().Restarts == 1 })
	select {
	case <-watchers:
	case <-time.After(bound):
		t.Fatal("no new watcher")
	}
	r.del("p1")
	r.put("p3", "127.0.0.1:1003")
	poll.Until(t, "changes seen by the new watcher", bound, func() bool {
		_, p1 := rot.Get("p1")
		_, p3 := rot.Get("p3")
		return !p1 && p3 && rot.Len() == 2
	})
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
