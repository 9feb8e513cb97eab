package worker_test

import (
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// TestObservationSeesAVMDieBehindOurBack: the host's owner re-reads its
// running proxies on an interval; an unchanged proxy publishes nothing, a
// domain shut off behind the system's back is reported failed.
func TestObservationSeesAVMDieBehindOurBack(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) { c.ObserveInterval = 100 * time.Millisecond })
	r.create("p1", "c1", "")
	r.create("p2", "c2", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.waitOutcome("c2", messages.OutcomeDone)
	before, _ := r.lastEvent("p1")

	time.Sleep(500 * time.Millisecond) // several passes over unchanged proxies
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
