package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// next reads one update, failing the test if none comes or the stream ends.
func next(t *testing.T, wt *client.Watcher) client.Update {
	t.Helper()
	select {
	case u, ok := <-wt.Updates():
		if !ok {
			t.Fatalf("updates closed early: %v", wt.Err())
		}
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("no update within 10s")
		return client.Update{}
	}
}

// ended waits for Updates to be closed, failing the test if it is not.
func ended(t *testing.T, wt *client.Watcher) {
	t.Helper()
	for {
		select {
		case u, ok := <-wt.Updates():
			if !ok {
				return
			}
			t.Logf("late update %+v", u)
		case <-time.After(10 * time.Second):
			t.Fatal("updates not closed within 10s")
		}
	}
}

// TestWatchStream: a watch starts from the latest event of every proxy in
// stream order, then delivers each later event once, in order; Stop and
// the end of its context both close the stream, and Err tells them apart.
func TestWatchStream(t *testing.T) {
	r := newRig(t, false)
	r.publishEvent(messages.StateEvent{ID: "p1", State: messages.StateProvisioning, Host: "h1", Seq: 1})
	r.publishEvent(messages.StateEvent{ID: "p1", State: messages.StateRunning, Host: "h1", IP: "198.18.0.1", Port: 3128, Seq: 2})
	r.publishEvent(messages.StateEvent{ID: "p2", State: messages.StateRunning, Host: "h1", IP: "198.18.0.2", Port: 3128, Seq: 1})

	wt, err := r.c.Watch(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Stop()
	init := wt.Initial()
	if len(init) != 2 || init[0].Event.ID != "p1" || init[0].Event.Seq != 2 || init[1].Event.ID != "p2" ||
		init[0].StreamSeq >= init[1].StreamSeq {
		t.Fatalf("initial = %+v, want p1's latest then p2's", init)
	}
	r.publishEvent(messages.StateEvent{ID: "p2", State: messages.StateDeleted, Host: "h1", Seq: 2})
	r.publishEvent(messages.StateEvent{ID: "p3", State: messages.StateProvisioning, Host: "h1", Seq: 1})
	u1, u2 := next(t, wt), next(t, wt)
	if u1.Event.ID != "p2" || u1.Event.State != messages.StateDeleted || u2.Event.ID != "p3" ||
		u1.StreamSeq <= init[1].StreamSeq || u2.StreamSeq <= u1.StreamSeq {
		t.Fatalf("updates %+v, %+v, want p2 deleted then p3, after the initial picture", u1, u2)
	}
	if err := wt.Err(); err != nil {
		t.Fatalf("err while running: %v", err)
	}
	wt.Stop()
	ended(t, wt)
	if err := wt.Err(); err != nil {
		t.Fatalf("err after Stop: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	wt, err = r.c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Stop()
	if len(wt.Initial()) != 3 {
		t.Fatalf("second watch's initial = %+v, want p1, p2, p3", wt.Initial())
	}
	cancel()
	ended(t, wt)
	if err := wt.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("err after the context ended: %v", err)
	}
}

// TestWatchEndsWhenTheConnectionCloses: a watch whose connection closes
// ends with that error instead of waiting forever for events.
func TestWatchEndsWhenTheConnectionCloses(t *testing.T) {
	r := newRig(t, false)
	r.publishEvent(messages.StateEvent{ID: "p1", State: messages.StateRunning, Host: "h1", Seq: 1})
	nc, err := nats.Connect(r.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	wt, err := c.Watch(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Stop()
	nc.Close()
	ended(t, wt)
	if err := wt.Err(); !errors.Is(err, jetstream.ErrConnectionClosed) {
		t.Fatalf("err after the connection closed: %v, want %v", err, jetstream.ErrConnectionClosed)
	}
}
