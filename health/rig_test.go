package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
