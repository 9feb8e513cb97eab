package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// stepBackoff returns attempt × step and records what was asked.
type stepBackoff struct {
	step time.Duration
	mu   sync.Mutex
	asks []int
}

func (b *stepBackoff) Delay(attempt int) time.Duration {
	b.mu.Lock()
	b.asks = append(b.asks, attempt)
	b.mu.Unlock()
	return time.Duration(attempt) * b.step
}

type retryLog struct {
	mu  sync.Mutex
	got []worker.RetryInfo
}

func (l *retryLog) add(ri worker.RetryInfo) { l.mu.Lock(); l.got = append(l.got, ri); l.mu.Unlock() }
func (l *retryLog) list() []worker.RetryInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]worker.RetryInfo(nil), l.got...)
}

var fixedNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func retryRig(t *testing.T) (*rig, *stepBackoff, *retryLog) {
	r := newRig(t, "h1")
	b := &stepBackoff{step: 15 * time.Millisecond}
	l := &retryLog{}
	r.startWorker(func(c *worker.Config) {
		c.Backoff = b
		c.OnRetry = l.add
		c.Now = func() time.Time { return fixedNow }
		c.MaxAttempts = 4
	})
	return r, b, l
}

func TestTransientErrorsRetryWithGrowingDelays(t *testing.T) {
	r, _, l := retryRig(t)
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "create", Class: fleet.ClassTransient, Count: 3}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	got := l.list()
	if len(got) != 3 {
		t.Fatalf("%d retries, want 3: %+v", len(got), got)
	}
	for i, ri := range got {
		if ri.Attempt != i+1 || ri.Delay != time.Duration(i+1)*15*time.Millisecond {
			t.Errorf("retry %d: attempt %d delay %s, want attempt %d delay %s", i, ri.Attempt, ri.Delay, i+1, time.Duration(i+1)*15*time.Millisecond)
		}
		if !fleet.IsTransient(ri.Err) {
			t.Errorf("retry %d: error %v is not transient", i, ri.Err)
		}
	}
	ev, _ := r.lastEvent("p1")
	if ev.State != messages.StateRunning || !ev.At.Equal(fixedNow) {
		t.Fatalf("last event %+v, want running at the injected clock's %s", ev, fixedNow)
	}
	if n := len(readLines(r.hostDir("h1") + "/creates.log")); n != 2 {
		t.Errorf("creates.log has %d fields, want one create (2 fields)", n)
	}
}

func TestPermanentErrorFailsAfterOneAttempt(t *testing.T) {
	r, b, l := retryRig(t)
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "create", Class: fleet.ClassPermanent, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	res := r.waitOutcome("c1", messages.OutcomeFailed)
	if res.Class != string(fleet.ClassPermanent) {
		t.Errorf("result class %q, want permanent", res.Class)
	}
	if n := len(l.list()); n != 0 {
		t.Errorf("%d retries of a permanent error", n)
	}
	b.mu.Lock()
	asks := len(b.asks)
	b.mu.Unlock()
	if asks != 0 {
		t.Errorf("backoff asked %d times for a permanent error", asks)
	}
	ev, _ := r.lastEvent("p1")
	if ev.State != messages.StateFailed || ev.Class != "permanent" {
		t.Errorf("last event %+v, want failed, permanent", ev)
	}
	if r.domainExists("h1", "p1") {
		t.Error("a failed create left its domain behind")
	}
}

func TestStaysTransientEndsFailedAndDeadLettered(t *testing.T) {
	r, _, l := retryRig(t)
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "create", Class: fleet.ClassTransient, Count: -1}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	res := r.waitOutcome("c1", messages.OutcomeFailed)
	if res.Class != string(fleet.ClassTransient) {
		t.Errorf("class %q, want transient", res.Class)
	}
	if n := len(l.list()); n != 3 { // attempts 1..3 retried, the 4th fails
		t.Errorf("%d retries, want 3", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := r.js.Stream(ctx, messages.StreamDead)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj.Dead("p1"))
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	var dl messages.DeadLetter
	if err := json.Unmarshal(raw.Data, &dl); err != nil {
		t.Fatal(err)
	}
	if dl.CommandID != "c1" || dl.Attempts != 4 || dl.LastError == "" {
		t.Errorf("dead letter %+v", dl)
	}
	ev, _ := r.lastEvent("p1")
	if ev.State != messages.StateFailed {
		t.Errorf("last event %+v, want failed", ev)
	}
}
