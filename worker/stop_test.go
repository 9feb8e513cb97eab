package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

func slowHosts(r *rig, delay time.Duration) workerOpt {
	return func(c *worker.Config) {
		for _, h := range r.hosts {
			d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: delay})
			if err != nil {
				r.t.Fatal(err)
			}
			c.Providers[h] = d
		}
	}
}

func (r *rig) waitState(id, state string) {
	r.t.Helper()
	r.waitFor(id+" "+state, 30*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ev := range r.events[id] {
			if ev.State == state {
				return true
			}
		}
		return false
	})
}

// TestStopFinishesInFlightWork: a stop within the drain timeout lets the
// work in flight finish.
func TestStopFinishesInFlightWork(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(slowHosts(r, 300*time.Millisecond), func(c *worker.Config) { c.DrainTimeout = 10 * time.Second })
	r.create("p1", "c1", "")
	r.waitState("p1", messages.StateProvisioning)
	if err := r.stopWorker(w); err != nil {
		t.Fatal(err)
	}
	if len(r.resultsFor("c1")) < 2 {
		// The done result is published before Stop returns.
		r.waitOutcome("c1", messages.OutcomeDone)
	}
	if ev, _ := r.lastEvent("p1"); ev.State != messages.StateRunning {
		t.Fatalf("after a drained stop: %+v, want running", ev)
	}
}

// TestStopHandsBackWorkPastTheDrainTimeout: work still running when the
// drain timeout passes is handed back, and another worker takes the host
// over at once (the stopping worker unpins it) and finishes it. The drain
// timeout is 2s so that its hand-over share (1s, handoverShare) leaves the
// unpin time on a loaded machine: an unpin given up waits out PinnedTTL,
// past the test's bound. Each host call takes 5s, past the work's share.
func TestStopHandsBackWorkPastTheDrainTimeout(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(slowHosts(r, 5*time.Second), func(c *worker.Config) {
		c.DrainTimeout = 2 * time.Second
		c.PinnedTTL = time.Minute // a takeover within the test's bound needs the unpin
		c.AckWait = time.Minute   // and the hand-back, not a redelivery after AckWait
	})
	r.create("p1", "c1", "")
	r.waitState("p1", messages.StateProvisioning)
	start := time.Now()
	if err := r.stopWorker(w); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stop took %s", d)
	}
	for _, res := range r.resultsFor("c1") {
		if res.Outcome == messages.OutcomeDone {
			t.Fatal("the slow create finished inside the drain; the test proves nothing")
		}
	}
	r.startWorker(slowHosts(r, 10*time.Millisecond), func(c *worker.Config) {
		c.PinnedTTL = time.Minute
		c.AckWait = time.Minute
	})
	r.waitOutcome("c1", messages.OutcomeDone)
	if n := len(readLines(r.hostDir("h1") + "/creates.log")); n > 2 {
		t.Errorf("creates.log has %d fields: created twice", n)
	}
}

// A worker whose NATS connection is closed for good can do nothing more:
// its Run ends, with that error, once it has drained, instead of leaving a
// process that looks alive.
func TestRunEndsWhenItsConnectionCloses(t *testing.T) {
	r := newRig(t, "h1")
	nc, js := r.srv.Connect(t)
	var logs syncBuf
	cfg := worker.Config{
		Subjects: subj, Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img"},
		Providers:     map[string]worker.Provider{"h1": simHost(t, r, "h1")},
		CheckInterval: 50 * time.Millisecond, Logger: logTo(&logs),
	}
	r.setup(ctxFor(t, 10*time.Second), cfg)
	w, err := worker.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := runtest.Start(t, w.Run, w.Started(), 10*time.Second)
	nc.Close()
	if err := run.Wait(10 * time.Second); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Run after its connection closed = %v, want %v", err, nats.ErrConnectionClosed)
	}
	if !strings.Contains(logs.String(), "draining worker") {
		t.Errorf("the worker did not drain:\n%s", logs.String())
	}
}

// TestStopWithNATSGoneFitsTheDrainTimeout: a worker owning 50 hosts,
// stopped while its server is gone, returns within its drain timeout. Each
// NATS call of the stop (the draining record, the unpins, the record's
// deletion) can only wait for an answer that is not coming; one deadline,
// the drain timeout's, ends them all (the pins expire after PinnedTTL and
// the record after Liveness anyway). Before, each host's unpin waited 2s,
// one after another: over 100s for 50 hosts.
func TestStopWithNATSGoneFitsTheDrainTimeout(t *testing.T) {
	const n = 50
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%02d", i+1)
	}
	r := newRig(t, hosts...)
	nc, _ := r.srv.Connect(t, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	provs := map[string]worker.Provider{}
	for _, h := range hosts {
		d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h)})
		if err != nil {
			t.Fatal(err)
		}
		provs[h] = d
	}
	const drain = 4 * time.Second
	cfg := worker.Config{
		ID: "w1", Subjects: subj, Catalog: worker.Catalog{Hosts: hosts, Images: []string{"img"}, DefaultImage: "img"},
		Providers: provs, PinnedTTL: 2 * time.Second, DrainTimeout: drain,
		Heartbeat: 250 * time.Millisecond, Liveness: 1500 * time.Millisecond, Logger: testLogger(t),
	}
	setupCtx, setupCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer setupCancel()
	r.setup(setupCtx, cfg)
	w, err := worker.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Run's own context, so that the test times the stop (runtest's
	// cleanup, registered first, runs last).
	ctx, cancel := context.WithCancel(context.Background())
	run := runtest.Start(t, func(context.Context) error { return w.Run(ctx) }, w.Started(), 10*time.Second)
	t.Cleanup(cancel)
	r.waitShares(time.Now(), "the worker owning every host", n, "w1")

	r.srv.Stop()
	poll.Until(t, "the worker's connection to notice", 10*time.Second, func() bool { return nc.Status() != nats.CONNECTED })
	start := time.Now()
	cancel()
	// A hang bound far above the drain timeout, so that the old stop
	// (2s a host, one after another) fails here rather than after 100s.
	if err := run.Wait(drain + 20*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	took := time.Since(start)
	t.Logf("stopped %s after the stop began, NATS gone, %d hosts owned", took.Round(time.Millisecond), n)
	// What follows the deadline (closing the pools, the timers) takes
	// milliseconds; a second of slack for a loaded machine.
	if took > drain+time.Second {
		t.Fatalf("the stop took %s, over the drain timeout of %s", took.Round(time.Millisecond), drain)
	}
}
