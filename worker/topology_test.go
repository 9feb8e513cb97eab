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

// Setup creates everything, then finds nothing to do, then updates in place
// what a changed config asks for, naming each setting old → new.
func TestSetupCreatesThenUpdates(t *testing.T) {
	r := newRig(t, "h1")
	ctx := ctxFor(t, 20*time.Second)
	topo := worker.Topology{Subjects: subj}
	changes, err := topo.Setup(ctx, r.js)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 12 {
		t.Fatalf("first setup made %d changes, want 12 creations: %v", len(changes), changes)
	}
	for _, c := range changes {
		if !c.Created {
			t.Fatalf("first setup: %v", c)
		}
	}
	if changes, err = topo.Setup(ctx, r.js); err != nil || len(changes) != 0 {
		t.Fatalf("second setup: %v, %v; want nothing to do", changes, err)
	}

	topo.ResultsMaxAge = 2 * time.Hour
	topo.DuplicateWindow = time.Minute
	topo.CommandIDMaxAge = 48 * time.Hour
	changes, err = topo.Setup(ctx, r.js)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range changes {
		if c.Created {
			t.Fatalf("created %s on an update", c.Name)
		}
		got[c.Name] = c.String()
	}
	want := map[string]string{
		messages.StreamCommands: "updated stream PROXY_CMDS: duplicate_window 2m0s → 1m0s",
		messages.StreamResults:  "updated stream PROXY_RESULTS: max_age 24h0m0s → 2h0m0s, duplicate_window 2m0s → 1m0s",
		messages.StreamDead:     "updated stream PROXY_DEAD: duplicate_window 2m0s → 1m0s",
		messages.BucketCommands: "updated bucket PROXY_CMDIDS: ttl 168h0m0s → 48h0m0s",
	}
	if len(got) != len(want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	st, err := r.js.Stream(ctx, messages.StreamResults)
	if err != nil || st.CachedInfo().Config.MaxAge != 2*time.Hour {
		t.Fatalf("PROXY_RESULTS after the update: %+v, %v", st.CachedInfo().Config, err)
	}
}

// A setting JetStream cannot change in place is refused, and Setup names it.
func TestSetupNamesARefusedSetting(t *testing.T) {
	r := newRig(t, "h1")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: messages.StreamDead, Subjects: []string{subj.DeadAll()}, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	changes, err := worker.Topology{Subjects: subj}.Setup(ctx, r.js)
	var re *worker.RefusedError
	if !errors.As(err, &re) || re.Name != messages.StreamDead || len(re.Refused) != 1 || re.Refused[0].Field != "storage" {
		t.Fatalf("setup over a memory PROXY_DEAD: err = %v, want a refusal naming storage", err)
	}
	if !strings.Contains(err.Error(), "storage Memory → File") {
		t.Errorf("error %q does not say what it would have changed", err)
	}
	// What it could change, it changed; the rest was created.
	var updated []string
	for _, c := range changes {
		if !c.Created {
			updated = append(updated, c.String())
		}
	}
	if len(updated) != 1 || !strings.Contains(updated[0], "max_age unlimited → 720h0m0s") {
		t.Fatalf("updates %v, want PROXY_DEAD's max_age applied beside the refused storage", updated)
	}
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
	if _, err := (worker.Topology{Subjects: subj}).Setup(ctxFor(t, 10*time.Second), r.js); err != nil {
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
	if _, err := (worker.Topology{Subjects: subj}).Setup(ctxFor(t, 10*time.Second), r.js); err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(r.js, worker.Config{
		Subjects: subj, Topology: worker.Topology{DuplicateWindow: time.Minute},
		Catalog: worker.Catalog{Hosts: []string{"h1"}, Images: []string{"img"}, DefaultImage: "img"}, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = runtest.Go(t, w.Run).Wait(10 * time.Second)
	var me *worker.MismatchError
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
	if err := (worker.Topology{Subjects: subj}).Ensure(ctx, r.js, []string{"h1"}); err != nil {
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
	for _, c := range []struct{ stream, name string }{{messages.StreamCommands, worker.IntakeConsumer}, {messages.StreamWork, worker.WorkConsumer("h1")}} {
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
	if err := r.js.DeleteConsumer(ctx, messages.StreamCommands, worker.IntakeConsumer); err != nil {
		t.Fatal(err)
	}
	backoff := make([]time.Duration, 15)
	for i := range backoff {
		backoff[i] = time.Second
	}
	if _, err := r.js.CreateConsumer(ctx, messages.StreamCommands, jetstream.ConsumerConfig{
		Durable: worker.IntakeConsumer, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 20, BackOff: backoff,
	}); err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quietLogger()
	w, err = worker.New(r.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = runtest.Go(t, w.Run).Wait(10 * time.Second)
	var re *worker.RefusedError
	if !errors.As(err, &re) || len(re.Refused) != 1 || re.Refused[0].Field != "max_deliver" {
		t.Fatalf("run over an intake with a backoff = %v, want a refusal naming max_deliver", err)
	}
}

// The repairer recreates what was deleted, each stream above the last
// sequence it saw, so sequences keep growing.
func TestRepairerRecreatesAboveTheLastSequence(t *testing.T) {
	r := newRig(t, "h1")
	rep := r.startRepairer(50 * time.Millisecond)
	ctx := ctxFor(t, 30*time.Second)
	for range 3 {
		if _, err := r.js.Publish(ctx, subj.State("p1"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if n := rep.Check(ctx); n != 0 { // a look at PROXY_EVENTS at sequence 3
		t.Fatalf("a check with nothing missing recreated %d", n)
	}
	if err := r.js.DeleteStream(ctx, messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if err := r.js.DeleteKeyValue(ctx, messages.BucketDesired); err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	poll.Until(t, "PROXY_EVENTS back", 10*time.Second, func() bool {
		st, err := r.js.Stream(ctx, messages.StreamEvents)
		if err == nil {
			info = st.CachedInfo()
		}
		return err == nil
	})
	if info.State.FirstSeq != 3+worker.FirstSeqMargin {
		t.Fatalf("recreated PROXY_EVENTS starts at %d, want above 3 (+ margin)", info.State.FirstSeq)
	}
	poll.Until(t, "PROXY_DESIRED back", 10*time.Second, func() bool {
		_, err := r.js.KeyValue(ctx, messages.BucketDesired)
		return err == nil
	})
	poll.Until(t, "two repairs counted", 10*time.Second, func() bool { return rep.Repairs() == 2 })
}

func simHost(t *testing.T, r *rig, h string) worker.Provider {
	d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return d
}
