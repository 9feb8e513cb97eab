package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// TestObservationSeesAVMDieBehindOurBack: the host's owner re-reads its
// running proxies on an interval; an unchanged proxy publishes nothing, a
// domain shut off behind the system's back is reported failed.
func TestObservationSeesAVMDieBehindOurBack(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(func(c *worker.Config) { c.ObserveInterval = 100 * time.Millisecond })
	r.create("p1", "c1", "")
	r.create("p2", "c2", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.waitOutcome("c2", messages.OutcomeDone)
	before, _ := r.lastEvent("p1")

	// Several passes over unchanged proxies, begun after p1's last event
	// was read: the first has ended by the time the fifth begins (a pass
	// gives up after an interval, and ticks come an interval apart).
	passes := func() int64 { return w.Stats().Snapshot()["observe_passes"] }
	from := passes()
	r.waitFor("passes over unchanged proxies", 20*time.Second, func() bool { return passes() >= from+5 })
	if ev, _ := r.lastEvent("p1"); ev.Seq != before.Seq {
		t.Fatalf("an unchanged proxy was republished: %+v after %+v", ev, before)
	}

	d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop("p1"); err != nil {
		t.Fatal(err)
	}
	r.waitFor("p1 failed", 10*time.Second, func() bool {
		ev, _ := r.lastEvent("p1")
		return ev.State == messages.StateFailed
	})
	ev, _ := r.lastEvent("p1")
	if ev.CommandID != "c1" || ev.Seq != before.Seq+1 || ev.Reason == "" {
		t.Errorf("observed event %+v", ev)
	}
	if ev2, _ := r.lastEvent("p2"); ev2.State != messages.StateRunning {
		t.Errorf("neighbour p2: %+v", ev2)
	}
}

// TestSweepRemovesOrphansOnly: a domain whose desired state is a delete (a
// leaked VM) is removed by the host owner's sweep; a domain of a proxy with
// no desired record is left alone; running proxies stay.
func TestSweepRemovesOrphansOnly(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(func(c *worker.Config) { c.ObserveInterval = 100 * time.Millisecond })
	r.create("keep", "k1", "")
	r.create("gone", "g1", "")
	r.waitOutcome("k1", messages.OutcomeDone)
	r.waitOutcome("g1", messages.OutcomeDone)
	r.delete("gone", "g2")
	r.waitOutcome("g2", messages.OutcomeDone)
	// A pass between the delete's desired state and its work item may
	// sweep the domain itself (its desired state says delete): only the
	// sweeps from here on count.
	before := w.Stats().Snapshot()["swept"]

	d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
	if err != nil {
		t.Fatal(err)
	}
	// A VM leaks behind the delete, and a stray one no command asked for.
	if _, err := d.Create(context.Background(), fleet.Spec{ID: "gone", CommandID: "leak"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Create(context.Background(), fleet.Spec{ID: "stray", CommandID: "x"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the leaked VM to be swept", 10*time.Second, func() bool { return !r.domainExists("h1", "gone") })
	// More passes, each a sweep that would remove stray or keep if it
	// were wrong: the first begun from here has ended when the fourth
	// begins (a pass gives up after an interval).
	passes := func() int64 { return w.Stats().Snapshot()["observe_passes"] }
	from := passes()
	r.waitFor("more passes", 20*time.Second, func() bool { return passes() >= from+4 })
	if !r.domainExists("h1", "stray") {
		t.Error("a domain with no desired state was swept")
	}
	if !r.domainExists("h1", "keep") {
		t.Error("a running proxy was swept")
	}
	if n := w.Stats().Snapshot()["swept"] - before; n != 1 {
		t.Errorf("swept %d since the leak, want 1", n)
	}
}

// TestObservationLeavesACreateWaitingForItsRetry: a create that failed
// transiently and waits for its retry has no domain yet; the observation
// pass must not report it failed ("domain is gone") meanwhile.
func TestObservationLeavesACreateWaitingForItsRetry(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) {
		c.ObserveInterval = 50 * time.Millisecond
		c.Backoff = &stepBackoff{step: time.Second} // several passes while it waits
	})
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "create", ID: "p1", Class: fleet.ClassTransient, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.events["p1"] {
		if ev.State == messages.StateFailed {
			t.Errorf("reported failed while its create waited for a retry: %+v", ev)
		}
	}
}

// TestObservationReportsProxiesWhoseEventsWereLost: PROXY_EVENTS deleted
// and made anew holds no event of a running proxy; the host's observation
// pass reports it again from its domain.
func TestObservationReportsProxiesWhoseEventsWereLost(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) { c.ObserveInterval = 100 * time.Millisecond })
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	before, _ := r.lastEvent("p1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.js.DeleteStream(ctx, messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, r.js); err != nil {
		t.Fatal(err)
	}
	r.waitFor("p1 reported again", 10*time.Second, func() bool {
		ev, ok := r.lastEvent("p1")
		return ok && ev.State == messages.StateRunning && ev.IP == before.IP && ev.CommandID == "c1"
	})
}

// TestObservationPassReadsItsHostsEvents: a host's observation passes
// read the last events of the host's own proxies, whatever proxies other
// hosts run, and leave those others alone. What a pass reads of the event
// stream is a budget (BenchmarkObservationPassOtherHosts, bench section
// budgets).
func TestObservationPassReadsItsHostsEvents(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(func(c *worker.Config) { c.ObserveInterval = 50 * time.Millisecond })
	r.create("p1", "c1", "")
	r.create("p2", "c2", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.waitOutcome("c2", messages.OutcomeDone)
	// Proxies elsewhere: running on a host this worker does not run.
	publishOthers(t, r, 300)
	// Passes that start from now on see every event published above.
	start := w.Stats().Snapshot()
	r.waitFor("passes", 20*time.Second, func() bool { return w.Stats().Snapshot()["observe_passes"] >= start["observe_passes"]+6 })
	// The first passes counted may have begun before the last publish.
	mid := w.Stats().Snapshot()
	r.waitFor("more passes", 20*time.Second, func() bool { return w.Stats().Snapshot()["observe_passes"] >= mid["observe_passes"]+5 })
	end := w.Stats().Snapshot()
	passes := end["observe_passes"] - mid["observe_passes"]
	if read := end["observe_events_read"] - mid["observe_events_read"]; read < 2*passes {
		t.Errorf("%d passes read %d events; want each pass to read h1's own 2", passes, read)
	}
	for _, id := range []string{"o0", "o299"} {
		if ev, _ := r.lastEvent(id); ev.Host != "h2" || ev.State != messages.StateRunning || ev.Seq != 1 {
			t.Errorf("%s, on another host: last event %+v, want h2's running event left alone", id, ev)
		}
	}
}

// TestObservationViewIsMadeAnewWithTheStream: the worker's view of the
// last events must follow PROXY_EVENTS deleted and made anew. p1 runs on
// h1, but its last event (a stray one) says h2, so h1's passes leave it;
// once the stream is made anew it has no event at all, and h1's pass must
// report it from its domain. A view still holding the old stream's events
// would keep leaving it.
func TestObservationViewIsMadeAnewWithTheStream(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(func(c *worker.Config) {
		c.ObserveInterval = 100 * time.Millisecond
		c.CheckInterval = 100 * time.Millisecond
	})
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	before, _ := r.lastEvent("p1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stray := before
	stray.Host, stray.Seq = "h2", before.Seq+1
	b, err := json.Marshal(stray)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.js.Publish(ctx, subj.State("p1"), b); err != nil {
		t.Fatal(err)
	}
	n := w.Stats().Snapshot()["observe_passes"]
	r.waitFor("passes that see the stray event", 10*time.Second, func() bool { return w.Stats().Snapshot()["observe_passes"] >= n+3 })
	if err := r.js.DeleteStream(ctx, messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, r.js); err != nil {
		t.Fatal(err)
	}
	r.waitFor("p1 reported again on h1", 15*time.Second, func() bool {
		ev, ok := r.lastEvent("p1")
		return ok && ev.Host == "h1" && ev.State == messages.StateRunning && ev.IP == before.IP && ev.CommandID == "c1"
	})
}

// TestObservationFollowsNoStreamAndSeesAChange: passes over unchanged
// proxies leave them be, no worker follows the event stream between
// passes, and a proxy that changed is still seen and reported. What a pass
// reads is a budget (BenchmarkObservationPassRequests, bench section
// budgets): its proxies' last events and desired records batched.
func TestObservationFollowsNoStreamAndSeesAChange(t *testing.T) {
	const n = 10
	r, _ := observedRig(t, n, 100*time.Millisecond)
	for i := range n {
		if ev, _ := r.lastEvent(fmt.Sprintf("p%d", i)); ev.State != messages.StateRunning {
			t.Errorf("p%d, unchanged: last event %s, want running", i, ev.State)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := r.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().State.Consumers != 0 {
		t.Errorf("%d consumers on %s while a worker runs; want none (a worker reads events when a pass runs)", st.CachedInfo().State.Consumers, messages.StreamEvents)
	}
	// A proxy that changed is still seen and reported.
	d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop("p3"); err != nil {
		t.Fatal(err)
	}
	r.waitFor("p3 failed", 10*time.Second, func() bool {
		ev, _ := r.lastEvent("p3")
		return ev.State == messages.StateFailed
	})
}

// TestObservationPassesAreBounded: a worker runs at most ObservePasses of
// its hosts' passes at once, though every host's tick comes in the same
// window, and each host still gets its passes.
func TestObservationPassesAreBounded(t *testing.T) {
	r := newRig(t, "h1", "h2", "h3", "h4")
	lists := &concurrentLists{}
	w := r.startWorker(func(c *worker.Config) {
		c.ObserveInterval = 200 * time.Millisecond
		c.ObservePasses = 1
		for _, h := range r.hosts {
			d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			c.Providers[h] = slowLists{d, h, lists}
		}
	})
	passes := func() int64 { return w.Stats().Snapshot()["observe_passes"] }
	r.waitFor("passes of every host", 30*time.Second, func() bool {
		lists.mu.Lock()
		defer lists.mu.Unlock()
		return passes() >= 12 && len(lists.hosts) == len(r.hosts)
	})
	lists.mu.Lock()
	defer lists.mu.Unlock()
	if lists.most != 1 {
		t.Errorf("%d passes listed their hosts at once; want at most 1", lists.most)
	}
}

// concurrentLists counts the List calls in progress, the most at once,
// and the hosts listed.
type concurrentLists struct {
	mu        sync.Mutex
	now, most int
	hosts     map[string]bool
}

// slowLists is a host whose List takes a while, counted in c.
type slowLists struct {
	*sim.Driver
	host string
	c    *concurrentLists
}

func (p slowLists) List(ctx context.Context) ([]fleet.Instance, error) {
	p.c.mu.Lock()
	p.c.now++
	p.c.most = max(p.c.most, p.c.now)
	if p.c.hosts == nil {
		p.c.hosts = map[string]bool{}
	}
	p.c.hosts[p.host] = true
	p.c.mu.Unlock()
	defer func() {
		p.c.mu.Lock()
		p.c.now--
		p.c.mu.Unlock()
	}()
	select {
	case <-time.After(50 * time.Millisecond):
	case <-ctx.Done():
	}
	return p.Driver.List(ctx)
}
