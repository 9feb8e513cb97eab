package worker_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestCreateThenDelete(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker()
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeAccepted)
	r.waitOutcome("c1", messages.OutcomeDone)
	ev, ok := r.lastEvent("p1")
	if !ok || ev.State != messages.StateRunning || ev.IP == "" || ev.Host != "h1" || ev.CommandID != "c1" {
		t.Fatalf("last event = %+v, want running with an IP on h1 for c1", ev)
	}
	if !r.domainExists("h1", "p1") {
		t.Fatal("no domain on h1")
	}
	r.delete("p1", "d1")
	r.waitOutcome("d1", messages.OutcomeDone)
	ev, _ = r.lastEvent("p1")
	if ev.State != messages.StateDeleted {
		t.Fatalf("last event = %+v, want deleted", ev)
	}
	if r.domainExists("h1", "p1") {
		t.Fatal("domain still on h1")
	}
	// seq grows by one per event: provisioning, running, deleting, deleted.
	r.mu.Lock()
	evs := r.events["p1"]
	r.mu.Unlock()
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq != evs[i-1].Seq+1 {
			t.Fatalf("event seqs %d then %d", evs[i-1].Seq, evs[i].Seq)
		}
	}
}

// A proxy that boots in a fraction of PollInterval is not kept waiting for
// the whole of it: the wait for its address polls soon after the create
// and then less and less often. With a 30s PollInterval and a 100ms boot,
// the create is done long before a first poll at PollInterval would be.
func TestBootWaitPollsSoonAfterCreate(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) {
		c.PollInterval = 30 * time.Second
		c.AckWait = 2 * time.Minute // the wait is no redelivery
		p, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1"), Delay: time.Millisecond, BootDelay: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c.Providers["h1"] = p
	})
	r.create("p1", "c1", "")
	r.waitFor("create done within a third of PollInterval", 10*time.Second, func() bool {
		for _, res := range r.resultsFor("c1") {
			if res.Outcome == messages.OutcomeDone {
				return true
			}
		}
		return false
	})
}
