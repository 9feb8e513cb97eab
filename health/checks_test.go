package health_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// logCapture keeps every log line of a test (and passes it to t.Log).
type logCapture struct {
	t  *testing.T
	mu sync.Mutex
	b  bytes.Buffer
}

func captureLog(t *testing.T) (*slog.Logger, *logCapture) {
	c := &logCapture{t: t}
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug})), c
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.b.Write(p)
	c.mu.Unlock()
	c.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// wireCapture keeps every message published on the server (a core
// subscription to everything: JetStream's API, KV puts, the rotation).
type wireCapture struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (r *rig) captureWire() *wireCapture {
	r.t.Helper()
	w := &wireCapture{}
	sub, err := r.nc.Subscribe(">", func(m *nats.Msg) {
		w.mu.Lock()
		w.msgs = append(w.msgs, m)
		w.mu.Unlock()
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { sub.Unsubscribe() })
	return w
}

// holding returns the subjects of the messages that hold s, and how many
// messages went to subjects starting with prefix.
func (w *wireCapture) holding(s, prefix string) (subjects []string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if strings.HasPrefix(m.Subject, prefix) {
			n++
		}
		if bytes.Contains(m.Data, []byte(s)) || strings.Contains(fmt.Sprint(m.Header), s) {
			subjects = append(subjects, m.Subject)
		}
	}
	return subjects, n
}

// noSecret fails if the fleet's password, or its encoding on the wire,
// is in s.
func noSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range []string{fleetPassword, fleetToken} {
		if strings.Contains(s, secret) {
			t.Errorf("%s holds the credentials (%q)", what, secret)
		}
	}
}

// checkedConfig probes through real proxies to health's own /probe, with
// the fleet's credentials.
func checkedConfig(logger *slog.Logger, openEvery time.Duration) health.Config {
	return health.Config{
		ProbeListen: "127.0.0.1:0", ProxyUser: fleetUser, ProxyPassword: fleetPassword,
		Interval: 150 * time.Millisecond, Timeout: 120 * time.Millisecond, Rise: 2, Fall: 3,
		LeaseTTL: time.Second, OpenCheckInterval: openEvery, Logger: logger,
	}
}

func runningThrough(id string, seq uint64, p *authProxy) messages.StateEvent {
	ip, port := p.ipPort()
	return runningAt(id, seq, ip, port)
}

// checks reads PROXY_CHECKS.
func (r *rig) checks() map[string]messages.CheckRecord {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketChecks)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]messages.CheckRecord{}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			r.t.Fatal(err)
		}
		var rec messages.CheckRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			r.t.Fatalf("record %s: %v in %q", k, err, e.Value())
		}
		out[k] = rec
	}
	return out
}

// verdicts is what PROXY_CHECKS holds, as id -> verdict.
func (r *rig) verdicts() map[string]string {
	out := map[string]string{}
	for id, rec := range r.checks() {
		out[id] = rec.Verdict
	}
	return out
}

func (r *rig) waitVerdicts(want map[string]string) map[string]messages.CheckRecord {
	r.t.Helper()
	waitFor(r.t, fmt.Sprintf("%s %v", messages.BucketChecks, want), func() bool { return reflect.DeepEqual(r.verdicts(), want) })
	return r.checks()
}

// rounds waits until each proxy has received n more requests: n more
// rounds of probes (each probe of a refused proxy sends two).
func rounds(t *testing.T, n int64, ps ...*authProxy) {
	t.Helper()
	start := make([]int64, len(ps))
	for i, p := range ps {
		start[i] = p.requests.Load()
	}
	waitFor(t, fmt.Sprintf("%d more probes of each proxy", n), func() bool {
		for i, p := range ps {
			if p.requests.Load() < start[i]+n {
				return false
			}
		}
		return true
	})
}

// Health probes with the fleet's credentials: a proxy that requires them
// enters, with its egress in the snapshot and in PROXY_CHECKS. An open
// proxy, one that adds X-Forwarded-For with the client's address and one
// that forwards the credentials never enter, round after round, and their
// records say why. A proxy in the rotation that becomes open leaves
// within the open check interval; fixed, it comes back. The password is in
// no log line, no message on the server, and nothing served.
func TestChecksThroughRealProxies(t *testing.T) {
	r := newRig(t)
	wire := r.captureWire()
	logger, logs := captureLog(t)
	const openEvery = 500 * time.Millisecond
	good, open, xff, fwd := startAuthProxy(t), startAuthProxy(t), startAuthProxy(t), startAuthProxy(t)
	open.open.Store(true)
	xff.xff.Store(true)
	fwd.forwardAuth.Store(true)
	h := r.start(checkedConfig(logger, openEvery))
	r.publish(runningThrough("good", 1, good), runningThrough("open", 1, open), runningThrough("xff", 1, xff), runningThrough("fwd", 1, fwd),
		event("sim1", 1, messages.StateRunning, "198.18.100.1")) // the sim driver's: enters on its event

	want := map[string]string{"good": good.addr(), "sim1": "198.18.100.1:3128"}
	snap := r.waitSnapshot(want)
	r.waitBucket(want)
	for _, e := range append(snap.Proxies, getRotation(t, h).Proxies...) {
		if (e.ID == "good" && e.Egress != "127.0.0.1") || (e.ID == "sim1" && e.Egress != "") {
			t.Fatalf("entry %+v: want the egress of the probed proxy only", e)
		}
	}
	recs := r.waitVerdicts(map[string]string{"good": "ok", "open": "open", "xff": "leaky", "fwd": "leaky"})
	if g := recs["good"]; g.V != messages.Version || g.ID != "good" || g.Addr != good.addr() || g.Egress != "127.0.0.1" || g.Reason != "" || g.At.IsZero() {
		t.Fatalf("good's record %+v", g)
	}
	for id, reason := range map[string]string{
		"open": health.ReasonOpen,
		"xff":  "leaky: X-Forwarded-For carries the client's address",
		"fwd":  "leaky: Proxy-Authorization reached the target (the proxy forwarded the fleet's credentials)",
	} {
		if recs[id].Reason != reason || recs[id].Egress != "127.0.0.1" {
			t.Errorf("%s's record %+v, want reason %q", id, recs[id], reason)
		}
	}

	// Round after round, the refused ones stay out (and are probed at the
	// rounds' cadence, not in a loop).
	rounds(t, 6, open, xff, fwd)
	if got := addrs(getRotation(t, h).Proxies); !reflect.DeepEqual(got, want) {
		t.Fatalf("rotation %v after more rounds, want %v", got, want)
	}
	r.waitBucket(want)
	for _, s := range r.snapshots() {
		for _, e := range s.Proxies {
			if e.ID != "good" && e.ID != "sim1" {
				t.Fatalf("snapshot version %d holds %s", s.Version, e.ID)
			}
		}
	}

	code, body := get(t, "http://"+h.Addr()+"/checks")
	var served []messages.CheckRecord
	if code != 200 || json.Unmarshal([]byte(body), &served) != nil || len(served) != 4 || served[0].ID != "fwd" || served[3].ID != "xff" {
		t.Fatalf("GET /checks = %d %s", code, body)
	}
	m := h.Metrics()
	if m.Refused["open"] != 1 || m.Refused["leaky"] != 2 || m.Refusals["open"] != 1 || m.Refusals["leaky"] != 2 ||
		m.OpenChecks[health.OpenRefused] == 0 || m.OpenChecks[health.OpenAnswered] == 0 || m.ProbeKinds[health.KindHTTP] == 0 {
		t.Fatalf("metrics %+v", m)
	}

	// good turns open: out within the open check interval (plus a
	// round), and its record says so.
	flipped := time.Now()
	good.open.Store(true)
	delete(want, "good")
	r.waitSnapshot(want)
	if d := time.Since(flipped); d > openEvery+time.Second {
		t.Errorf("an open proxy left %v after it turned open, with open checks every %v", d, openEvery)
	}
	r.waitVerdicts(map[string]string{"good": "open", "open": "open", "xff": "leaky", "fwd": "leaky"})
	// Fixed: back. So is xff, once it stops adding the header.
	good.open.Store(false)
	xff.xff.Store(false)
	want["good"], want["xff"] = good.addr(), xff.addr()
	r.waitSnapshot(want)
	r.waitBucket(want)
	r.waitVerdicts(map[string]string{"good": "ok", "open": "open", "xff": "ok", "fwd": "leaky"})
	checkVersionsIncrease(t, r.snapshots())

	_, metrics := get(t, "http://"+h.Addr()+"/metrics")
	for _, line := range []string{
		`proxyfleet_health_refused{verdict="open"} 1`, `proxyfleet_health_refused{verdict="leaky"} 1`,
		`proxyfleet_health_refusals_total{verdict="open"} 2`, `proxyfleet_health_refusals_total{verdict="leaky"} 2`,
		`proxyfleet_open_checks_total{result="open"}`, `proxyfleet_open_checks_total{result="refused"}`,
		`proxyfleet_open_checks_total{result="inconclusive"}`, `proxyfleet_probes_by_kind_total{kind="http"}`,
		`proxyfleet_probes_by_kind_total{kind="tcp"} 0`, "proxyfleet_health_probing 1",
	} {
		if !containsLine(metrics, line) {
			t.Errorf("metrics lack %q", line)
		}
	}

	// The credentials went to the proxies (good saw them) and nowhere else.
	if _, auths := good.seen(); !slicesContain(auths, "Basic "+fleetToken) {
		t.Fatal("the proxy never saw the credentials: this test shows nothing")
	}
	noSecret(t, "the log", logs.String())
	if !strings.Contains(logs.String(), "proxy refused") {
		t.Error("no log line of a refused proxy")
	}
	_, checks := get(t, "http://"+h.Addr()+"/checks")
	_, rot := get(t, "http://"+h.Addr()+"/rotation")
	noSecret(t, "GET /metrics", metrics)
	noSecret(t, "GET /checks", checks)
	noSecret(t, "GET /rotation", rot)
	subjects, kvPuts := wire.holding(fleetPassword, "$KV."+messages.BucketChecks+".")
	tokens, _ := wire.holding(fleetToken, "")
	if len(subjects)+len(tokens) != 0 {
		t.Errorf("messages holding the credentials, on %v %v", subjects, tokens)
	}
	if kvPuts == 0 {
		t.Error("the capture saw no write of " + messages.BucketChecks + ": it shows nothing")
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checksWatch counts the puts and deletes of PROXY_CHECKS.
type checksWatch struct {
	mu         sync.Mutex
	puts, dels map[string]int
}

func (r *rig) watchChecks() *checksWatch {
	r.t.Helper()
	kv, err := r.js.KeyValue(context.Background(), messages.BucketChecks)
	if err != nil {
		r.t.Fatal(err)
	}
	w, err := kv.WatchAll(context.Background(), jetstream.UpdatesOnly())
	if err != nil {
		r.t.Fatal(err)
	}
	cw := &checksWatch{puts: map[string]int{}, dels: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			cw.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				cw.puts[e.Key()]++
			} else {
				cw.dels[e.Key()]++
			}
			cw.mu.Unlock()
		}
	}()
	r.t.Cleanup(func() { w.Stop(); <-done })
	return cw
}

func (cw *checksWatch) counts() (puts, dels map[string]int) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return maps.Clone(cw.puts), maps.Clone(cw.dels)
}

// PROXY_CHECKS is written when a record changes, not on every probe; a
// standby writes nothing; a record goes when its proxy stops being a
// candidate and follows a new address; a process that takes the lease over
// rewrites what differs in the bucket.
func TestChecksWritesFollowChanges(t *testing.T) {
	r := newRig(t)
	watch := r.watchChecks()
	a, b := startAuthProxy(t), startAuthProxy(t)
	_, js1 := r.srv.Connect(t)
	_, js2 := r.srv.Connect(t)
	h1 := r.startWith(js1, checkedConfig(testLogger(t), 300*time.Millisecond))
	waitFor(t, "the first process to hold the lease", h1.Holder)
	h2 := r.startWith(js2, checkedConfig(testLogger(t), 300*time.Millisecond))

	r.publish(runningThrough("p1", 1, a), runningThrough("p2", 1, b))
	r.waitVerdicts(map[string]string{"p1": "ok", "p2": "ok"})
	waitFor(t, "the standby to have the same records", func() bool { recs, _ := h2.Checks(); return len(recs) == 2 })
	// Many rounds (open checks included, every 300ms) by two processes:
	// still one write per record.
	rounds(t, 10, a, b)
	if puts, dels := watch.counts(); !reflect.DeepEqual(puts, map[string]int{"p1": 1, "p2": 1}) || len(dels) != 0 {
		t.Fatalf("writes of %s over many probes: puts %v, deletes %v", messages.BucketChecks, puts, dels)
	}

	// p1 moves to b's address: its record follows; p2 is deleted: its
	// record goes.
	r.publish(runningThrough("p1", 2, b), leaseEvent("p2", 2, messages.StateDeleted, ""))
	waitFor(t, "p1's record at its new address, p2's gone", func() bool {
		recs := r.checks()
		return len(recs) == 1 && recs["p1"].Addr == b.addr()
	})

	// The bucket is tampered with behind the holder's back; the standby
	// takes over when the holder stops and rewrites what differs.
	kv, err := r.js.KeyValue(context.Background(), messages.BucketChecks)
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := json.Marshal(messages.CheckRecord{V: 1, ID: "p1", Addr: b.addr(), Verdict: "open", Reason: "stale"})
	if _, err := kv.Put(context.Background(), "p1", stale); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(context.Background(), "gone", `{"v":1,"id":"gone","addr":"198.18.1.1:3128","verdict":"ok"}`); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(h1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby to take over", h2.Holder)
	waitFor(t, "the new holder to reconcile "+messages.BucketChecks, func() bool {
		recs := r.checks()
		return len(recs) == 1 && recs["p1"].Verdict == "ok" && recs["p1"].Reason == ""
	})
}

// PROXY_CHECKS deleted: health says so (/readyz, the metric) and keeps
// the rotation going; created again, the holder writes its records again.
func TestChecksBucketMissing(t *testing.T) {
	r := newRig(t)
	px := startAuthProxy(t)
	cfg := checkedConfig(testLogger(t), time.Minute)
	cfg.CheckInterval = 100 * time.Millisecond
	h := r.start(cfg)
	r.publish(runningThrough("p1", 1, px))
	r.waitVerdicts(map[string]string{"p1": "ok"})

	ctx := context.Background()
	if err := r.js.DeleteKeyValue(ctx, messages.BucketChecks); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz to name "+messages.BucketChecks, func() bool {
		code, body := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, messages.BucketChecks)
	})
	if m := h.Metrics(); m.Missing != 1 {
		t.Fatalf("metrics %+v, want 1 missing", m)
	}
	// The rotation still follows.
	r.publish(event("sim1", 1, messages.StateRunning, "198.18.100.1"))
	r.waitBucket(map[string]string{"p1": px.addr(), "sim1": "198.18.100.1:3128"})

	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	r.waitVerdicts(map[string]string{"p1": "ok"})
	waitFor(t, "/readyz to recover", func() bool {
		code, _ := get(t, "http://"+h.Addr()+"/readyz")
		return code == http.StatusOK
	})
}
