package rotation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// The tests of this file follow real health processes, fed the running
// events of sim proxies (which health admits on their event, unprobed).

// healthRig is an embedded nats-server with the topology set up, and
// health processes on connections of their own.
type healthRig struct {
	t   *testing.T
	srv *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newHealthRig(t *testing.T) *healthRig {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctxFor(t, bound), js); err != nil {
		t.Fatal(err)
	}
	return &healthRig{t: t, srv: srv, nc: nc, js: js}
}

// start runs a health process until the test ends (or stop).
func (hr *healthRig) start(cfg health.Config) (*health.Health, *runtest.Running) {
	hr.t.Helper()
	_, js := hr.srv.Connect(hr.t)
	cfg.Subjects = subj
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := health.New(js, cfg)
	if err != nil {
		hr.t.Fatal(err)
	}
	return h, runtest.Start(hr.t, h.Run, h.Started(), bound)
}

func simEvent(id, ip string, seq uint64, labels map[string]string) []byte {
	b, _ := json.Marshal(messages.StateEvent{V: 1, ID: id, State: messages.StateRunning, Host: "h" + id[len(id)-1:],
		IP: ip, Port: 3128, Source: messages.SourceSim, Seq: seq, At: time.Now().UTC(), Labels: labels})
	return b
}

// running publishes the running events of the proxies ids[i] at
// 198.18.x.y, n at a time in flight.
func (hr *healthRig) running(ids []string, seq uint64, labels func(i int) map[string]string) {
	hr.t.Helper()
	const inflight = 500
	for i := 0; i < len(ids); i += inflight {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(len(ids), i+inflight); j++ {
			var l map[string]string
			if labels != nil {
				l = labels(j)
			}
			f, err := hr.js.PublishAsync(subj.State(ids[j]), simEvent(ids[j], fmt.Sprintf("198.18.%d.%d", j/250, j%250+1), seq, l))
			if err != nil {
				hr.t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				hr.t.Fatal(err)
			}
		}
	}
}

// httpRotation reads GET /rotation of h.
func httpRotation(t *testing.T, h *health.Health) messages.Rotation {
	t.Helper()
	resp, err := http.Get("http://" + h.Addr() + "/rotation")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rot messages.Rotation
	if err := json.NewDecoder(resp.Body).Decode(&rot); err != nil {
		t.Fatal(err)
	}
	return rot
}

// bucket reads PROXY_ROTATION whole.
func (hr *healthRig) bucket() map[string]string {
	hr.t.Helper()
	kv, err := hr.js.KeyValue(ctxFor(hr.t, bound), messages.BucketRotation)
	if err != nil {
		hr.t.Fatal(err)
	}
	w, err := kv.WatchAll(ctxFor(hr.t, bound), jetstream.IgnoreDeletes())
	if err != nil {
		hr.t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			return out
		}
		out[e.Key()] = string(e.Value())
	}
	hr.t.Fatal("the bucket's watcher ended")
	return nil
}

func proxyAddrs(ps []Proxy) map[string]string {
	out := make(map[string]string, len(ps))
	for _, p := range ps {
		out[p.ID] = p.Addr
	}
	return out
}

func entryAddrs(es []messages.RotationEntry) map[string]string {
	out := make(map[string]string, len(es))
	for _, e := range es {
		out[e.ID] = e.Addr
	}
	return out
}

// TestFollowsHealth: the follower holds what a health process publishes
// (hosts and labels included); when another takes over, its first
// message follows no version, the follower reads the rotation again, and
// follows the new publisher from there.
func TestFollowsHealth(t *testing.T) {
	hr := newHealthRig(t)
	h1, run1 := hr.start(health.Config{LeaseTTL: time.Second})
	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("p%02d", i))
	}
	hr.running(ids, 1, func(i int) map[string]string { return map[string]string{"n": fmt.Sprint(i % 3)} })
	rot := (&rig{t: t, srv: hr.srv}).follow(config(t))
	poll.Until(t, "20 proxies with their hosts and labels", bound, func() bool {
		ps := rot.Proxies()
		return len(ps) == 20 && ps[19].Host == "h9" && ps[19].Labels["n"] == "1"
	})
	h2, _ := hr.start(health.Config{LeaseTTL: time.Second})
	if err := run1.Stop(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "h2 to publish", bound, func() bool { return h2.Metrics().FeedResets > 0 })
	hr.running([]string{"p20"}, 1, nil)
	poll.Until(t, "p20 from h2, after reading the rotation again", bound, func() bool {
		_, ok := rot.Get("p20")
		return ok && rot.Stats().Restarts >= 1
	})
	if got, want := proxyAddrs(rot.Proxies()), entryAddrs(httpRotation(t, h2).Proxies); !maps.Equal(got, want) {
		t.Fatalf("follower %v, h2 %v", got, want)
	}
	_ = h1
}

// syncLog keeps a health process's log lines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestFollowsAtScale: 15,000 sim proxies through a health process on a
// server with the default max_payload (1 MiB). A follower that starts in
// the middle of the burst holds exactly the rotation once it settles: the
// same ids and addresses as PROXY_ROTATION and GET /rotation. No message
// of the feed or page exceeds 64 KiB, a change costs the feed well under
// 1 KiB, and the snapshot subject, which the rotation has outgrown, says
// so (a notice: truncated, the size, the feed), as do health's metrics
// and one error line of its log.
func TestFollowsAtScale(t *testing.T) {
	const n = 15000
	began := time.Now()
	hr := newHealthRig(t)
	logs := &syncLog{}
	// A prober (never used: sim proxies are not probed), so that health
	// has no reason to warn about probing by TCP connect only.
	h, _ := hr.start(health.Config{Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Prober: health.ProberFunc(func(context.Context, string) error { return nil })})
	var (
		mu      sync.Mutex
		notice  messages.Rotation
		largest int
	)
	snaps, err := hr.nc.Subscribe(subj.Rotation(), func(m *nats.Msg) {
		var r messages.Rotation
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("snapshot: %v", err)
			return
		}
		mu.Lock()
		if r.Truncated {
			notice = r
		}
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = snaps.Unsubscribe() }()
	feed, err := hr.nc.Subscribe(subj.RotationChanges(), func(m *nats.Msg) {
		mu.Lock()
		largest = max(largest, len(m.Data))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = feed.Unsubscribe() }()
	if err := hr.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("proxy-%05d", i)
	}
	labels := func(i int) map[string]string { return map[string]string{"pool": fmt.Sprint(i % 8)} }
	hr.running(ids[:n/2], 1, labels)
	// The follower starts while the second half streams in.
	started := make(chan *Rotation, 1)
	go func() {
		nc, _ := hr.srv.Connect(t)
		rot, err := Follow(ctxFor(t, 2*time.Minute), nc, Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Error(err)
		}
		started <- rot
	}()
	hr.running(ids[n/2:], 1, func(i int) map[string]string { return labels(i + n/2) })
	rot := <-started
	if rot == nil {
		t.FailNow()
	}
	defer func() { _ = rot.Close() }()
	readAt := rot.Stats().Version

	// Settled: every proxy published, and the follower at the version
	// health published last.
	if !poll.WaitEvery(2*time.Minute, 100*time.Millisecond, func() bool {
		m := h.Metrics()
		return m.FeedChanges >= n && rot.Stats().Version == m.RotationVersion && rot.Len() == n
	}) {
		t.Fatalf("not settled: health %+v; follower %d proxies at version %d", h.Metrics().FeedChanges, rot.Len(), rot.Stats().Version)
	}
	got := proxyAddrs(rot.Proxies())
	if bucket := hr.bucket(); !maps.Equal(got, bucket) {
		t.Fatalf("follower %d proxies, PROXY_ROTATION %d: they differ", len(got), len(bucket))
	}
	if served := entryAddrs(httpRotation(t, h).Proxies); !maps.Equal(got, served) {
		t.Fatalf("follower %d proxies, GET /rotation %d: they differ", len(got), len(served))
	}
	for _, p := range rot.Proxies()[:10] {
		if p.Host == "" || p.Labels["pool"] == "" {
			t.Fatalf("a proxy without its host or labels: %+v", p)
		}
	}

	m := h.Metrics()
	poll.Until(t, "the notice of the last version on "+subj.Rotation(), bound, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return notice.Version == h.Metrics().RotationVersion
	})
	mu.Lock()
	defer mu.Unlock()
	if notice.Size != n || notice.Proxies != nil || notice.Feed != subj.RotationChanges() || notice.Bytes <= 1<<20 {
		t.Fatalf("notice on %s: %+v", subj.Rotation(), notice)
	}
	if !m.SnapshotTooLarge || m.SnapshotsTooLarge == 0 || m.SnapshotBytes <= 1<<20 {
		t.Fatalf("health's metrics of the snapshot: too large %v, notices %d, bytes %d", m.SnapshotTooLarge, m.SnapshotsTooLarge, m.SnapshotBytes)
	}
	out := logs.String()
	if c := strings.Count(out, "level=ERROR"); c != 1 || !strings.Contains(out, "no longer fits in one snapshot") {
		t.Fatalf("%d error lines, want the one saying the snapshot does not fit:\n%s", c, tail(out))
	}
	if c := strings.Count(out, "level=WARN"); c != 0 {
		t.Fatalf("%d warnings:\n%s", c, tail(out))
	}
	if largest > messages.MaxBodySize {
		t.Fatalf("a feed message of %d bytes", largest)
	}
	if per := float64(m.FeedBytes) / float64(m.FeedChanges); per > 1024 {
		t.Fatalf("%.0f bytes of feed per change", per)
	}
	t.Logf("%d proxies in %s; %d feed messages (largest %d bytes, %.0f bytes per change); the follower read the rotation at version %d of %d, and again %d times",
		n, time.Since(began).Round(time.Millisecond), m.Published, largest, float64(m.FeedBytes)/float64(m.FeedChanges),
		readAt, m.RotationVersion, rot.Stats().Restarts)
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
