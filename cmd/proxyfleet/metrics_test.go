package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"proxyfleet/client"
	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
)

// roles is serve (embedded nats-server, a worker and health), a worker
// and a health process, each run in this process as main runs them, on
// one sim host h1, each with its own HTTP listener.
type roles struct {
	dir, nats             string
	serve, worker, health string // their --http addresses
	logServe, logW, logH  *syncBuffer
}

func startRoles(t *testing.T) *roles {
	t.Helper()
	dir := t.TempDir()
	// h1 has an address plan, so the plan's gauges are exported.
	cfg := simServeConfigHost(t, dir, "", ", addresses: {ipv4: [198.18.101.0/28], ipv6: ['2001:db8:101::/64'], ipv6_per_proxy: 4}", `worker: {check_interval: 200ms, observe_interval: 300ms, sweep_grace: 1s, heartbeat: 250ms, liveness: 750ms, pinned_ttl: 2s, max_attempts: 2, backoff_initial: 50ms, backoff_max: 100ms}
health: {lease_ttl: 2s}
`)
	r := &roles{dir: dir, nats: freePort(t), serve: freePort(t), worker: freePort(t), health: freePort(t),
		logServe: &syncBuffer{}, logW: &syncBuffer{}, logH: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	var done []chan error
	run := func(f func() error) {
		ch := make(chan error, 1)
		done = append(done, ch)
		go func() { ch <- f() }()
	}
	t.Cleanup(func() {
		cancel()
		for _, ch := range done {
			select {
			case err := <-ch:
				if err != nil {
					t.Errorf("a role ended with %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("a role still runs 30s after it was stopped")
			}
		}
	})
	run(func() error {
		return serve(ctx, []string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", r.nats, "--http", r.serve}, io.Discard, r.logServe)
	})
	waitUntil(t, "serve to be ready", 30*time.Second, func() bool { return status(r.serve, "/readyz") == 200 })
	url := "nats://" + r.nats
	run(func() error {
		return runRole(ctx, workerSpec(), []string{"--config", cfg, "--nats-url", url, "--http", r.worker, "--id", "w2"}, io.Discard, r.logW)
	})
	run(func() error {
		return runRole(ctx, healthSpec(), []string{"--config", cfg, "--nats-url", url, "--http", r.health}, io.Discard, r.logH)
	})
	for _, a := range []string{r.worker, r.health} {
		waitUntil(t, a+" to be ready", 30*time.Second, func() bool { return status(a, "/readyz") == 200 })
	}
	return r
}

func status(addr, path string) int {
	code, _ := httpGet(addr, path)
	return code
}

func httpGet(addr, path string) (int, string) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape reads a role's /metrics and parses it with Prometheus's own
// text parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(addr, "/metrics")
	if code != 200 {
		t.Fatalf("GET %s/metrics = %d", addr, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s/metrics: %v\n%s", addr, err, body)
	}
	return mfs
}

// value sums the samples of name whose labels include want (a counter's
// or gauge's value, a histogram's count); -1 if there is none.
func value(mfs map[string]*dto.MetricFamily, name string, want ...string) float64 {
	mf, ok := mfs[name]
	if !ok {
		return -1
	}
	sum, found := 0.0, false
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	if !found {
		return -1
	}
	return sum
}

// Names each role exports.
var (
	processNames = []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes", "proxyfleet_build_info"}
	workerNames  = []string{
		"proxyfleet_commands_total", "proxyfleet_retries_total", "proxyfleet_dead_letters_total",
		"proxyfleet_work_in_flight", "proxyfleet_work_pending", "proxyfleet_host_proxies", "proxyfleet_host_max_proxies",
		"proxyfleet_host_quarantined", "proxyfleet_sweeps_total", "proxyfleet_swept_total", "proxyfleet_redrives_total",
		"proxyfleet_worker_consumer_repairs_total", "proxyfleet_worker_host_owned", "proxyfleet_worker_host_pulling",
		"proxyfleet_worker_ready", "proxyfleet_worker_stray_pins_released_total", "proxyfleet_worker_address_conflicts_total",
		"proxyfleet_host_addresses", "proxyfleet_host_record_writes_total", "proxyfleet_command_duration_seconds", "proxyfleet_create_running_seconds",
	}
	healthNames = []string{
		"proxyfleet_rotation_size", "proxyfleet_rotation_changes_total", "proxyfleet_rotation_entries_total",
		"proxyfleet_rotation_exits_total", "proxyfleet_events_total", "proxyfleet_rotation_published_total",
		"proxyfleet_rotation_publish_errors_total", "proxyfleet_health_lease_holder", "proxyfleet_health_ready",
		"proxyfleet_probes_total", "proxyfleet_probe_duration_seconds", "proxyfleet_rotation_admission_seconds",
	}
)

// Every role serves /metrics (parsed by Prometheus's parser), /healthz and
// /readyz on its --http listener; the metrics move with a create and a
// delete, a command that runs out of attempts, and the observation passes.
func TestRolesServeMetrics(t *testing.T) {
	r := startRoles(t)
	for _, role := range []struct {
		name, addr string
		want, not  []string
	}{
		{"serve", r.serve, append(append([]string{"proxyfleet_topology_repairs_total"}, workerNames...), healthNames...), nil},
		{"worker", r.worker, workerNames, healthNames},
		{"health", r.health, healthNames, workerNames},
	} {
		if code, body := httpGet(role.addr, "/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("%s GET /healthz = %d %q, want 200 ok", role.name, code, body)
		}
		if code, body := httpGet(role.addr, "/readyz"); code != 200 || body != "ok\n" {
			t.Errorf("%s GET /readyz = %d %q, want 200 ok", role.name, code, body)
		}
		mfs := scrape(t, role.addr)
		for _, n := range append(role.want, processNames...) {
			if _, ok := mfs[n]; !ok {
				t.Errorf("%s exports no %s", role.name, n)
			}
		}
		for _, n := range role.not {
			if _, ok := mfs[n]; ok {
				t.Errorf("%s exports %s, another role's", role.name, n)
			}
		}
		if v := value(mfs, "proxyfleet_build_info", "role", role.name); v != 1 {
			t.Errorf("%s proxyfleet_build_info{role=%q} = %v, want 1", role.name, role.name, v)
		}
		for _, n := range []string{"proxyfleet_host_max_proxies", "proxyfleet_work_in_flight", "proxyfleet_host_proxies", "proxyfleet_work_pending"} {
			if slicesContains(role.want, n) && value(mfs, n, "host", "h1") < 0 {
				t.Errorf("%s: no %s{host=\"h1\"}", role.name, n)
			}
		}
	}

	// Counters of both workers (serve's and w2) and of both health
	// processes (serve's and the health role's), summed.
	workers := func() []map[string]*dto.MetricFamily {
		return []map[string]*dto.MetricFamily{scrape(t, r.serve), scrape(t, r.worker)}
	}
	healths := func() []map[string]*dto.MetricFamily {
		return []map[string]*dto.MetricFamily{scrape(t, r.serve), scrape(t, r.health)}
	}
	sum := func(all []map[string]*dto.MetricFamily, name string, labels ...string) float64 {
		s := 0.0
		for _, mfs := range all {
			if v := value(mfs, name, labels...); v > 0 {
				s += v
			}
		}
		return s
	}
	w0, h0 := workers(), healths()

	nc, err := nats.Connect("nats://" + r.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := c.Create(ctx, messages.CreateCommand{ID: "m1"}, "", true)
	if err != nil || out.Final == nil || out.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("create m1 = %+v, %v", out, err)
	}
	waitUntil(t, "m1 to hold room on h1 and be in the rotation", 30*time.Second, func() bool {
		return sum(workers(), "proxyfleet_host_proxies", "host", "h1") >= 1 && sum(healths(), "proxyfleet_rotation_size") == 2
	})
	out, err = c.Delete(ctx, "m1", "", true)
	if err != nil || out.Final == nil || out.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("delete m1 = %+v, %v", out, err)
	}
	waitUntil(t, "m1's room to be free and m1 out of the rotation", 30*time.Second, func() bool {
		return sum(workers(), "proxyfleet_host_proxies", "host", "h1") == 0 && sum(healths(), "proxyfleet_rotation_size") == 0
	})
	// A create that fails transiently every time: retried, then
	// dead-lettered (max_attempts 2).
	if err := sim.InjectFault(filepath.Join(r.dir, "h1"), sim.Fault{Op: "create", ID: "m2", Class: fleet.ClassTransient, Count: -1}); err != nil {
		t.Fatal(err)
	}
	out, err = c.Create(ctx, messages.CreateCommand{ID: "m2"}, "", true)
	if err != nil || out.Final == nil || out.Final.Outcome != messages.OutcomeFailed {
		t.Fatalf("create m2 = %+v, %v; want failed", out, err)
	}

	moved := func(what string, before, after []map[string]*dto.MetricFamily, name string, min float64, labels ...string) {
		t.Helper()
		b, a := sum(before, name, labels...), sum(after, name, labels...)
		if a-b < min {
			t.Errorf("%s %s%v went from %v to %v, want +%v", what, name, labels, b, a, min)
		}
	}
	waitUntil(t, "sweep passes", 30*time.Second, func() bool {
		w := workers()
		return sum(w, "proxyfleet_sweeps_total", "kind", "domains") > sum(w0, "proxyfleet_sweeps_total", "kind", "domains") &&
			sum(w, "proxyfleet_sweeps_total", "kind", "volumes") > sum(w0, "proxyfleet_sweeps_total", "kind", "volumes")
	})
	w1, h1 := workers(), healths()
	for _, m := range []struct {
		name   string
		min    float64
		labels []string
	}{
		{"proxyfleet_commands_total", 2, []string{"op", "create", "outcome", "accepted"}},
		{"proxyfleet_commands_total", 1, []string{"op", "create", "outcome", "done"}},
		{"proxyfleet_commands_total", 1, []string{"op", "create", "outcome", "failed"}},
		{"proxyfleet_commands_total", 1, []string{"op", "delete", "outcome", "accepted"}},
		{"proxyfleet_commands_total", 1, []string{"op", "delete", "outcome", "done"}},
		{"proxyfleet_retries_total", 1, []string{"class", "transient", "stage", "work"}},
		{"proxyfleet_dead_letters_total", 1, []string{"class", "transient"}},
		// The latency histograms (their sample counts).
		{"proxyfleet_command_duration_seconds", 1, []string{"op", "create", "outcome", "done"}},
		{"proxyfleet_command_duration_seconds", 1, []string{"op", "create", "outcome", "failed"}},
		{"proxyfleet_command_duration_seconds", 1, []string{"op", "delete", "outcome", "done"}},
		{"proxyfleet_create_running_seconds", 1, nil},
	} {
		moved("workers'", w0, w1, m.name, m.min, m.labels...)
	}
	for _, m := range []struct {
		name string
		min  float64
	}{
		{"proxyfleet_events_total", 4}, // both health processes see create's and delete's events
		{"proxyfleet_rotation_entries_total", 2},
		{"proxyfleet_rotation_exits_total", 2},
		{"proxyfleet_rotation_changes_total", 2},
		{"proxyfleet_rotation_published_total", 2},
	} {
		moved("health processes'", h0, h1, m.name, m.min)
	}
	// m1's admission, timed by the publishing health process alone.
	if n := sum(h1, "proxyfleet_rotation_admission_seconds") - sum(h0, "proxyfleet_rotation_admission_seconds"); n != 1 {
		t.Errorf("%v admissions timed by the health processes, want 1 (m1's, by the lease holder)", n)
	}
	if n := sum(h1, "proxyfleet_health_lease_holder"); n != 1 {
		t.Errorf("%v lease holders, want 1", n)
	}
	if n := sum(w1, "proxyfleet_worker_host_owned", "host", "h1"); n != 1 {
		t.Errorf("h1 owned by %v workers, want 1", n)
	}
	if n := sum(w1, "proxyfleet_work_in_flight", "host", "h1"); n != 0 {
		t.Errorf("%v work items of h1 in flight once all is done, want 0", n)
	}
	if t.Failed() {
		t.Logf("serve log:\n%s", r.logServe.String())
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// A worker is not ready before it consumes, and says why.
func TestWorkerNotReadyWithoutTopology(t *testing.T) {
	dir := t.TempDir()
	cfg := simServeConfig(t, dir, "", "worker: {check_interval: 100ms}\n")
	srv := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	nats := freePort(t)
	served := make(chan error, 1)
	// The embedded server of serve would set the topology up; a worker
	// alone, on a bare server, waits for it.
	go func() {
		served <- serve(ctx, []string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", nats, "--http", freePort(t), "--repair=false"}, io.Discard, &logs)
	}()
	waitUntil(t, "the embedded server", 30*time.Second, func() bool { return strings.Contains(logs.String(), "embedded nats-server ready") })
	addr := srv
	var wlogs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runRole(ctx, workerSpec(), []string{"--config", cfg, "--nats-url", "nats://" + nats, "--http", addr, "--id", "w9"}, io.Discard, &wlogs)
	}()
	defer func() {
		cancel()
		<-done
		<-served
	}()
	waitUntil(t, "the worker's /healthz", 30*time.Second, func() bool { return status(addr, "/healthz") == 200 })
	code, body := httpGet(addr, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not started") {
		t.Fatalf("GET /readyz without streams = %d %q, want 503 saying it has not started", code, body)
	}
	mfs := scrape(t, addr)
	if v := value(mfs, "proxyfleet_worker_ready"); v != 0 {
		t.Fatalf("proxyfleet_worker_ready = %v, want 0", v)
	}
}

// `worker --pprof` and `gateway --pprof` add Go's profiles to the ops listener, which serves
// the rest as before; without it there are none.
func TestPprofOnlyWhenAsked(t *testing.T) {
	reg := newRegistry("worker")
	ready := func() error { return nil }
	for _, c := range []struct {
		h     http.Handler
		pprof int
	}{{roleOpsHandler(reg, ready, false), http.StatusNotFound}, {roleOpsHandler(reg, ready, true), http.StatusOK}} {
		for path, want := range map[string]int{"/debug/pprof/": c.pprof, "/debug/pprof/heap?debug=1": c.pprof, "/metrics": 200, "/readyz": 200} {
			rec := httptest.NewRecorder()
			c.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != want {
				t.Errorf("GET %s = %d, want %d", path, rec.Code, want)
			}
		}
	}
}

// The gateway role's ops listener serves /stats beside the rest; the
// other roles' do not.
func TestStatsOnTheGatewaysOpsListener(t *testing.T) {
	reg := newRegistry("gateway")
	ready := func() error { return nil }
	stats := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "stats") })
	for _, c := range []struct {
		h     http.Handler
		stats int
	}{{opsHandler(reg, ready), http.StatusNotFound}, {withStats(opsHandler(reg, ready), stats), http.StatusOK}} {
		for path, want := range map[string]int{"/stats": c.stats, "/metrics": 200, "/readyz": 200, "/healthz": 200} {
			rec := httptest.NewRecorder()
			c.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != want {
				t.Errorf("GET %s = %d, want %d", path, rec.Code, want)
			}
		}
	}
}
