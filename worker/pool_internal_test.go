package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
)

// A burst of messages on a pool of two: the waiting ones cost no goroutine
// each, all are kept in progress while they wait (none is
// redelivered though they wait several AckWaits), and when their context
// ends the waiting ones are handed back without running while the running
// ones end.
func TestPoolQueuesABurstWithoutAGoroutineEach(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "POOL", Subjects: []string{"pool.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("pool.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	const ackWait = 400 * time.Millisecond
	cons, err := js.CreateConsumer(ctx, "POOL", jetstream.ConsumerConfig{Durable: "pool", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxAckPending: n})
	if err != nil {
		t.Fatal(err)
	}

	p := newPool(2, ackWait, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	release := make(chan struct{})
	var started, redelivered atomic.Int32
	handle := func(ctx context.Context, m jetstream.Msg) {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		_ = m.Ack()
	}
	var submitted atomic.Int32
	before := runtime.NumGoroutine()
	workCtx, stopWork := context.WithCancel(context.Background())
	defer stopWork()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if meta, err := m.Metadata(); err == nil && meta.NumDelivered > 1 {
			redelivered.Add(1)
			_ = m.Term()
			return
		}
		submitted.Add(1)
		p.submit(workCtx, m, handle)
	}, jetstream.PullMaxMessages(64))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	poll.Until(t, "every message submitted", 30*time.Second, func() bool { return submitted.Load() == n })
	grown := runtime.NumGoroutine() - before
	if grown > 40 {
		t.Errorf("%d messages waiting on a pool of 2: %d more goroutines; want a few (the runners, the ticker, the consume's)", n, grown)
	}
	// Several AckWaits: the ticker keeps every waiting message.
	deadline := time.Now().Add(3 * ackWait)
	poll.Until(t, "three AckWaits", 10*time.Second, func() bool { return time.Now().After(deadline) })
	if got := redelivered.Load(); got != 0 {
		t.Errorf("%d messages redelivered while they waited in progress; want none", got)
	}
	if got := started.Load(); got != 2 {
		t.Errorf("%d handlers started on a pool of 2", got)
	}

	// The work's context ends: the two running end, the rest are
	// handed back unstarted.
	cc.Stop()
	stopWork()
	waited := make(chan struct{})
	go func() { p.wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("pool.wait did not return after the work's context ended")
	}
	if got := started.Load(); got != 2 {
		t.Errorf("%d handlers started in all; want the 2 that ran, the others handed back", got)
	}
	// Acks are published without waiting for the server: read the
	// consumer until they are in (a fresh machine's CI read it at once
	// and found the floor at 0).
	var floor uint64
	poll.Until(t, "the two acks at the consumer", 30*time.Second, func() bool {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		floor = info.AckFloor.Stream
		return floor >= 2
	})
	if floor != 2 {
		t.Errorf("ack floor at stream sequence %d; want 2 (the two that ran, first come first run)", floor)
	}
}
