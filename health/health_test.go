package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var subj = messages.NewSubjects("")

type rig struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue

	runs map[*health.Health]*runtest.Running // of start and startWith

	mu    sync.Mutex
	snaps []messages.Rotation
}

// newRig starts a server, creates the topology as a worker would, and
// records every snapshot published on proxy.rotation.
func newRig(t *testing.T) *rig {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, srv: srv, nc: nc, js: js, kv: kv}
	sub, err := nc.Subscribe(subj.Rotation(), func(m *nats.Msg) {
		var rot messages.Rotation
		decode := messages.Decode
		if len(m.Data) > messages.MaxBodySize {
			decode = json.Unmarshal // a snapshot may be as large as the server takes
		}
		if err := decode(m.Data, &rot); err != nil {
			t.Errorf("snapshot: %v", err)
			return
		}
		r.mu.Lock()
		r.snaps = append(r.snaps, rot)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return r
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// start runs a health process until the test ends and waits for its catch-up.
func (r *rig) start(cfg health.Config) *health.Health {
	r.t.Helper()
	return r.startWith(r.js, cfg)
}

// startWith is start on the given JetStream context (its own connection).
func (r *rig) startWith(js jetstream.JetStream, cfg health.Config) *health.Health {
	r.t.Helper()
	cfg.Subjects = subj
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(r.t)
	}
	if cfg.CatchUpPoll == 0 {
		cfg.CatchUpPoll = 50 * time.Millisecond
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 50 * time.Millisecond
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = 10 * time.Millisecond
	}
	h, err := health.New(js, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	if r.runs == nil {
		r.runs = map[*health.Health]*runtest.Running{}
	}
	r.runs[h] = runtest.Start(r.t, h.Run, h.Started(), 10*time.Second)
	select {
	case <-h.CaughtUp():
	case <-time.After(10 * time.Second):
		r.t.Fatal("health did not catch up within 10s")
	}
	return h
}

// stop stops h, started by start or startWith, and returns what its Run
// returned.
func (r *rig) stop(h *health.Health) error {
	r.t.Helper()
	return r.runs[h].Stop()
}

func event(id string, seq uint64, state, ip string) messages.StateEvent {
	e := messages.StateEvent{V: 1, ID: id, State: state, Host: "h1", IP: ip, Source: messages.SourceSim, Seq: seq, At: time.Now().UTC()}
	if ip != "" {
		e.Port = 3128
	}
	return e
}

// leaseEvent is event with the source of a real VM (a DHCP lease): a
// proxy health probes, unlike the sim driver's, which enter on their
// event.
func leaseEvent(id string, seq uint64, state, ip string) messages.StateEvent {
	e := event(id, seq, state, ip)
	e.Source = messages.SourceLease
	return e
}

func (r *rig) publish(evs ...messages.StateEvent) {
	r.t.Helper()
	for _, ev := range evs {
		b, err := json.Marshal(ev)
		if err != nil {
			r.t.Fatal(err)
		}
		r.publishRaw(subj.State(ev.ID), b)
	}
}

// publishFolded publishes events one at a time, each once h has folded the
// one before.
func (r *rig) publishFolded(h *health.Health, evs ...messages.StateEvent) {
	r.t.Helper()
	for _, ev := range evs {
		n := h.Metrics().Events
		r.publish(ev)
		waitFor(r.t, fmt.Sprintf("%s seq %d folded", ev.ID, ev.Seq), func() bool { return h.Metrics().Events > n })
	}
}

func (r *rig) publishRaw(subject string, body []byte) {
	r.t.Helper()
	if _, err := r.js.Publish(context.Background(), subject, body); err != nil {
		r.t.Fatalf("publish %s: %v", subject, err)
	}
}

// bucket reads PROXY_ROTATION.
func (r *rig) bucket() map[string]string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]string{}
	keys, err := r.kv.ListKeys(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := r.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			r.t.Fatal(err)
		}
		out[k] = string(e.Value())
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, what, 10*time.Second, cond)
}

func (r *rig) waitBucket(want map[string]string) {
	r.t.Helper()
	var got map[string]string
	waitFor(r.t, fmt.Sprintf("bucket %v", want), func() bool {
		got = r.bucket()
		return reflect.DeepEqual(got, want)
	})
}

func (r *rig) snapshots() []messages.Rotation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]messages.Rotation(nil), r.snaps...)
}

// waitSnapshot waits for a published snapshot with exactly these addrs by id.
func (r *rig) waitSnapshot(want map[string]string) messages.Rotation {
	r.t.Helper()
	var last messages.Rotation
	waitFor(r.t, fmt.Sprintf("snapshot %v", want), func() bool {
		s := r.snapshots()
		if len(s) == 0 {
			return false
		}
		last = s[len(s)-1]
		return reflect.DeepEqual(addrs(last.Proxies), want)
	})
	return last
}

func addrs(es []messages.RotationEntry) map[string]string {
	out := map[string]string{}
	for _, e := range es {
		out[e.ID] = e.Addr
	}
	return out
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func getRotation(t *testing.T, h *health.Health) messages.Rotation {
	t.Helper()
	code, body := get(t, "http://"+h.Addr()+"/rotation")
	if code != http.StatusOK {
		t.Fatalf("GET /rotation = %d %q", code, body)
	}
	var rot messages.Rotation
	if err := messages.Decode([]byte(body), &rot); err != nil {
		t.Fatalf("GET /rotation: %v in %q", err, body)
	}
	return rot
}

func checkVersionsIncrease(t *testing.T, snaps []messages.Rotation) {
	t.Helper()
	for i := 1; i < len(snaps); i++ {
		if snaps[i].Version <= snaps[i-1].Version {
			t.Fatalf("snapshot versions %d then %d", snaps[i-1].Version, snaps[i].Version)
		}
	}
}

func TestRotationFollowsEvents(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})

	// Caught up on an empty stream: one empty snapshot. Its version is
	// the revision of the lease write that allowed it (a small number).
	first := r.waitSnapshot(map[string]string{})
	if first.V != 1 || first.Version == 0 || first.Version > 10 || first.Proxies == nil {
		t.Fatalf("first snapshot = %+v, want v1, a version from the lease, proxies []", first)
	}
	if code, body := get(t, "http://"+h.Addr()+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("GET /readyz = %d %q", code, body)
	}

	// One event at a time, each folded before the next is published: the
	// stream keeps only the latest event of a proxy, so events published
	// back to back may be collapsed before the consumer sees them.
	r.publishFolded(h,
		event("p1", 1, messages.StateProvisioning, ""),
		event("p2", 1, messages.StateProvisioning, ""),
		event("p1", 2, messages.StateRunning, "198.18.100.1"),
		event("p2", 2, messages.StateRunning, "198.18.100.2"),
	)
	want := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"}
	r.waitBucket(want)
	r.waitSnapshot(want)
	if got := addrs(getRotation(t, h).Proxies); !reflect.DeepEqual(got, want) {
		t.Fatalf("GET /rotation = %v, want %v", got, want)
	}

	// A new IP moves p1.
	r.publishFolded(h, event("p1", 3, messages.StateRunning, "198.18.100.11"))
	want = map[string]string{"p1": "198.18.100.11:3128", "p2": "198.18.100.2:3128"}
	r.waitBucket(want)
	r.waitSnapshot(want)

	// deleting then deleted: p2's key goes.
	r.publishFolded(h, event("p2", 3, messages.StateDeleting, "198.18.100.2"), event("p2", 4, messages.StateDeleted, ""))
	want = map[string]string{"p1": "198.18.100.11:3128"}
	r.waitBucket(want)
	r.waitSnapshot(want)
	if _, err := r.kv.Get(context.Background(), "p2"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("p2 in the bucket: err = %v", err)
	}

	// A late, older running of p2 and a failed p1 with a stale seq: ignored.
	before := h.Metrics()
	r.publishFolded(h, event("p2", 2, messages.StateRunning, "198.18.100.2"), event("p1", 3, messages.StateFailed, ""))
	m := h.Metrics()
	if m.Ignored != before.Ignored+2 || m.Changes != before.Changes || m.RotationSize != 1 {
		t.Fatalf("metrics after stale events = %+v (before %+v)", m, before)
	}

	// failed removes p1.
	r.publishFolded(h, event("p1", 4, messages.StateFailed, ""))
	last := r.waitSnapshot(map[string]string{})
	r.waitBucket(map[string]string{})
	if got := getRotation(t, h); got.Version != last.Version || len(got.Proxies) != 0 {
		t.Fatalf("GET /rotation = %+v, want version %d and no proxies", got, last.Version)
	}
	checkVersionsIncrease(t, r.snapshots())

	code, body := get(t, "http://"+h.Addr()+"/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	for _, line := range []string{
		"# TYPE proxyfleet_rotation_size gauge\nproxyfleet_rotation_size 0\n",
		"# TYPE proxyfleet_rotation_changes_total counter\nproxyfleet_rotation_changes_total 5\n",
		"# TYPE proxyfleet_events_total counter\nproxyfleet_events_total 10\n",
		"# TYPE proxyfleet_events_ignored_total counter\nproxyfleet_events_ignored_total 2\n",
	} {
		if !strings.Contains(body, line) {
			t.Errorf("metrics lack %q:\n%s", line, body)
		}
	}
}

func TestLateStartRebuildsTheSameRotation(t *testing.T) {
	r := newRig(t)
	want := map[string]string{}
	for i := range 40 {
		id := fmt.Sprintf("p%02d", i)
		ip := fmt.Sprintf("198.18.101.%d", i)
		r.publish(event(id, 1, messages.StateProvisioning, ""), event(id, 2, messages.StateRunning, ip))
		switch i % 4 {
		case 0:
			want[id] = ip + ":3128"
		case 1:
			r.publish(event(id, 3, messages.StateFailed, ""))
		case 2:
			r.publish(event(id, 3, messages.StateDeleting, ip), event(id, 4, messages.StateDeleted, ""))
		case 3:
			r.publish(event(id, 3, messages.StateRunning, "198.18.102.1"))
			want[id] = "198.18.102.1:3128"
		}
	}
	// A follower that saw everything live, and one that starts late.
	h1 := r.start(health.Config{})
	r.waitBucket(want)
	rot1 := getRotation(t, h1)
	if got := addrs(rot1.Proxies); !reflect.DeepEqual(got, want) {
		t.Fatalf("first process: %v, want %v", got, want)
	}
	if m := h1.Metrics(); m.Events != 40 {
		// Only the last event per proxy is delivered at start.
		t.Fatalf("first process folded %d events, want 40 (the last of each proxy)", m.Events)
	}

	h2 := r.start(health.Config{})
	rot2 := getRotation(t, h2)
	if !reflect.DeepEqual(rot1.Proxies, rot2.Proxies) {
		t.Fatalf("late process rotation differs:\n%+v\n%+v", rot1.Proxies, rot2.Proxies)
	}
	if code, _ := get(t, "http://"+h2.Addr()+"/readyz"); code != 200 {
		t.Fatalf("late process /readyz = %d", code)
	}
	// Both keep following.
	r.publish(event("p00", 3, messages.StateDeleted, ""))
	delete(want, "p00")
	r.waitBucket(want)
	for _, h := range []*health.Health{h1, h2} {
		waitFor(t, "both processes drop p00", func() bool {
			rot, _ := h.Rotation()
			return reflect.DeepEqual(addrs(rot.Proxies), want)
		})
	}
}

func TestStartReconcilesTheBucket(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	// Left over from an earlier process: a proxy gone since, a stale
	// address, and a key that is no proxy id.
	for k, v := range map[string]string{"gone": "198.18.109.9:3128", "p1": "198.18.100.99:3128", "_version": "7"} {
		if _, err := r.kv.PutString(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	r.publish(event("p1", 2, messages.StateRunning, "198.18.100.1"), event("p2", 2, messages.StateRunning, "198.18.100.2"))
	r.start(health.Config{})
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"})
}

// A process that starts with a bucket already right writes nothing to it:
// in particular it never deletes a key before its catch-up completes.
func TestStartDoesNotTouchACorrectBucket(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 100 {
		id, ip := fmt.Sprintf("p%03d", i), fmt.Sprintf("198.18.103.%d", i)
		r.publish(event(id, 1, messages.StateProvisioning, ""), event(id, 2, messages.StateRunning, ip))
		want[id] = ip + ":3128"
		if _, err := r.kv.PutString(ctx, id, ip+":3128"); err != nil {
			t.Fatal(err)
		}
	}
	w, err := r.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	h := r.start(health.Config{})
	r.waitSnapshot(want)
	if got := addrs(getRotation(t, h).Proxies); !reflect.DeepEqual(got, want) {
		t.Fatalf("rotation = %v", got)
	}
	// Publish a marker through another key's change and see that it is
	// the first write the process made.
	r.publish(event("p000", 3, messages.StateRunning, "198.18.104.1"))
	select {
	case e := <-w.Updates():
		if e == nil || e.Key() != "p000" || e.Operation() != jetstream.KeyValuePut || string(e.Value()) != "198.18.104.1:3128" {
			t.Fatalf("first write to the bucket = %v, want the put of p000", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no write to the bucket")
	}
}

func TestUndecodableEventsAreIgnored(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	r.publishRaw(subj.State("p1"), []byte("not json"))
	r.publishRaw(subj.State("p2"), []byte(`{"v":1,"id":"p3","state":"running","ip":"198.18.100.3","port":3128,"seq":1}`))
	r.publishRaw(subj.State("p4"), []byte(`{"v":2,"id":"p4","state":"running","ip":"198.18.100.4","port":3128,"seq":1}`))
	r.publishRaw("proxy.state.Bad_Id", []byte(`{"v":1,"id":"Bad_Id","state":"running","ip":"198.18.100.4","port":3128,"seq":1}`))
	// A field this build does not know is no reason to drop the event.
	r.publishRaw(subj.State("p6"), []byte(`{"v":1,"id":"p6","state":"running","ip":"198.18.100.6","port":3128,"source":"sim","seq":1,"zone":"a"}`))
	r.publish(event("p5", 1, messages.StateRunning, "198.18.100.5"))
	r.waitBucket(map[string]string{"p5": "198.18.100.5:3128", "p6": "198.18.100.6:3128"})
	if m := h.Metrics(); m.Events != 6 || m.Ignored != 4 || m.RotationSize != 2 {
		t.Fatalf("metrics = %+v, want 6 events, 4 ignored, 2 in rotation", m)
	}
}

func TestGraceKeepsThenDemotes(t *testing.T) {
	r := newRig(t)
	const grace = 300 * time.Millisecond
	h := r.start(health.Config{Grace: grace})
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"), event("p2", 1, messages.StateRunning, "198.18.100.2"))
	both := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"}
	r.waitBucket(both)

	// p1's guest agent restarts: it reports provisioning with no IP and
	// keeps its place; p2 is unaffected throughout.
	began := time.Now()
	r.publish(event("p1", 2, messages.StateProvisioning, ""))
	waitFor(t, "p1's event folded", func() bool { return h.Metrics().Events == 3 })
	if got := r.bucket(); !reflect.DeepEqual(got, both) && time.Since(began) < grace {
		t.Fatalf("in grace, bucket = %v, want %v", got, both)
	}
	if m := h.Metrics(); m.InGrace != 1 && time.Since(began) < grace {
		t.Fatalf("in grace, metrics = %+v, want 1 in grace", m)
	}
	r.waitBucket(map[string]string{"p2": "198.18.100.2:3128"})
	if d := time.Since(began); d < grace {
		t.Fatalf("p1 demoted after %v, before its grace of %v", d, grace)
	}

	// Back to running: in again.
	r.publish(event("p1", 3, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(both)
	r.waitSnapshot(both)

	// A restart that comes back within the grace never leaves. p3
	// restarts after it and does not come back: once p3 has left, p2's
	// grace, had it kept one, has ended too.
	all := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128", "p3": "198.18.100.3:3128"}
	r.publish(event("p3", 1, messages.StateRunning, "198.18.100.3"))
	r.waitBucket(all)
	r.waitSnapshot(all)
	n := len(r.snapshots())
	r.publishFolded(h, event("p2", 2, messages.StateProvisioning, ""), event("p2", 3, messages.StateRunning, "198.18.100.2"))
	r.publishFolded(h, event("p3", 2, messages.StateProvisioning, ""))
	r.waitBucket(both)
	r.waitSnapshot(both)
	if got := len(r.snapshots()) - n; got != 1 {
		t.Fatalf("%d snapshots published for p3 leaving, want 1: p2's restart within the grace published", got)
	}
	checkVersionsIncrease(t, r.snapshots())
}

func TestNotReadyBeforeCatchUp(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	h, err := health.New(js, health.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h.Handler())
	defer ts.Close()
	for _, path := range []string{"/readyz", "/rotation"} {
		if code, _ := get(t, ts.URL+path); code != http.StatusServiceUnavailable {
			t.Errorf("GET %s before Start = %d, want 503", path, code)
		}
	}
	// Alive all the same: a liveness probe must not restart it.
	if code, body := get(t, ts.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("GET /healthz before Start = %d %q, want 200 ok", code, body)
	}
	code, body := get(t, ts.URL+"/metrics")
	if code != 200 || !strings.Contains(body, "proxyfleet_health_caught_up 0\n") {
		t.Errorf("GET /metrics = %d %q", code, body)
	}
	resp, err := http.Post(ts.URL+"/rotation", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /rotation = %d, want 405", resp.StatusCode)
	}
}

func TestRunAgainFails(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	if err := r.stop(h); err != nil {
		t.Fatalf("Run stopped by its context: %v", err)
	}
	if err := r.stop(h); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := h.Run(context.Background()); err == nil {
		t.Fatal("a second Run succeeded")
	}
	if _, err := http.Get("http://" + h.Addr() + "/healthz"); err == nil {
		t.Fatal("HTTP still served after Run returned")
	}
}

func TestPublishFailureShowsAndRecovers(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	h := r.start(health.Config{})
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})

	// The bucket vanishes: publishing fails, /readyz says so.
	if err := r.js.DeleteKeyValue(ctx, messages.BucketRotation); err != nil {
		t.Fatal(err)
	}
	r.publish(event("p2", 1, messages.StateRunning, "198.18.100.2"))
	waitFor(t, "/readyz to fail", func() bool {
		code, body := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, messages.BucketRotation)
	})
	if h.Metrics().PublishErrors == 0 {
		t.Fatal("no publish error counted")
	}

	// It comes back (empty): the process reads it again and fills it.
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"}
	r.waitBucket(want)
	r.waitSnapshot(want)
	waitFor(t, "/readyz to recover", func() bool {
		code, _ := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusOK
	})
	checkVersionsIncrease(t, r.snapshots())
}

func TestNoHTTP(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{HTTPAddr: health.NoHTTP})
	if h.Addr() != "" {
		t.Fatalf("Addr = %q with NoHTTP", h.Addr())
	}
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	ts := httptest.NewServer(h.Handler())
	defer ts.Close()
	waitFor(t, "GET /rotation with p1", func() bool {
		code, body := get(t, ts.URL+"/rotation")
		return code == 200 && strings.Contains(body, `"addr":"198.18.100.1:3128"`)
	})
}

// Run with its context already done starts nothing and returns nil.
func TestRunStoppedBeforeItStarts(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	h, err := health.New(js, health.Config{HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Run(ctx); err != nil {
		t.Fatalf("Run with a done context: %v", err)
	}
}

// When no message will ever say it was the last one (here: the stream
// holds only messages outside the filter), the consumer's info does.
func TestCatchUpWithoutALastMessage(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamEvents, Subjects: []string{subj.StateAll(), "proxy.other.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRotation})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketLeases}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "proxy.other.x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, srv: srv, nc: nc, js: js, kv: kv}
	h := r.start(health.Config{}) // fails unless it catches up
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	if m := h.Metrics(); !m.CaughtUp || m.Events != 1 {
		t.Fatalf("metrics = %+v", m)
	}
}

// Events keep arriving while a process catches up: it still never deletes
// a key of a proxy that is in the rotation, and ends with everything.
func TestCatchUpUnderConcurrentEvents(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 300 {
		id, ip := fmt.Sprintf("p%03d", i), fmt.Sprintf("198.19.%d.%d", i/250, i%250+1)
		r.publish(event(id, 2, messages.StateRunning, ip))
		want[id] = ip + ":3128"
		if _, err := r.kv.PutString(ctx, id, ip+":3128"); err != nil {
			t.Fatal(err)
		}
	}
	w, err := r.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			id := fmt.Sprintf("q%03d", i)
			b, _ := json.Marshal(event(id, 1, messages.StateRunning, fmt.Sprintf("198.18.110.%d", i+1)))
			if _, err := r.js.Publish(ctx, subj.State(id), b); err != nil {
				t.Errorf("publish: %v", err)
				return
			}
		}
	}()
	h := r.start(health.Config{})
	<-done
	for i := range 100 {
		want[fmt.Sprintf("q%03d", i)] = fmt.Sprintf("198.18.110.%d:3128", i+1)
	}
	r.waitBucket(want)
	if got := addrs(getRotation(t, h).Proxies); len(got) != len(want) {
		t.Fatalf("rotation has %d proxies, want %d", len(got), len(want))
	}
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut || e.Key()[0] != 'q' {
				t.Fatalf("write to the bucket: %s %s", e.Operation(), e.Key())
			}
			continue
		default:
		}
		break
	}
}

// A health process whose NATS connection is closed for good can neither
// hear events nor publish: its Run ends with that error once it has
// stopped, instead of serving a rotation that no longer changes.
func TestRunEndsWhenItsConnectionCloses(t *testing.T) {
	r := newRig(t)
	nc, js := r.srv.Connect(t)
	h := r.startWith(js, health.Config{CheckInterval: 50 * time.Millisecond})
	nc.Close()
	if err := r.runs[h].Wait(10 * time.Second); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Run after its connection closed = %v, want %v", err, nats.ErrConnectionClosed)
	}
	if _, err := http.Get("http://" + h.Addr() + "/healthz"); err == nil {
		t.Fatal("HTTP still served after Run returned")
	}
}
