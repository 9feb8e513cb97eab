package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/worker"
)

// The benchmarks here measure what an observation pass costs, per pass,
// reported with b.ReportMetric; the bench tool (internal/tools/bench,
// section budgets) runs them and holds each figure to its budget.

// observedRig is a worker observing h1 every interval, running n proxies
// it created, two passes past their creates.
func observedRig(tb testing.TB, n int, every time.Duration) (*rig, *worker.Worker) {
	r := newRig(tb, "h1")
	w := r.startWorker(func(c *worker.Config) { c.ObserveInterval = every })
	for i := range n {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	for i := range n {
		r.waitOutcome(fmt.Sprintf("c%d", i), messages.OutcomeDone)
	}
	// A pass that read the events before the last "running" looks closer
	// at that proxy: the count begins once two passes have begun since.
	began := w.Stats().Snapshot()["observe_passes"]
	r.waitFor("two passes after the creates", 30*time.Second, func() bool {
		return w.Stats().Snapshot()["observe_passes"] >= began+2
	})
	return r, w
}

// loopPasses runs one observation pass an op and returns how many ran.
func loopPasses(b *testing.B, r *rig, w *worker.Worker) int64 {
	passes := func() int64 { return w.Stats().Snapshot()["observe_passes"] }
	from := passes()
	for b.Loop() {
		next := passes() + 1
		r.waitFor("a pass", 10*time.Second, func() bool { return passes() >= next })
	}
	return passes() - from
}

// BenchmarkObservationPassRequests: the NATS reads of a pass over 10
// unchanged proxies: their last events and desired records in a batched
// direct get each, none one by one.
func BenchmarkObservationPassRequests(b *testing.B) {
	r, w := observedRig(b, 10, 20*time.Millisecond)
	count := func(subject string) func() int {
		sub, err := r.nc.SubscribeSync(subject)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sub.Unsubscribe() })
		return func() int {
			if err := r.nc.Flush(); err != nil {
				b.Fatal(err)
			}
			n, _, err := sub.Pending()
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	desired := count("$JS.API.DIRECT.GET.KV_" + messages.BucketDesired + ".>")
	desiredBatches := count("$JS.API.DIRECT.GET.KV_" + messages.BucketDesired)
	events := count("$JS.API.DIRECT.GET." + messages.StreamEvents + ".>")
	eventBatches := count("$JS.API.DIRECT.GET." + messages.StreamEvents)
	if err := r.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	ran := float64(loopPasses(b, r, w))
	b.ReportMetric(float64(events())/ran, "event-reads/op")
	b.ReportMetric(float64(eventBatches())/ran, "event-batches/op")
	b.ReportMetric(float64(desired())/ran, "desired-reads/op")
	b.ReportMetric(float64(desiredBatches())/ran, "desired-batches/op")
}

// BenchmarkObservationPassOtherHosts: the events a pass of h1, which runs
// 2 proxies, reads while 300 proxies run on another host.
func BenchmarkObservationPassOtherHosts(b *testing.B) {
	r, w := observedRig(b, 2, 20*time.Millisecond)
	publishOthers(b, r, 300)
	// Passes that start from now on see every event published above.
	start := w.Stats().Snapshot()["observe_passes"]
	r.waitFor("a pass after the publishes", 10*time.Second, func() bool { return w.Stats().Snapshot()["observe_passes"] >= start+2 })
	read := w.Stats().Snapshot()["observe_events_read"]
	ran := float64(loopPasses(b, r, w))
	b.ReportMetric(float64(w.Stats().Snapshot()["observe_events_read"]-read)/ran, "events-read/op")
}

// publishOthers publishes the "running" events of n proxies on h2.
func publishOthers(tb testing.TB, r *rig, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		id := fmt.Sprintf("o%d", i)
		b, err := json.Marshal(messages.StateEvent{V: messages.Version, ID: id, Host: "h2", State: messages.StateRunning,
			CommandID: "c-" + id, Seq: 1, IP: "198.18.100.9", Port: 3128, At: time.Now().UTC()})
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := r.js.Publish(ctx, subj.State(id), b); err != nil {
			tb.Fatal(err)
		}
	}
}
