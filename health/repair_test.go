package health_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/faultproxy"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// repairBound is a generous bound for a repair that should take seconds.
const repairBound = 30 * time.Second

// errorLog is a logger for a health process that passes everything to the
// test's log and keeps the error-level lines for assertions.
type errorLog struct {
	mu    sync.Mutex
	lines []string
}

type errorLogHandler struct {
	slog.Handler
	log   *errorLog
	attrs []slog.Attr
}

func (h errorLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		var b strings.Builder
		b.WriteString(r.Message)
		for _, a := range h.attrs {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		}
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		h.log.mu.Lock()
		h.log.lines = append(h.log.lines, b.String())
		h.log.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h errorLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return errorLogHandler{Handler: h.Handler.WithAttrs(as), log: h.log, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h errorLogHandler) WithGroup(name string) slog.Handler {
	return errorLogHandler{Handler: h.Handler.WithGroup(name), log: h.log, attrs: h.attrs}
}

func newErrorLog(t *testing.T) (*errorLog, *slog.Logger) {
	l := &errorLog{}
	return l, slog.New(errorLogHandler{Handler: testLogger(t).Handler(), log: l})
}

// has reports whether an error-level line holds every one of words.
func (l *errorLog) has(words ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, w := range words {
			if !strings.Contains(line, w) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// metric reads one unlabelled value of h's /metrics, or -1 if it is not there.
func metric(t *testing.T, h *health.Health, name string) float64 {
	t.Helper()
	code, body := get(t, "http://"+h.Addr()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return v
		}
	}
	return -1
}

const repairsMetric = "proxyfleet_health_consumer_repairs_total"

// consumers lists the names of the consumers of PROXY_EVENTS.
func consumers(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	l := s.ConsumerNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// Someone deletes health's consumer of PROXY_EVENTS: health makes a new
// one within seconds, says so at error level, counts it, and the rotation
// follows the events published since.
func TestDeletedConsumerIsRepaired(t *testing.T) {
	r := newRig(t)
	errs, logger := newErrorLog(t)
	h := r.start(health.Config{Logger: logger})
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"), event("p2", 1, messages.StateRunning, "198.18.100.2"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"})

	names := consumers(t, r.js)
	if len(names) != 1 {
		t.Fatalf("consumers of %s: %v, want health's one", messages.StreamEvents, names)
	}
	deleted := time.Now()
	if err := r.js.DeleteConsumer(context.Background(), messages.StreamEvents, names[0]); err != nil {
		t.Fatal(err)
	}
	r.publish(event("p3", 1, messages.StateRunning, "198.18.100.3"), event("p1", 2, messages.StateFailed, ""))
	want := map[string]string{"p2": "198.18.100.2:3128", "p3": "198.18.100.3:3128"}
	poll.Until(t, fmt.Sprintf("the rotation %v after the consumer was deleted", want), repairBound, func() bool {
		rot, _ := h.Rotation()
		return maps.Equal(addrs(rot.Proxies), want)
	})
	followed := time.Since(deleted)
	poll.Until(t, "a consumer repair counted", repairBound, func() bool { return metric(t, h, repairsMetric) >= 1 })
	t.Logf("consumer deleted: repair counted after %v, rotation followed after %v",
		time.Since(deleted).Round(time.Millisecond), followed.Round(time.Millisecond))
	r.waitBucket(want)
	if !errs.has("consumer", messages.StreamEvents) {
		t.Errorf("no error-level log of the repair; errors: %q", errs.lines)
	}
	if now := consumers(t, r.js); len(now) != 1 || now[0] == names[0] {
		t.Errorf("consumers after the repair: %v, want one new one (the deleted one was %s)", now, names[0])
	}
	// It keeps following.
	r.publish(event("p2", 2, messages.StateDeleted, ""))
	r.waitBucket(map[string]string{"p3": "198.18.100.3:3128"})
}

// The consumer is deleted while health's connection is cut off, so the
// word that it was deleted never reaches it: missing heartbeats, then a
// look at the consumer, find it gone, and health makes a new one.
func TestSilentlyDeletedConsumerIsRepaired(t *testing.T) {
	r := newRig(t)
	fp, err := faultproxy.New(faultproxy.Config{Target: strings.TrimPrefix(r.srv.ClientURL(), "nats://")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fp.Close() })
	nc, err := nats.Connect("nats://"+fp.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	errs, logger := newErrorLog(t)
	h := r.startWith(js, health.Config{Logger: logger, CheckInterval: 200 * time.Millisecond})
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	names := consumers(t, r.js)
	if len(names) != 1 {
		t.Fatalf("consumers: %v", names)
	}

	fp.Stall()
	if err := r.js.DeleteConsumer(context.Background(), messages.StreamEvents, names[0]); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	fp.Reset() // what was on its way to health is lost
	r.publish(event("p2", 1, messages.StateRunning, "198.18.100.2"))
	want := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"}
	poll.Until(t, fmt.Sprintf("the rotation %v", want), repairBound, func() bool {
		rot, _ := h.Rotation()
		return maps.Equal(addrs(rot.Proxies), want)
	})
	t.Logf("consumer deleted unheard: rotation followed after %v", time.Since(deleted).Round(time.Millisecond))
	if metric(t, h, repairsMetric) < 1 {
		t.Error("no consumer repair counted")
	}
	if !errs.has("consumer", messages.StreamEvents) {
		t.Errorf("no error-level log of the repair; errors: %q", errs.lines)
	}
}

// PROXY_EVENTS is deleted while health runs and created anew (its
// sequences start again from 1): health says the stream is gone at error
// level, keeps the rotation it has, and once the stream is back follows
// the events published in it.
func TestRecreatedStreamIsFollowed(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	errs, logger := newErrorLog(t)
	h := r.start(health.Config{Logger: logger})
	want := map[string]string{}
	for i := 1; i <= 5; i++ {
		id, ip := fmt.Sprintf("p%d", i), fmt.Sprintf("198.18.100.%d", i)
		r.publish(event(id, 3, messages.StateRunning, ip))
		want[id] = ip + ":3128"
	}
	r.waitBucket(want)

	if err := r.js.DeleteStream(ctx, messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "an error-level log that the stream is gone", repairBound, func() bool {
		return errs.has(messages.StreamEvents, "gone")
	})
	waitFor(t, "/readyz to name the missing stream", func() bool {
		code, body := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, messages.StreamEvents)
	})
	if rot, _ := h.Rotation(); !maps.Equal(addrs(rot.Proxies), want) {
		t.Fatalf("the rotation changed when the stream went: %v", addrs(rot.Proxies))
	}

	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// Stream sequences start again; the events' own seqs go on.
	r.publish(event("q1", 1, messages.StateRunning, "198.18.100.11"), event("p1", 4, messages.StateFailed, ""))
	delete(want, "p1")
	want["q1"] = "198.18.100.11:3128"
	poll.Until(t, fmt.Sprintf("the rotation %v from the new stream", want), repairBound, func() bool {
		rot, _ := h.Rotation()
		return maps.Equal(addrs(rot.Proxies), want)
	})
	t.Logf("stream created anew: followed after %v", time.Since(back).Round(time.Millisecond))
	r.waitBucket(want)
	if metric(t, h, repairsMetric) < 1 {
		t.Errorf("no consumer repair counted")
	}
	waitFor(t, "/readyz to recover", func() bool {
		code, _ := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusOK
	})
}

// The leases bucket is deleted while health holds the lease and created
// anew: health says it is gone at error level, takes the lease again and
// carries on publishing.
func TestRecreatedLeaseBucket(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	errs, logger := newErrorLog(t)
	h := r.start(health.Config{Logger: logger, LeaseTTL: time.Second})
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	if err := r.js.DeleteKeyValue(ctx, messages.BucketLeases); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "an error-level log that the leases bucket is gone", repairBound, func() bool {
		return errs.has(messages.BucketLeases, "gone")
	})
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	r.publish(event("p2", 1, messages.StateRunning, "198.18.100.2"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"})
	if !h.Holder() {
		t.Fatal("not holding the lease after the bucket came back")
	}
	checkVersionsIncrease(t, r.snapshots())
}

// Health needs no right to create streams or buckets: started before they
// exist, it says at error level which one is missing, waits, and starts
// once a set-up step has made them.
func TestStartWaitsForTheTopology(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	errs, logger := newErrorLog(t)
	h, err := health.New(js, health.Config{Subjects: subj, HTTPAddr: "127.0.0.1:0", Logger: logger,
		RetryInterval: 50 * time.Millisecond, CatchUpPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Run without the stream and buckets starts, and waits for them.
	runtest.Start(t, h.Run, h.Started(), 10*time.Second)
	for _, name := range []string{messages.StreamEvents, messages.BucketRotation, messages.BucketLeases} {
		poll.Until(t, "an error-level log naming "+name, repairBound, func() bool { return errs.has(name) })
	}
	code, body := get(t, "http://"+h.Addr()+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, messages.StreamEvents) {
		t.Fatalf("GET /readyz while waiting = %d %q, want 503 naming %s", code, body, messages.StreamEvents)
	}

	r := &rig{t: t, srv: srv, nc: nc, js: js}
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	if r.kv, err = js.KeyValue(ctx, messages.BucketRotation); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.CaughtUp():
	case <-time.After(repairBound):
		t.Fatal("health did not catch up once the topology was there")
	}
	r.publish(event("p1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	waitFor(t, "/readyz ok", func() bool {
		code, _ := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusOK
	})
}

// A lease longer than the bucket keeps its keys disagrees with the server:
// refused at start, naming the difference.
func TestStartRefusesALeaseLongerThanTheBucketTTL(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamEvents, Subjects: []string{subj.StateAll()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRotation}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketLeases, TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h, err := health.New(js, health.Config{HTTPAddr: "127.0.0.1:0", Logger: testLogger(t), LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	err = runtest.Go(t, h.Run).Wait(10 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "lease ttl") {
		t.Fatalf("Run with a lease longer than the bucket's TTL: %v", err)
	}
	select {
	case <-h.Started():
		t.Fatal("Started closed by a Run that refused to start")
	default:
	}
}
