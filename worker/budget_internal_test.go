package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
	"proxyfleet/worker/hostshare"
)

// The benchmarks here measure NATS requests per operation, reported with
// b.ReportMetric; the bench tool (internal/tools/bench, section budgets)
// runs them and holds each figure to its budget. Tests assert what the
// operations do, not what they cost.

// BenchmarkLastEventsRequests: the batched reads (jsapi.MaxBatch subjects
// each) and single reads one lastEvents of 2×MaxBatch+17 ids makes.
func BenchmarkLastEventsRequests(b *testing.B) {
	_, nc, js, ctx := setUpTopology(b)
	subj := messages.NewSubjects("")
	p, err := newEventPublisher(ctx, js, subj, time.Hour, time.Now)
	if err != nil {
		b.Fatal(err)
	}
	const n = 2*jsapi.MaxBatch + 17
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%d", i)
		if _, err := p.Publish(ctx, messages.StateEvent{ID: ids[i], State: messages.StateRunning, Host: "h1", CommandID: "c", CommandSeq: 1}); err != nil {
			b.Fatal(err)
		}
	}
	w := &Worker{metrics: newMetrics(), js: js, subj: subj}
	batches := countOf(b, nc, "$JS.API.DIRECT.GET."+messages.StreamEvents)
	singles := countOf(b, nc, "$JS.API.DIRECT.GET."+messages.StreamEvents+".>")
	ops := 0
	for b.Loop() {
		ops++
		got, err := w.lastEvents(ctx, ids)
		if err != nil || len(got) != n {
			b.Fatalf("%d last events of %d, %v", len(got), n, err)
		}
	}
	b.ReportMetric(float64(batches())/float64(ops), "batches/op")
	b.ReportMetric(float64(singles())/float64(ops), "single-reads/op")
}

// BenchmarkUnpinLookups: the stream lookups of a stop that unpins five
// hosts through one hostshare.Unpinner (each unpin asks it for the work
// stream's handle).
func BenchmarkUnpinLookups(b *testing.B) {
	_, nc, js, ctx := setUpTopology(b)
	lookups := countOf(b, nc, "$JS.API.STREAM.INFO."+messages.StreamWork)
	ops := 0
	for b.Loop() {
		ops++
		u := hostshare.NewUnpinner(js)
		for range 5 {
			if st, err := u.Stream(ctx); err != nil || st == nil {
				b.Fatalf("stream %s: %v", messages.StreamWork, err)
			}
		}
	}
	b.ReportMetric(float64(lookups())/float64(ops), "lookups/op")
}

// BenchmarkPlacementRecordReads: the host records one create placed on a
// fleet of 50 hosts, 45 of them full in the view, reads.
func BenchmarkPlacementRecordReads(b *testing.B) {
	w := placementRig(b, 50, 45)
	reads := countOf(b, w.js.Conn(), "$JS.API.DIRECT.GET.KV_"+messages.BucketHosts+".>")
	ctx := context.Background()
	ops := 0
	for b.Loop() {
		ops++
		host, ferr, err := w.placeByRoom(ctx, fmt.Sprintf("p%d", ops), uint64(ops))
		if err != nil || ferr != nil || host == "" {
			b.Fatalf("p%d placed on %q: %v %v", ops, host, ferr, err)
		}
	}
	b.ReportMetric(float64(reads())/float64(ops), "record-reads/op")
}
