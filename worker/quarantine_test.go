package worker_test

import (
	"fmt"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// A host whose every call fails transiently is quarantined: new creates
// naming no host go to the other one although it has more room, its own
// work waits without running out of attempts while the cool-down grows,
// and once the fault is cleared a probe brings it back, its waiting create
// completes, and placement uses it again.
func TestQuarantine(t *testing.T) {
	r := newRig(t, "h1", "h2")
	l := &retryLog{}
	r.startWorker(withRoom(r, 10), func(c *worker.Config) {
		c.QuarantineFailures = 3
		c.QuarantineWindow = time.Minute
		c.QuarantineCoolDown = 100 * time.Millisecond
		c.QuarantineMaxCoolDown = 400 * time.Millisecond
		c.ObserveInterval = 100 * time.Millisecond
		c.MaxAttempts = 5
		c.OnRetry = l.add
	})
	// h2 holds three proxies, so h1 has the more room.
	for i := range 3 {
		r.create(fmt.Sprintf("b%d", i), fmt.Sprintf("cb%d", i), `,"host":"h2"`)
		r.waitOutcome(fmt.Sprintf("cb%d", i), messages.OutcomeDone)
	}
	for _, op := range []string{"create", "get", "delete", "list"} {
		if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: op, Class: fleet.ClassTransient, Count: -1}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	r.create("q1", "cq1", `,"host":"h1"`)
	r.waitFor("h1 quarantined", 30*time.Second, func() bool {
		rec, ok := r.hostRecord("h1")
		return ok && rec.State == messages.HostQuarantined && rec.Reason != ""
	})
	t.Logf("h1 quarantined %s after the create", time.Since(start).Round(time.Millisecond))
	for i := range 3 {
		r.create(fmt.Sprintf("a%d", i), fmt.Sprintf("ca%d", i), "")
		r.waitOutcome(fmt.Sprintf("ca%d", i), messages.OutcomeDone)
		if ev, _ := r.lastEvent(fmt.Sprintf("a%d", i)); ev.Host != "h2" {
			t.Errorf("a%d placed on %q while h1 is quarantined, want h2", i, ev.Host)
		}
	}
	// Probes keep failing: the cool-down doubles up to its cap, where
	// it stays for two more failed probes while the create waits.
	retriesBefore := -1
	untils := map[time.Time]bool{}
	r.waitFor("two failed probes at the cool-down's cap", 30*time.Second, func() bool {
		rec, _ := r.hostRecord("h1")
		if rec.Quarantined() && rec.CoolDownMS == 400 {
			if retriesBefore < 0 {
				retriesBefore = len(l.list())
			}
			untils[rec.Until] = true
		}
		return len(untils) >= 3
	})

	if err := sim.ClearFaults(r.hostDir("h1")); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	r.waitFor("h1 out of quarantine", 30*time.Second, func() bool {
		rec, _ := r.hostRecord("h1")
		return rec.State == messages.HostOK
	})
	t.Logf("h1 back %s after the fault was cleared", time.Since(cleared).Round(time.Millisecond))
	if res := r.waitFinal("cq1"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("the create that waited on h1: %s (%s), want done", res.Outcome, res.Reason)
	}
	if n := len(l.list()); n != retriesBefore {
		t.Errorf("%d retries while quarantined (%d before, %d after): the waiting work spent attempts", n-retriesBefore, retriesBefore, n)
	}
	r.create("c1", "cc1", "")
	r.waitOutcome("cc1", messages.OutcomeDone)
	if ev, _ := r.lastEvent("c1"); ev.Host != "h1" {
		t.Errorf("c1 placed on %q after h1 came back, want h1 (the more room)", ev.Host)
	}
}
