package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
)

// An event of an older command is never stored after one of a newer
// command. In the cluster test, a proxy's delete still running on its old
// host published "deleted" after its newer create had reported "running"
// from another host (another worker's), so the proxy ran but looked
// deleted, for good.
func TestEventOfAnOlderCommandIsNotStoredAfterANewerOne(t *testing.T) {
	_, _, js, ctx := setUpTopology(t)
	subj := messages.NewSubjects("")
	p, err := newEventPublisher(ctx, js, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(state, cmd string, cmdSeq uint64) error {
		_, err := p.Publish(ctx, messages.StateEvent{ID: "p1", State: state, Host: "h2", CommandID: cmd, CommandSeq: cmdSeq})
		return err
	}
	if err := publish(messages.StateDeleting, "c-delete", 5); err != nil {
		t.Fatal(err)
	}
	if err := publish(messages.StateRunning, "c-create", 9); err != nil {
		t.Fatal(err)
	}
	// The delete's last word comes late, from the old host.
	if err := publish(messages.StateDeleted, "c-delete", 5); !errors.Is(err, errEventSuperseded) {
		t.Errorf("the older command's event: %v, want errEventSuperseded", err)
	}
	last, _, err := p.last(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if last.State != messages.StateRunning || last.CommandID != "c-create" {
		t.Errorf("last event %s of %s, want running of c-create", last.State, last.CommandID)
	}
	// Events without a command sequence (older publishers) and of the
	// same command still go through.
	if err := publish(messages.StateRunning, "c-create", 9); err != nil {
		t.Errorf("the same command again: %v", err)
	}
	if err := publish(messages.StateFailed, "legacy", 0); err != nil {
		t.Errorf("an event without a command sequence: %v", err)
	}
}

// A proxy's next event from the publisher that stored its last one needs no
// read of the last message: the publisher remembers where that one was
// stored, and the server checks it. Another publisher's event in between
// (another worker's) makes the server refuse the remembered sequence, and
// the publisher reads again: seqs still grow by one, and an older
// command's event is still not stored after a newer one's.
func TestEventsOfOneProxyNeedNoReadUnlessAnotherPublished(t *testing.T) {
	srv, nc, js, ctx := setUpTopology(t)
	reads := countOf(t, nc, "$JS.API.DIRECT.GET."+messages.StreamEvents+".>")
	p, other := twoPublishers(t, srv, js)
	var err error
	publish := func(p *eventPublisher, state, cmd string, cmdSeq uint64) (messages.StateEvent, error) {
		return p.Publish(ctx, messages.StateEvent{ID: "p1", State: state, Host: "h1", CommandID: cmd, CommandSeq: cmdSeq})
	}
	readsOf := func(what string, f func()) int {
		before := reads()
		f()
		n := reads() - before
		t.Logf("%s: %d reads of the last message", what, n)
		return n
	}
	var first, second messages.StateEvent
	readsOf("first event", func() {
		if first, err = publish(p, messages.StateProvisioning, "c1", 3); err != nil {
			t.Fatal(err)
		}
	})
	if n := readsOf("next event, same publisher", func() {
		if second, err = publish(p, messages.StateRunning, "c1", 3); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("the next event of the same publisher read the last message %d times, want 0", n)
	}
	if second.Seq != first.Seq+1 {
		t.Errorf("seq %d after %d, want %d", second.Seq, first.Seq, first.Seq+1)
	}
	// Another worker reports a newer command in between.
	third, err := publish(other, messages.StateProvisioning, "c2", 7)
	if err != nil {
		t.Fatal(err)
	}
	if third.Seq != second.Seq+1 {
		t.Errorf("the other publisher's seq %d after %d, want %d", third.Seq, second.Seq, second.Seq+1)
	}
	if _, err := publish(p, messages.StateFailed, "c1", 3); !errors.Is(err, errEventSuperseded) {
		t.Errorf("the older command's event after the other's newer one: %v, want errEventSuperseded", err)
	}
	fourth, err := publish(p, messages.StateRunning, "c2", 7)
	if err != nil {
		t.Fatal(err)
	}
	if fourth.Seq != third.Seq+1 {
		t.Errorf("seq %d after the other publisher's %d, want %d", fourth.Seq, third.Seq, third.Seq+1)
	}
	last, _, err := p.last(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if last.Seq != fourth.Seq || last.State != messages.StateRunning || last.CommandID != "c2" {
		t.Errorf("last event: seq %d %s of %s, want seq %d running of c2", last.Seq, last.State, last.CommandID, fourth.Seq)
	}
}

// The first events of many new proxies published at once read the
// stream's last sequence once, not once each (a STREAM.INFO, a whole
// configuration to decode, for every create of a burst), and each one's
// seq is still above every message stored before its own read.
func TestFirstEventsShareOneReadOfTheStream(t *testing.T) {
	_, nc, js, ctx := setUpTopology(t)
	subj := messages.NewSubjects("")
	p, err := newEventPublisher(ctx, js, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	infos := countOf(t, nc, "$JS.API.STREAM.INFO."+messages.StreamEvents)
	// Messages stored before: their sequences are the floor.
	for i := range 5 {
		if _, err := p.Publish(ctx, messages.StateEvent{ID: fmt.Sprintf("old%d", i), State: messages.StateRunning, Host: "h1", CommandID: "c", CommandSeq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	floor := st.CachedInfo().State.LastSeq
	before := infos()

	// Every publish reads its proxy's last event (none), then waits for
	// the stream's: held until all have read theirs.
	const n = 64
	p.infoMu.Lock()
	base := p.reads.Load() // the reads clock counts the publishes above too
	seqs := make([]uint64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ev, err := p.Publish(ctx, messages.StateEvent{ID: fmt.Sprintf("p%d", i), State: messages.StateProvisioning, Host: "h1", CommandID: "c", CommandSeq: 2})
			seqs[i], errs[i] = ev.Seq, err
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for p.reads.Load() < base+n {
		if time.Now().After(deadline) {
			p.infoMu.Unlock()
			wg.Wait()
			t.Fatalf("%d of %d publishes read their last event within 20s", p.reads.Load()-base, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.infoMu.Unlock()
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("p%d: %v", i, errs[i])
		}
		if seqs[i] <= floor {
			t.Errorf("p%d's first event has seq %d, want above %d, the stream's last sequence before", i, seqs[i], floor)
		}
	}
	if got := infos() - before; got != 1 {
		t.Errorf("%d first events read the stream %d times; want once", n, got)
	}
}

// A core subscriber of a proxy's state subject (a client waiting on it,
// as the CLI and the tests' harness do) sees each stored event once and
// no other, even when
// a worker that remembers nothing of the proxy publishes the first event
// of a create for it (a redelivery to another worker, say). A publish
// JetStream refuses still reaches core subscribers: a first event sent on
// the guess that nothing is on record, its seq taken from the stream's
// last sequence, and refused, would show them an event never stored, its
// seq far above the proxy's, and every event after it would seem to go
// back.
func TestCoreSubscribersSeeOnlyStoredEvents(t *testing.T) {
	srv, _, js, ctx := setUpTopology(t)
	subj := messages.NewSubjects("")
	nc, _ := srv.Connect(t) // a client's own connection
	sub, err := nc.SubscribeSync(subj.State("p1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p, other := twoPublishers(t, srv, js)
	// Other proxies' events raise the stream's last sequence.
	for i := range 20 {
		if _, err := p.Publish(ctx, messages.StateEvent{ID: fmt.Sprintf("q%d", i), State: messages.StateRunning, Host: "h1", CommandID: "cq", CommandSeq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Publish(ctx, messages.StateEvent{ID: "p1", State: messages.StateProvisioning, Host: "h1", CommandID: "c1", CommandSeq: 3}); err != nil {
		t.Fatal(err)
	}
	// The create's first event, from a worker that never saw p1.
	if err := firstEvent(ctx, other, messages.StateEvent{ID: "p1", State: messages.StateProvisioning, Host: "h1", CommandID: "c1", CommandSeq: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Publish(ctx, messages.StateEvent{ID: "p1", State: messages.StateRunning, Host: "h1", CommandID: "c1", CommandSeq: 3}); err != nil {
		t.Fatal(err)
	}
	// Core delivery from two connections need not keep the order the
	// events were stored in; what must hold is that each stored event
	// comes once and nothing else does.
	seen := map[uint64]string{}
	for n := 0; n < 3; n++ {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("event %d of p1 on its subject: %v", n+1, err)
		}
		var ev messages.StateEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[ev.Seq]; dup {
			t.Fatalf("a core subscriber saw seq %d twice (%s, then %s)", ev.Seq, prev, ev.State)
		}
		seen[ev.Seq] = ev.State
	}
	if m, err := sub.NextMsg(time.Second); err == nil {
		t.Errorf("a fourth message on p1's subject: %s", m.Data)
	}
}

// twoPublishers returns an event publisher on js and one on a connection
// of its own, as two workers' are.
func twoPublishers(t *testing.T, srv *natstest.Server, js jetstream.JetStream) (*eventPublisher, *eventPublisher) {
	t.Helper()
	_, js2 := srv.Connect(t)
	subj := messages.NewSubjects("")
	p, err := newEventPublisher(t.Context(), js, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := newEventPublisher(t.Context(), js2, subj, time.Hour, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return p, other
}

// firstEvent publishes ev as a create that found no domain publishes its
// first event.
func firstEvent(ctx context.Context, p *eventPublisher, ev messages.StateEvent) error {
	_, err := p.Publish(ctx, ev)
	return err
}
