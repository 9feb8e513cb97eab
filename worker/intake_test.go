package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// TestBadInputRejected publishes bad commands around valid ones for a proxy
// that is running: each bad one gets exactly one rejected result naming its
// field, is never redelivered, changes no state, and does not hold up the
// valid commands.
func TestBadInputRejected(t *testing.T) {
	r := newRig(t, "h1")
	w := r.startWorker()
	r.create("live", "live-1", "")
	r.waitOutcome("live-1", messages.OutcomeDone)
	before, _ := r.lastEvent("live")

	cases := badCommands("live")
	// Valid commands for other proxies, interleaved with the bad ones.
	for i, c := range cases {
		r.publish(c.subject, []byte(c.body), "bad-"+fmt.Sprint(i))
		r.create(fmt.Sprintf("ok%d", i), fmt.Sprintf("ok-%d", i), "")
	}
	for i := range cases {
		r.waitOutcome(fmt.Sprintf("ok-%d", i), messages.OutcomeDone)
	}
	for i, c := range cases {
		res := r.waitOutcome("bad-"+fmt.Sprint(i), messages.OutcomeRejected)
		if res.Field != c.field {
			t.Errorf("%s: field %q, want %q (reason %q)", c.name, res.Field, c.field, res.Reason)
		}
		if res.Reason == "" {
			t.Errorf("%s: no reason", c.name)
		}
	}
	// Never redelivered: the command stream is empty and intake has
	// nothing pending or unacked; each bad command was answered once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := r.js.Consumer(ctx, messages.StreamCommands, topology.IntakeConsumer)
	if err != nil {
		t.Fatal(err)
	}
	settle := func() {
		t.Helper()
		r.waitFor("intake to settle", 10*time.Second, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
		})
	}
	settle()
	// Settled, intake has published every answer it will give the bad
	// commands, a second one included; a command published now is
	// answered after them, and the rig records results in the order the
	// server sent them: once its answer is in, so is any second answer.
	r.create("marker", "marker-1", "")
	r.waitOutcome("marker-1", messages.OutcomeAccepted)
	settle() // the marker acked: the command stream is empty again
	for i, c := range cases {
		if n := len(r.resultsFor("bad-" + fmt.Sprint(i))); n != 1 {
			t.Errorf("%s: %d results, want 1", c.name, n)
		}
	}
	after, _ := r.lastEvent("live")
	if after.Seq != before.Seq || after.State != messages.StateRunning {
		t.Errorf("live proxy changed: before %+v, after %+v", before, after)
	}
	if got := w.Stats().Snapshot()["rejected"]; got != int64(len(cases)) {
		t.Errorf("rejected = %d, want %d", got, len(cases))
	}
	st, _ := r.js.Stream(ctx, messages.StreamCommands)
	info, _ := st.Info(ctx)
	if info.State.Msgs != 0 {
		t.Errorf("%d commands left in %s", info.State.Msgs, messages.StreamCommands)
	}
}

// badCase is a bad command and the field its rejection must name.
type badCase struct {
	name, subject, body, field string
}

// badCommands returns one bad command of every kind, aimed at proxy id.
func badCommands(id string) []badCase {
	big := `{"v":1,"id":"` + id + `","labels":{"a":"` + strings.Repeat("x", messages.MaxBodySize) + `"}}`
	q := func(body string) string { return strings.ReplaceAll(body, "ID", id) }
	return []badCase{
		{"malformed json", subj.Create(id), q(`{"v":1,"id":"ID"`), "body"},
		{"unknown field", subj.Create(id), q(`{"v":1,"id":"ID","colour":"red"}`), "colour"},
		{"missing id", subj.Create(id), `{"v":1}`, "id"},
		{"bad id", subj.Create("Live_1"), `{"v":1,"id":"Live_1"}`, "id"},
		{"subject mismatch", subj.Create(id), `{"v":1,"id":"other"}`, "id"},
		{"unknown host", subj.Create(id), q(`{"v":1,"id":"ID","host":"nowhere"}`), "host"},
		{"unknown image", subj.Create(id), q(`{"v":1,"id":"ID","image":"nope"}`), "image"},
		{"cpus zero", subj.Create(id), q(`{"v":1,"id":"ID","cpus":0}`), "cpus"},
		{"memory too large", subj.Create(id), q(`{"v":1,"id":"ID","memory_mib":1073741824}`), "memory_mib"},
		{"wrong version", subj.Create(id), q(`{"v":2,"id":"ID"}`), "v"},
		{"oversized", subj.Create(id), big, "body"},
		{"empty body", subj.Create(id), ``, "body"},
		{"trailing data", subj.Create(id), q(`{"v":1,"id":"ID"} {}`), "body"},
		{"wrong type", subj.Create(id), q(`{"v":1,"id":"ID","cpus":"two"}`), "cpus"},
		{"delete unknown field", subj.Delete(id), q(`{"v":1,"id":"ID","force":true}`), "force"},
		{"not an object", subj.Delete(id), `[1,2]`, "body"},
	}
}

// Intake publishes a command's work item, its answer and its command id
// record at once and waits for all three: one that was not stored (here
// the work item, its stream gone) hands the command back, however the
// others fared, and a later delivery dispatches it. Acking it with its
// answer stored but not its work would leave the proxy accepted and never
// made.
func TestCommandIsRetriedUntilItsWorkItemIsStored(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) {
		c.MaxAttempts = 200 // each at most 200 ms apart: the test's stream is back long before
		c.CheckInterval = 100 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.js.DeleteStream(ctx, messages.StreamWork); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	desired, err := r.js.KeyValue(ctx, messages.BucketDesired)
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor("intake to record p1 and fail to dispatch it", 10*time.Second, func() bool {
		_, err := desired.Get(ctx, "p1")
		return err == nil
	})
	// The redrive of a recorded proxy with no work would make it in the
	// end anyway: what shows the command was handed back is that intake
	// has it again, unacked.
	r.waitFor("the command to be delivered again", 10*time.Second, func() bool {
		c, err := r.js.Consumer(ctx, messages.StreamCommands, topology.IntakeConsumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumRedelivered > 0
	})
	r.setup(ctx, worker.Config{Subjects: subj})
	r.waitOutcome("c1", messages.OutcomeDone)
	if !r.domainExists("h1", "p1") {
		t.Error("p1 is done but has no domain on h1")
	}
}
