package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

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
