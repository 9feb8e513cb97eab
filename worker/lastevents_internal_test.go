package worker

import (
	"fmt"
	"testing"
	"time"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// lastEvents reads the last event of each id that has one, however many
// ids a pass asks for (the server answers at most 1,024 subjects a
// request; it asks for jsapi.MaxBatch at a time), and leaves out those
// with none.
func TestLastEventsReadsEveryIdInBatches(t *testing.T) {
	_, _, js, ctx := setUpTopology(t)
	subj := messages.NewSubjects("")
	p, err := newEventPublisher(ctx, js, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2*jsapi.MaxBatch + 17
	var ids []string
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		ids = append(ids, id, "none"+id) // every other id has no event
		state, host := messages.StateRunning, "h1"
		if i%3 == 0 {
			state, host = messages.StateProvisioning, "h2"
		}
		if _, err := p.Publish(ctx, messages.StateEvent{ID: id, State: state, Host: host, IP: "198.18.0.1", CommandID: "c", CommandSeq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// An event of a later command for p0: the last one is read.
	if _, err := p.Publish(ctx, messages.StateEvent{ID: "p0", State: messages.StateFailed, Host: "h2", CommandID: "c2", CommandSeq: 2}); err != nil {
		t.Fatal(err)
	}
	w := &Worker{metrics: newMetrics(), js: js, subj: subj}
	got, err := w.lastEvents(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d last events of %d ids, %d of which have one", len(got), len(ids), n)
	}
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		ev, ok := got[id]
		want, host := messages.StateRunning, "h1"
		if i%3 == 0 {
			want, host = messages.StateProvisioning, "h2"
		}
		if i == 0 {
			want = messages.StateFailed
		}
		if !ok || ev.State != want || ev.Host != host || ev.Seq == 0 {
			t.Errorf("%s: %+v (found %v), want %s on %s", id, ev, ok, want, host)
		}
	}
	if none, err := w.lastEvents(ctx, []string{"x1", "x2"}); err != nil || len(none) != 0 {
		t.Errorf("ids with no event: %v, %v; want none, no error", none, err)
	}
}
