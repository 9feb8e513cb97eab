package client

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWatchTerminalClearsScreen runs the terminal form of PrintWatch: the screen
// is cleared before each table, the initial picture is drawn at once, and a
// proxy that is deleted and created anew (its event seq starting over) is
// not hidden behind its old, higher seq.
func TestWatchTerminalClearsScreen(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	pub := func(ev messages.StateEvent) {
		t.Helper()
		b, _ := json.Marshal(ev)
		if _, err := js.Publish(ctx, subj.State(ev.ID), b); err != nil {
			t.Fatal(err)
		}
	}
	pub(messages.StateEvent{V: 1, ID: "p1", State: "deleted", Host: "h1", Seq: 7})
	c, err := New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	var buf lockedBuf
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		wt, err := c.Watch(wctx)
		if err != nil {
			done <- err
			return
		}
		defer wt.Stop()
		done <- PrintWatch(&buf, wt, 20*time.Millisecond, WithWatchMode(WatchTable), func(o *watchOptions) { o.term = &yes })
	}()
	if !poll.Wait(10*time.Second, func() bool { return strings.Contains(buf.String(), "deleted") }) {
		t.Fatalf("initial picture not drawn: %q", buf.String())
	}
	pub(messages.StateEvent{V: 1, ID: "p1", State: "running", Host: "h1", IP: "198.18.0.9", Port: 3128, Seq: 1})
	if !poll.Wait(10*time.Second, func() bool { return strings.Contains(buf.String(), "198.18.0.9") }) {
		t.Fatalf("the new life of p1 is not shown: %q", buf.String())
	}
	wcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, clearScreen) {
		t.Fatalf("output does not start by clearing the screen: %q", out[:min(40, len(out))])
	}
	frames := strings.Split(out, clearScreen)[1:]
	last := frames[len(frames)-1]
	if !strings.Contains(last, "1 running") || !strings.Contains(last, "p1") || strings.Contains(last, "deleted") {
		t.Fatalf("last frame:\n%s", last)
	}
	for _, col := range WatchColumns {
		if !strings.Contains(last, col) {
			t.Fatalf("last frame lacks column %s:\n%s", col, last)
		}
	}
}

// TestWaitFindsAMissedAnswer: an answer the subscription never saw (here:
// one published before the command) is found in PROXY_RESULTS.
func TestWaitFindsAMissedAnswer(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := messages.NewSubjects("")
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(messages.Result{V: 1, ID: "p1", CommandID: "cx", Op: "create", Outcome: "done"})
	if _, err := js.Publish(ctx, subj.Result("p1"), b); err != nil {
		t.Fatal(err)
	}
	c, err := New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	c.rescan = 20 * time.Millisecond
	out, err := c.Create(ctx, messages.CreateCommand{ID: "p1"}, "cx", true)
	if err != nil {
		t.Fatal(err)
	}
	if out.Duplicate || out.Final == nil || out.Final.Outcome != messages.OutcomeDone {
		t.Fatalf("outcome = %+v", out)
	}
}
