package worker_test

import (
	"context"
	"testing"
	"time"

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
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	w.Stop(ctx)
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
// over at once (the stopping worker unpins it) and finishes it.
func TestStopHandsBackWorkPastTheDrainTimeout(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker(slowHosts(r, 2*time.Second), func(c *worker.Config) {
		c.DrainTimeout = 100 * time.Millisecond
		c.PinnedTTL = time.Minute // a takeover within the test's bound needs the unpin
		c.AckWait = time.Minute   // and the hand-back, not a redelivery after AckWait
	})
	r.create("p1", "c1", "")
	r.waitState("p1", messages.StateProvisioning)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	w.Stop(ctx)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stop took %s", d)
	}
	for _, res := range r.resultsFor("c1") {
		if res.Outcome == messages.OutcomeDone {
			t.Fatal("the slow create finished inside a 100ms drain; the test proves nothing")
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
