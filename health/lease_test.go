package health_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// fakeProber passes or fails each address as the test says (default:
// pass) and counts its probes. No network.
type fakeProber struct {
	mu     sync.Mutex
	fail   map[string]bool
	probes map[string]int
}

func newFakeProber() *fakeProber {
	return &fakeProber{fail: map[string]bool{}, probes: map[string]int{}}
}

func (f *fakeProber) Probe(_ context.Context, addr string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probes[addr]++
	if f.fail[addr] {
		return fmt.Errorf("%s: connection refused", addr)
	}
	return nil
}

func (f *fakeProber) set(addr string, fail bool) {
	f.mu.Lock()
	f.fail[addr] = fail
	f.mu.Unlock()
}

func (f *fakeProber) count(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.probes[addr]
}

// fastProbing is a config that probes every 20ms, with a 1s lease.
func fastProbing(p health.Prober) health.Config {
	return health.Config{
		Prober: p, Interval: 20 * time.Millisecond, Timeout: 15 * time.Millisecond,
		Rise: 2, Fall: 3, LeaseTTL: time.Second,
	}
}

// countLooks makes cfg count the process's looks at the lease (each
// renewal, or each read of a standby): a test that must show the lease
// was not taken, or that a standby published nothing, waits for looks,
// not for time.
func countLooks(cfg health.Config) (health.Config, *atomic.Int64) {
	var n atomic.Int64
	return health.WithLeaseLooked(cfg, func() { n.Add(1) }), &n
}

// bucketWatch records every change of PROXY_ROTATION.
type bucketWatch struct {
	mu      sync.Mutex
	deletes []string
	puts    []string
}

func (r *rig) watchBucket() *bucketWatch {
	r.t.Helper()
	w, err := r.kv.WatchAll(context.Background(), jetstream.UpdatesOnly())
	if err != nil {
		r.t.Fatal(err)
	}
	bw := &bucketWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			bw.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				bw.puts = append(bw.puts, e.Key())
			} else {
				bw.deletes = append(bw.deletes, e.Key())
			}
			bw.mu.Unlock()
		}
	}()
	r.t.Cleanup(func() { w.Stop(); <-done })
	return bw
}

func (bw *bucketWatch) deleted() []string {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	return append([]string(nil), bw.deletes...)
}

// runningAt is a running event at addr ("ip:port").
func runningAt(id string, seq uint64, ip string, port int) messages.StateEvent {
	e := leaseEvent(id, seq, messages.StateRunning, ip)
	e.Port = port
	return e
}

// A health process that probes through a real forward proxy into its own
// probe target: a proxy enters after rise passing probes, leaves after
// fall failing ones and comes back; a proxy that answers the wrong thing,
// or an address where nothing listens, never enters.
func TestProbingThroughARealProxy(t *testing.T) {
	r := newRig(t)
	good := startProxy(t)
	captive := startProxy(t)
	captive.captive = "<html>sign in to the wifi</html>"
	deadProxy := startProxy(t)
	deadProxy.stop()
	dead := deadProxy.addr
	h := r.start(health.Config{
		ProbeListen: "127.0.0.1:0", Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond,
		Rise: 2, Fall: 3, LeaseTTL: time.Second,
	})
	if h.ProbeAddr() == "" {
		t.Fatal("no probe target served")
	}
	deadIP, deadPort := splitAddr(t, dead)
	r.publish(
		runningAt("good", 2, good.ip(), good.port()),
		runningAt("captive", 2, captive.ip(), captive.port()),
		runningAt("dead", 2, deadIP, deadPort),
	)
	want := map[string]string{"good": good.addr}
	r.waitBucket(want)
	r.waitSnapshot(want)
	m := h.Metrics()
	if m.Probes[health.ResultOK] < 2 || m.Probes[health.ResultBody] == 0 || m.Probes[health.ResultError] == 0 {
		t.Fatalf("probe outcomes %v", m.Probes)
	}
	if good.requests.Load() < 2 {
		t.Fatalf("the proxy forwarded %d probes", good.requests.Load())
	}
	// More rounds: the others still never enter.
	n := good.requests.Load()
	waitFor(t, "three more rounds", func() bool { return good.requests.Load() >= n+3 })
	if got := r.bucket(); len(got) != 1 {
		t.Fatalf("bucket %v, want only the good proxy", got)
	}

	// The proxy stops: out after fall failures. It restarts: back.
	good.stop()
	r.waitBucket(map[string]string{})
	r.waitSnapshot(map[string]string{})
	good.restart()
	r.waitBucket(want)
	r.waitSnapshot(want)
	m = h.Metrics()
	if m.Entries != 2 || m.Exits != 1 || !m.Holder || !m.Probing || m.Targets != 3 {
		t.Fatalf("metrics %+v", m)
	}
	checkVersionsIncrease(t, r.snapshots())

	code, body := get(t, "http://"+h.Addr()+"/metrics")
	for _, line := range []string{
		"proxyfleet_rotation_size 1",
		"proxyfleet_health_lease_holder 1",
		"proxyfleet_rotation_entries_total 2",
		"proxyfleet_rotation_exits_total 1",
		`proxyfleet_probes_total{result="ok"}`,
		`proxyfleet_probes_total{result="body"}`,
		`proxyfleet_probe_duration_seconds_bucket{le="+Inf"}`,
		"proxyfleet_probe_duration_seconds_count",
	} {
		if code != 200 || !containsLine(body, line) {
			t.Errorf("metrics lack %q:\n%s", line, body)
		}
	}
}

func containsLine(body, prefix string) bool {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

func splitAddr(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return host, n
}

// Rise then fall, with a prober that says what the test wants.
func TestRiseThenFall(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	h := r.start(fastProbing(p))
	p.set("198.18.100.1:3128", true)
	r.publish(leaseEvent("p1", 2, messages.StateRunning, "198.18.100.1"), leaseEvent("p2", 2, messages.StateRunning, "198.18.100.2"))
	want := map[string]string{"p2": "198.18.100.2:3128"}
	r.waitBucket(want)
	waitFor(t, "p1 probed a few times", func() bool { return p.count("198.18.100.1:3128") >= 5 })
	if got := r.bucket(); len(got) != 1 {
		t.Fatalf("a failing proxy entered: %v", got)
	}
	p.set("198.18.100.1:3128", false)
	want["p1"] = "198.18.100.1:3128"
	r.waitBucket(want)
	p.set("198.18.100.2:3128", true)
	delete(want, "p2")
	r.waitBucket(want)
	r.waitSnapshot(want)
	checkVersionsIncrease(t, r.snapshots())
	if m := h.Metrics(); m.Entries != 2 || m.Exits != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

// Two processes: the lease holder publishes, the other stands by (folds,
// probes, serves) and publishes nothing. The holder is killed (its
// connection dies; the lease is not released) or stopped (the lease is
// released): the other takes over. A watcher of the bucket and the
// subject sees no passing proxy removed and no version going back.
func TestTakeover(t *testing.T) {
	for _, kill := range []bool{true, false} {
		name := "stop"
		if kill {
			name = "kill"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			p := newFakeProber()
			watch := r.watchBucket()
			nc1, js1 := r.srv.Connect(t)
			_, js2 := r.srv.Connect(t)
			h1 := r.startWith(js1, fastProbing(p))
			waitFor(t, "the first process to hold the lease", h1.Holder)
			cfg2, looks := countLooks(fastProbing(p))
			h2 := r.startWith(js2, cfg2)

			want := map[string]string{}
			for i := range 5 {
				ip := fmt.Sprintf("198.18.100.%d", i+1)
				r.publish(leaseEvent(fmt.Sprintf("p%d", i), 2, messages.StateRunning, ip))
				want[fmt.Sprintf("p%d", i)] = ip + ":3128"
			}
			r.waitBucket(want)
			r.waitSnapshot(want)
			waitFor(t, "the standby to see the same", func() bool {
				rot, _ := h2.Rotation()
				return len(rot.Proxies) == len(want)
			})
			// The standby looks at the lease every third of its TTL:
			// four looks span a TTL, more than a standby that missed
			// the holder's renewals would wait before taking it.
			n := looks.Load()
			waitFor(t, "the standby to look at the lease 4 times", func() bool { return looks.Load() >= n+4 })
			if h2.Holder() || h2.Metrics().Published != 0 || h2.Metrics().Takeovers != 0 {
				t.Fatalf("the standby published: %+v", h2.Metrics())
			}
			if code, _ := get(t, "http://"+h2.Addr()+"/readyz"); code != 200 {
				t.Fatalf("standby /readyz = %d", code)
			}
			if p.count("198.18.100.1:3128") == 0 {
				t.Fatal("nobody probes")
			}
			lastH1 := h1.Metrics().RotationVersion

			start := time.Now()
			if kill {
				nc1.Close() // the process dies: nothing is released
			}
			_ = r.stop(h1)
			waitFor(t, "the standby to take over", h2.Holder)
			took := time.Since(start)
			// The last renewal came at most a third of the TTL before the kill.
			if kill && took < 600*time.Millisecond {
				t.Fatalf("took over after %v, before the lease's TTL", took)
			}
			if !kill && took > 900*time.Millisecond {
				t.Fatalf("took over after %v: a released lease should be taken at once", took)
			}
			// The new holder publishes, from a version above the old one's.
			r.publish(leaseEvent("p9", 2, messages.StateRunning, "198.18.100.9"))
			want["p9"] = "198.18.100.9:3128"
			r.waitBucket(want)
			snap := r.waitSnapshot(want)
			if snap.Version <= lastH1 {
				t.Fatalf("new holder's version %d, old holder's %d", snap.Version, lastH1)
			}
			checkVersionsIncrease(t, r.snapshots())
			checkNeverRemoved(t, r.snapshots(), want)
			if d := watch.deleted(); len(d) != 0 {
				t.Fatalf("keys deleted from %s: %v", messages.BucketRotation, d)
			}
			m := h2.Metrics()
			if m.Published == 0 || m.Takeovers != 1 {
				t.Fatalf("new holder metrics %+v", m)
			}
		})
	}
}

// checkNeverRemoved fails if a proxy of want, once in a snapshot, is
// missing from a later one.
func checkNeverRemoved(t *testing.T, snaps []messages.Rotation, want map[string]string) {
	t.Helper()
	seen := map[string]bool{}
	for _, s := range snaps {
		in := map[string]bool{}
		for _, e := range s.Proxies {
			in[e.ID] = true
		}
		for id := range want {
			if seen[id] && !in[id] {
				t.Fatalf("snapshot version %d lacks %s, which was in before", s.Version, id)
			}
			seen[id] = seen[id] || in[id]
		}
	}
}

// A process that restarts loads the rotation from PROXY_ROTATION and keeps
// it while it probes again, so a restart never empties the rotation; then
// probes decide. Its versions continue above the ones published before.
func TestRestartLoadsTheRotation(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	_, js1 := r.srv.Connect(t)
	h1 := r.startWith(js1, fastProbing(p))
	want := map[string]string{}
	for i := range 3 {
		ip := fmt.Sprintf("198.18.100.%d", i+1)
		r.publish(leaseEvent(fmt.Sprintf("p%d", i), 2, messages.StateRunning, ip))
		want[fmt.Sprintf("p%d", i)] = ip + ":3128"
	}
	r.waitBucket(want)
	last := r.waitSnapshot(want).Version
	if err := r.stop(h1); err != nil {
		t.Fatal(err)
	}

	// p1 stopped answering while no process ran.
	p.set("198.18.100.2:3128", true)
	watch := r.watchBucket()
	cfg := fastProbing(p)
	cfg.Interval, cfg.Timeout = 100*time.Millisecond, 50*time.Millisecond
	h2 := r.start(cfg)
	rot, ok := h2.Rotation()
	if got := addrs(rot.Proxies); !ok || len(got) != 3 {
		t.Fatalf("rotation right after the restart = %v, want the 3 loaded from the bucket", got)
	}
	delete(want, "p1")
	r.waitBucket(want)
	r.waitSnapshot(want) // the snapshots below are all in, up to this one
	snaps := r.snapshots()
	var after []messages.Rotation
	for _, s := range snaps {
		if s.Version > last {
			after = append(after, s)
		}
	}
	if len(after) == 0 || len(after[0].Proxies) != 3 {
		t.Fatalf("first snapshot after the restart: %+v (versions before it up to %d)", after, last)
	}
	checkVersionsIncrease(t, snaps)
	// The watch is a consumer of its own: it may see the delete after
	// the read above did (CI saw "deleted from the bucket: []").
	waitFor(t, "the watch to see a delete", func() bool { return len(watch.deleted()) > 0 })
	if d := watch.deleted(); len(d) != 1 || d[0] != "p1" {
		t.Fatalf("deleted from the bucket: %v, want only p1", d)
	}
	if m := h2.Metrics(); m.Entries != 3 || m.Exits != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

// A holder whose lease was taken (here: written by another holder) stops
// publishing at its next renewal, and takes the lease back once the other
// stops renewing it for the TTL.
func TestLostLeaseStopsPublishing(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	cfg, looks := countLooks(fastProbing(p))
	h := r.start(cfg)
	waitFor(t, "the lease", h.Holder)
	leases, err := r.js.KeyValue(context.Background(), messages.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // another holder, renewing every 100ms
		defer close(done)
		for {
			leases.PutString(context.Background(), health.LeaseKey, `{"holder":"other","ttl":"1s","version":1000000}`)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	waitFor(t, "the lease to be lost", func() bool { return !h.Holder() })
	n := h.Metrics().Published
	r.publish(leaseEvent("p1", 2, messages.StateRunning, "198.18.100.1"))
	waitFor(t, "p1 to enter the fold", func() bool { rot, _ := h.Rotation(); return len(rot.Proxies) == 1 })
	// A look at the lease is followed by a publish in the same turn of
	// the loop: the second look after p1 entered the fold ends a turn
	// that had p1 to publish, and still had the lease taken.
	l := looks.Load()
	waitFor(t, "two looks at the lease", func() bool { return looks.Load() >= l+2 })
	if m := h.Metrics(); m.Published != n || len(r.bucket()) != 0 {
		t.Fatalf("published while standing by: %+v, bucket %v", m, r.bucket())
	}
	close(stop)
	<-done
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	// It continues above the version the other holder wrote.
	if s := r.waitSnapshot(map[string]string{"p1": "198.18.100.1:3128"}); s.Version <= 1000000 {
		t.Fatalf("version %d after the other holder's 1000000", s.Version)
	}
	if !h.Holder() || h.Metrics().Takeovers != 2 {
		t.Fatalf("metrics %+v", h.Metrics())
	}
}

// With probing, a proxy whose guest agent restarts (provisioning, no IP)
// keeps its place for the grace and is probed at its last address
// meanwhile; then it is demoted and no longer probed. Another proxy's
// failures never move it.
func TestGraceWithProbing(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	cfg := fastProbing(p)
	cfg.Grace = 700 * time.Millisecond
	h := r.start(cfg)
	r.publish(leaseEvent("p1", 2, messages.StateRunning, "198.18.100.1"), leaseEvent("p2", 2, messages.StateRunning, "198.18.100.2"))
	both := map[string]string{"p1": "198.18.100.1:3128", "p2": "198.18.100.2:3128"}
	r.waitBucket(both)
	r.publishFolded(h, leaseEvent("p1", 3, messages.StateProvisioning, ""))
	p.set("198.18.100.2:3128", true) // p2 fails meanwhile: only p2 leaves
	r.waitBucket(map[string]string{"p1": "198.18.100.1:3128"})
	n := p.count("198.18.100.1:3128")
	waitFor(t, "p1 probed during its grace", func() bool { return p.count("198.18.100.1:3128") >= n+3 })
	if !h.Metrics().CaughtUp || h.Metrics().InGrace != 1 {
		t.Fatalf("metrics %+v", h.Metrics())
	}
	r.waitBucket(map[string]string{})
	// p2, failing but running, is probed once a round, and rounds do not
	// overlap: two more of its probes end the round p1 may have been in
	// when its grace ended, three more make two rounds without p1.
	rounds := func(k int) {
		t.Helper()
		m := p.count("198.18.100.2:3128")
		waitFor(t, fmt.Sprintf("p2 probed %d more times", k), func() bool { return p.count("198.18.100.2:3128") >= m+k })
	}
	rounds(2)
	n = p.count("198.18.100.1:3128")
	rounds(3)
	if p.count("198.18.100.1:3128") != n {
		t.Fatal("p1 still probed after its grace without a running event")
	}
}
