package worker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// syncBuf is a log sink safe for concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func logTo(b *syncBuf) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// A worker never creates a stream: it waits, saying so at error level,
// until set-up has created it.
func TestWorkerWaitsForTheStreams(t *testing.T) {
	r := newRig(t, "h1")
	var logs syncBuf
	w, err := worker.New(r.js, worker.Config{
		Subjects: subj, Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img"},
		CheckInterval: 50 * time.Millisecond, Logger: logTo(&logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	run := runtest.Go(t, w.Run)
	poll.Until(t, "an error-level log of the missing stream", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `level=ERROR msg="stream PROXY_CMDS is missing`)
	})
	if names, _ := streamNames(r.js); len(names) != 0 {
		t.Fatalf("the worker created %v", names)
	}
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctxFor(t, 10*time.Second), r.js); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Started():
	case <-run.Done():
		t.Fatalf("the worker stopped: %v", run.Err())
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not start once the streams were there")
	}
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
}

func streamNames(js jetstream.JetStream) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		out = append(out, n)
	}
	return out, l.Err()
}

// A worker whose config disagrees with a stream refuses to start, naming
// the setting and pointing to set-up.
func TestWorkerRefusesAStreamThatDisagrees(t *testing.T) {
	r := newRig(t, "h1")
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctxFor(t, 10*time.Second), r.js); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(r.js, worker.Config{
		Subjects: subj, Topology: topology.Topology{DuplicateWindow: time.Minute},
		Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img"}, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = runtest.Go(t, w.Run).Wait(10 * time.Second)
	var me *topology.MismatchError
	if !errors.As(err, &me) || me.Name != messages.StreamCommands || me.Diffs[0].Field != "duplicate_window" ||
		!strings.Contains(err.Error(), "proxyfleet setup") {
		t.Fatalf("run = %v, want a mismatch of PROXY_CMDS's duplicate_window pointing to proxyfleet setup", err)
	}
}

// A worker applies its consumer settings to the consumers that exist,
// saying what it changed; one the server refuses to change keeps it from
// starting, naming the setting.
func TestWorkerUpdatesItsConsumers(t *testing.T) {
	r := newRig(t, "h1")
	ctx := ctxFor(t, 20*time.Second)
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	cfg := worker.Config{
		Subjects: subj, Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img"},
		Providers: map[string]worker.Provider{"h1": simHost(t, r, "h1")},
		AckWait:   7 * time.Second, MaxAttempts: 3, PinnedTTL: 4 * time.Second, Logger: logTo(&logs),
	}
	w, err := worker.New(r.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := runtest.Start(t, w.Run, w.Started(), 10*time.Second).Stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ stream, name string }{{messages.StreamCommands, topology.IntakeConsumer}, {messages.StreamWork, topology.WorkConsumer("h1")}} {
		cons, err := r.js.Consumer(ctx, c.stream, c.name)
		if err != nil {
			t.Fatal(err)
		}
		cc := cons.CachedInfo().Config
		if cc.AckWait != 7*time.Second || cc.MaxDeliver != 2*3+5 {
			t.Errorf("%s: ack wait %s, max deliver %d; want 7s and 11", c.name, cc.AckWait, cc.MaxDeliver)
		}
		if c.stream == messages.StreamWork && cc.PinnedTTL != 4*time.Second {
			t.Errorf("%s: pinned ttl %s, want 4s", c.name, cc.PinnedTTL)
		}
	}
	if !strings.Contains(logs.String(), "ack_wait 30s → 7s, max_deliver 21 → 11") ||
		!strings.Contains(logs.String(), "priority_timeout 15s → 4s") {
		t.Errorf("the updates were not logged as old → new:\n%s", logs.String())
	}

	// With a redelivery backoff of 15 steps, max deliver may not go
	// below 15: the server refuses the update.
	if err := r.js.DeleteConsumer(ctx, messages.StreamCommands, topology.IntakeConsumer); err != nil {
		t.Fatal(err)
	}
	backoff := make([]time.Duration, 15)
	for i := range backoff {
		backoff[i] = time.Second
	}
	if _, err := r.js.CreateConsumer(ctx, messages.StreamCommands, jetstream.ConsumerConfig{
		Durable: topology.IntakeConsumer, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 20, BackOff: backoff,
	}); err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quietLogger()
	w, err = worker.New(r.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = runtest.Go(t, w.Run).Wait(10 * time.Second)
	var re *topology.RefusedError
	if !errors.As(err, &re) || len(re.Refused) != 1 || re.Refused[0].Field != "max_deliver" {
		t.Fatalf("run over an intake with a backoff = %v, want a refusal naming max_deliver", err)
	}
}

func simHost(t *testing.T, r *rig, h string) worker.Provider {
	d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
