package worker_test

import (
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/worker"
)

// TestDuplicateAfterDedupeWindowHasNoEffect republishes a create with the
// same command id after JetStream's duplicate window has passed, so the
// server stores it again: intake must recognise the command id and leave
// the proxy alone (here: deleted, as the later delete said).
func TestDuplicateAfterDedupeWindowHasNoEffect(t *testing.T) {
	r := newRig(t, "h1")
	// The in-window duplicate is published right after the original, so
	// the window only needs to outlast one publish on a loaded machine.
	const window = time.Second
	r.startWorker(func(c *worker.Config) { c.Topology.DuplicateWindow = window })

	s1 := r.create("p1", "c1", "")
	// Inside the window JetStream drops it.
	if s := r.create("p1", "c1", ""); s != s1 {
		t.Fatalf("in-window duplicate stored at %d, want the original %d", s, s1)
	}
	r.waitOutcome("c1", messages.OutcomeDone)
	r.delete("p1", "d1")
	r.waitOutcome("d1", messages.OutcomeDone)

	// Past the window the server stores the duplicate. Until then each
	// publish is dropped (and does not renew the window): the first one
	// stored is the duplicate intake must recognise.
	r.waitFor("the server to store the duplicate once past its window", 10*time.Second, func() bool {
		return r.create("p1", "c1", "") != s1
	})
	res := r.waitOutcome("c1", messages.OutcomeSuperseded)
	if !strings.Contains(res.Reason, "duplicate") {
		t.Errorf("reason %q, want it to say duplicate", res.Reason)
	}
	ev, _ := r.lastEvent("p1")
	if ev.State != messages.StateDeleted {
		t.Errorf("last event %+v, want deleted", ev)
	}
	if r.domainExists("h1", "p1") {
		t.Error("the duplicate made a VM")
	}
	if n := len(readLines(r.hostDir("h1") + "/creates.log")); n != 2 {
		t.Errorf("creates.log has %d fields, want one create", n)
	}
}
