package worker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// series are the metrics of name whose labels include want (name, value
// pairs), gathered from reg, and its type.
func series(t *testing.T, reg *prometheus.Registry, name string, want ...string) ([]*dto.Metric, dto.MetricType) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var out []*dto.Metric
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(want); i += 2 {
				if have[want[i]] != want[i+1] {
					continue next
				}
			}
			out = append(out, m)
		}
		return out, mf.GetType()
	}
	t.Fatalf("no %s gathered", name)
	return nil, 0
}

// histogram is the sample count and sum of the series of name whose labels
// include want, gathered from reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string, want ...string) (count uint64, sum float64) {
	t.Helper()
	ms, typ := series(t, reg, name, want...)
	if typ != dto.MetricType_HISTOGRAM {
		t.Fatalf("%s is a %v, want a histogram", name, typ)
	}
	for _, m := range ms {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

// TestLatencyHistograms: the worker times each command from its
// acceptance to its answer, by op and outcome, and each create from its
// provider call to its proxy running. A re-drive makes the proxy again
// (a create timed) but answers no command anew: its done, stored again
// once the dedupe window has passed, is not timed from a command accepted
// long before.
func TestLatencyHistograms(t *testing.T) {
	r := newRig(t, "h1")
	reg := prometheus.NewRegistry()
	const boot = 50 * time.Millisecond
	r.startWorker(func(c *worker.Config) {
		c.Registerer = reg
		c.ObserveInterval = 100 * time.Millisecond
		c.Topology.DuplicateWindow = time.Second // so that the re-drive's done is stored again
		d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1"), Delay: time.Millisecond, BootDelay: boot})
		if err != nil {
			t.Fatal(err)
		}
		c.Providers["h1"] = d
	})
	commands := func(op, outcome string) uint64 {
		n, _ := histogram(t, reg, "proxyfleet_command_duration_seconds", "op", op, "outcome", outcome)
		return n
	}
	creates := func() (uint64, float64) { return histogram(t, reg, "proxyfleet_create_running_seconds") }
	for _, s := range []struct{ op, outcome string }{
		{messages.OpCreate, messages.OutcomeDone}, {messages.OpCreate, messages.OutcomeFailed},
		{messages.OpDelete, messages.OutcomeDone}, {messages.OpDelete, messages.OutcomeFailed},
	} {
		if n := commands(s.op, s.outcome); n != 0 {
			t.Fatalf("%s %s: %d before any command", s.op, s.outcome, n)
		}
	}

	start := time.Now()
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "create", ID: "p2", Class: fleet.ClassPermanent, Count: -1}); err != nil {
		t.Fatal(err)
	}
	r.create("p2", "c2", "")
	r.waitOutcome("c2", messages.OutcomeFailed)
	r.delete("p1", "d1")
	r.waitOutcome("d1", messages.OutcomeDone)
	took := time.Since(start).Seconds()

	for _, c := range []struct {
		op, outcome string
		want        uint64
	}{
		{messages.OpCreate, messages.OutcomeDone, 1}, {messages.OpCreate, messages.OutcomeFailed, 1},
		{messages.OpDelete, messages.OutcomeDone, 1}, {messages.OpDelete, messages.OutcomeFailed, 0},
	} {
		if n := commands(c.op, c.outcome); n != c.want {
			t.Errorf("proxyfleet_command_duration_seconds{op=%s,outcome=%s} counted %d, want %d", c.op, c.outcome, n, c.want)
		}
	}
	if _, s := histogram(t, reg, "proxyfleet_command_duration_seconds"); s <= 0 || s > took {
		t.Errorf("commands timed %.3fs in all, want within the %.3fs they took", s, took)
	}
	// p2's create failed at once: only p1's made a proxy that ran.
	if n, s := creates(); n != 1 || s < boot.Seconds() || s > took {
		t.Errorf("proxyfleet_create_running_seconds counted %d for %.3fs, want 1 of at least the boot (%s)", n, s, boot)
	}

	// A re-drive, once c3's done is out of the dedupe window.
	r.create("p3", "c3", "")
	r.waitOutcome("c3", messages.OutcomeDone)
	before, _ := r.lastEvent("p3")
	r.waitPastDedupeWindow() // c3's done out of the window: the re-drive's done is stored again
	if err := os.Remove(filepath.Join(r.hostDir("h1"), "domains", "p3.json")); err != nil {
		t.Fatal(err)
	}
	r.waitFor("p3 running again", 10*time.Second, func() bool {
		ev, _ := r.lastEvent("p3")
		return ev.State == messages.StateRunning && ev.Seq > before.Seq
	})
	r.waitFor("the re-drive's create timed", 10*time.Second, func() bool {
		n, _ := creates()
		return n == 3
	})
	r.waitFor("the re-drive's done stored again", 10*time.Second, func() bool {
		done := 0
		for _, res := range r.storedResults()["c3"] {
			if res.Outcome == messages.OutcomeDone {
				done++
			}
		}
		return done == 2
	})
	if n := commands(messages.OpCreate, messages.OutcomeDone); n != 2 {
		t.Errorf("create done counted %d times after c1, c3 and c3's re-drive, want 2 (the re-drive answers no new command)", n)
	}
}

// waitPastDedupeWindow waits until PROXY_RESULTS's duplicate window has
// passed for every result it stored before the call. It stores a probe
// result and publishes it again, with the same message id, until the
// server stores it again rather than drop it as a duplicate: the window
// has then passed for the probe, and so for every result stored before it
// (the window is one length for all, from each message's storing).
func (r *rig) waitPastDedupeWindow() {
	r.t.Helper()
	id := fmt.Sprintf("window-probe-%d", time.Now().UnixNano()) // a message id of its own
	probe := func() bool {
		m := nats.NewMsg(subj.Result(id))
		m.Data = fmt.Appendf(nil, `{"v":1,"id":%q,"command_id":%q,"op":"probe","outcome":"probe"}`, id, id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ack, err := r.js.PublishMsg(ctx, m)
		if err != nil {
			r.t.Fatalf("publish the window probe: %v", err)
		}
		return !ack.Duplicate
	}
	if !probe() {
		r.t.Fatal("the window probe was a duplicate when first published")
	}
	r.waitFor("the duplicate window to pass", 30*time.Second, probe)
}

// counterOf is the sum of the counters of name whose labels include want,
// gathered from reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name string, want ...string) float64 {
	t.Helper()
	ms, typ := series(t, reg, name, want...)
	if typ != dto.MetricType_COUNTER {
		t.Fatalf("%s is a %v, want a counter", name, typ)
	}
	var sum float64
	for _, m := range ms {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// TestHostRecordWritesCounted: a worker counts its writes of host records
// by outcome; a create's reservation and a delete's release are each one
// stored, and one worker doing one command at a time loses no write.
func TestHostRecordWritesCounted(t *testing.T) {
	r := newRig(t, "h1")
	reg := prometheus.NewRegistry()
	r.startWorker(func(c *worker.Config) { c.Registerer = reg })
	writes := func(outcome string) float64 {
		return counterOf(t, reg, "proxyfleet_host_record_writes_total", "outcome", outcome)
	}
	r.create("p0", "c0", "") // the worker's own start-up writes are behind it
	r.waitOutcome("c0", messages.OutcomeDone)
	before := writes("stored")
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	if n := writes("stored") - before; n != 1 {
		t.Errorf("stored %v for a create, want 1 (its reservation)", n)
	}
	r.delete("p1", "d1")
	r.waitOutcome("d1", messages.OutcomeDone)
	if n := writes("stored") - before; n != 2 {
		t.Errorf("stored %v for a create and a delete, want 2 (its reservation, its release)", n)
	}
	if n := writes("stale") + writes("conflict"); n != 0 {
		t.Errorf("%v writes lost with one worker and one command at a time, want none", n)
	}
}
