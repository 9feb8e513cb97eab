package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// hostCmd publishes a host command of op for host with msgID.
func (r *rig) hostCmd(op, host, msgID, body string) {
	r.t.Helper()
	if body == "" {
		body = fmt.Sprintf(`{"v":1,"host":%q}`, host)
	}
	r.publish(subj.HostCommand(op, host), []byte(body), msgID)
}

// An operator's quarantine by command: placement skips the host, a create
// naming it waits, the quarantine outlasts many automatic cool-downs and
// observation ticks (no probe ends it), and a release brings the host
// back: the waiting create completes there and placement uses it again.
// Every command is answered on the results like any other.
func TestHostCommandQuarantineAndRelease(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.startWorker(withRoom(r, 10), func(c *worker.Config) {
		c.QuarantineFailures = 3
		c.QuarantineWindow = time.Minute
		c.QuarantineCoolDown = 50 * time.Millisecond
		c.QuarantineMaxCoolDown = 100 * time.Millisecond
		c.ObserveInterval = 50 * time.Millisecond
	})
	// h2 holds three proxies, so h1 has the more room.
	for i := range 3 {
		r.create(fmt.Sprintf("b%d", i), fmt.Sprintf("cb%d", i), `,"host":"h2"`)
		r.waitOutcome(fmt.Sprintf("cb%d", i), messages.OutcomeDone)
	}

	r.hostCmd(messages.OpHostQuarantine, "h1", "qh1", `{"v":1,"host":"h1","reason":"disk swap","by":"ops"}`)
	acc := r.waitOutcome("qh1", messages.OutcomeAccepted)
	done := r.waitOutcome("qh1", messages.OutcomeDone)
	if acc.ID != "h1" || done.Op != messages.OpHostQuarantine || done.Reason != "quarantined until released" {
		t.Errorf("results of the quarantine: %+v, %+v", acc, done)
	}
	rec, _ := r.hostRecord("h1")
	if !rec.Manual() || rec.Reason != "operator ops: disk swap" || !rec.Until.IsZero() {
		t.Fatalf("h1's record after the quarantine: state %s until %v reason %q, want an operator's quarantine", rec.State, rec.Until, rec.Reason)
	}

	r.create("a0", "ca0", "")
	r.waitOutcome("ca0", messages.OutcomeDone)
	if ev, _ := r.lastEvent("a0"); ev.Host != "h2" {
		t.Errorf("a0 placed on %q while h1 is quarantined, want h2", ev.Host)
	}
	r.create("q1", "cq1", `,"host":"h1"`)
	r.waitOutcome("cq1", messages.OutcomeAccepted)

	// Twenty cool-downs and observation ticks: no probe ends it.
	time.Sleep(20 * 50 * time.Millisecond)
	if rec, _ := r.hostRecord("h1"); !rec.Manual() {
		t.Fatalf("h1 after twenty cool-downs: state %s until %v reason %q, want still quarantined", rec.State, rec.Until, rec.Reason)
	}
	if res := r.resultsFor("cq1"); len(res) != 1 {
		t.Fatalf("the create on h1 ran while h1 is quarantined: %+v", res)
	}
	if r.domainExists("h1", "q1") {
		t.Fatal("q1 was made on h1 while it is quarantined")
	}

	r.hostCmd(messages.OpHostRelease, "h1", "rh1", "")
	if res := r.waitOutcome("rh1", messages.OutcomeDone); res.Reason != "released" || res.Op != messages.OpHostRelease {
		t.Errorf("result of the release: %+v", res)
	}
	if rec, _ := r.hostRecord("h1"); rec.State != messages.HostOK || rec.Reason != "" {
		t.Errorf("h1's record after the release: state %s reason %q", rec.State, rec.Reason)
	}
	if res := r.waitOutcome("cq1", messages.OutcomeDone); res.Outcome != messages.OutcomeDone {
		t.Fatalf("the create that waited on h1: %+v", res)
	}
	r.create("c1", "cc1", "")
	r.waitOutcome("cc1", messages.OutcomeDone)
	if ev, _ := r.lastEvent("c1"); ev.Host != "h1" {
		t.Errorf("c1 placed on %q after h1 was released, want h1 (the more room)", ev.Host)
	}

	// A release of a host not quarantined changes nothing.
	r.hostCmd(messages.OpHostRelease, "h1", "rh1b", "")
	if res := r.waitOutcome("rh1b", messages.OutcomeDone); res.Reason != "not quarantined" {
		t.Errorf("second release: %+v", res)
	}
}

// A release ends an automatic quarantine at once, long before its
// cool-down would: the record says ok, and the work that waited runs.
func TestHostCommandReleasesAutomaticQuarantine(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.startWorker(withRoom(r, 10), func(c *worker.Config) {
		c.QuarantineFailures = 2
		c.QuarantineWindow = time.Minute
		c.QuarantineCoolDown = time.Hour
		c.QuarantineMaxCoolDown = time.Hour
		c.ObserveInterval = 50 * time.Millisecond
		c.MaxAttempts = 5
	})
	for _, op := range []string{"create", "get", "delete", "list"} {
		if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: op, Class: fleet.ClassTransient, Count: -1}); err != nil {
			t.Fatal(err)
		}
	}
	r.create("q1", "cq1", `,"host":"h1"`)
	r.waitFor("h1 quarantined", 30*time.Second, func() bool {
		rec, ok := r.hostRecord("h1")
		return ok && rec.Quarantined() && !rec.Manual()
	})
	if err := sim.ClearFaults(r.hostDir("h1")); err != nil {
		t.Fatal(err)
	}
	r.hostCmd(messages.OpHostRelease, "h1", "rh1", "")
	if res := r.waitOutcome("rh1", messages.OutcomeDone); res.Reason != "released from its automatic quarantine" {
		t.Errorf("result of the release: %+v", res)
	}
	if res := r.waitOutcome("cq1", messages.OutcomeDone); res.Outcome != messages.OutcomeDone {
		t.Fatalf("the create that waited on h1: %+v", res)
	}
	if rec, _ := r.hostRecord("h1"); rec.State != messages.HostOK {
		t.Errorf("h1 after the release and the create: %s (%s)", rec.State, rec.Reason)
	}
}

// Bad host commands are rejected with the field named, and change no
// record.
func TestHostCommandRejected(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.startWorker()
	for _, c := range []struct{ op, host, id, body, field string }{
		{messages.OpHostQuarantine, "h9", "x1", "", "host"},
		{messages.OpHostQuarantine, "h1", "x2", `{"v":1,"host":"h2"}`, "host"},
		{messages.OpHostQuarantine, "h1", "x3", `{"v":1,"host":"h1","reason":"` + strings.Repeat("r", 300) + `"}`, "reason"},
		{messages.OpHostRelease, "h1", "x4", `{"v":2,"host":"h1"}`, "v"},
		{messages.OpHostRelease, "h1", "x5", `{"v":1,"host":"h1","until":"x"}`, "until"},
	} {
		r.hostCmd(c.op, c.host, c.id, c.body)
		res := r.waitOutcome(c.id, messages.OutcomeRejected)
		if res.Field != c.field || res.ID != c.host {
			t.Errorf("%s %s %s: rejected on %q (%s), want %q", c.op, c.host, c.body, res.Field, res.Reason, c.field)
		}
	}
	for _, h := range []string{"h1", "h2"} {
		if rec, ok := r.hostRecord(h); ok && rec.Quarantined() {
			t.Errorf("%s quarantined by a rejected command", h)
		}
	}
}
