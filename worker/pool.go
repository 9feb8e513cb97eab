package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// pool runs handle for every message of a consumer, at most n at once,
// keeping each message in progress while it waits or runs. The intake and
// every host's executor run on one each (see consumerRun); wait returns
// once every handler has returned.
type pool struct {
	sem   chan struct{}
	wg    sync.WaitGroup
	log   *slog.Logger
	tick  time.Duration
	fence *fence // abandons in-flight work when cut off from NATS; nil: none
	// inFlight, if set, counts the messages submitted and not yet ended,
	// but for those isTick says are observation ticks.
	inFlight prometheus.Gauge
	isTick   func(jetstream.Msg) bool
}

// newPool ticks InProgress every quarter of ackWait (see fence for why a
// quarter).
func newPool(n int, ackWait time.Duration, log *slog.Logger, f *fence) *pool {
	t := ackWait / 4
	if t <= 0 {
		t = time.Second
	}
	return &pool{sem: make(chan struct{}, n), log: log, tick: t, fence: f}
}

// submit starts a goroutine for msg; it owns msg until it returns. msg is
// bound to the fence's generation of its delivery: waiting for a slot
// counts as in flight.
func (p *pool) submit(ctx context.Context, msg jetstream.Msg, handle func(context.Context, jetstream.Msg)) {
	ctx, release := p.fence.bind(ctx)
	counted := p.inFlight != nil && (p.isTick == nil || !p.isTick(msg))
	if counted {
		p.inFlight.Inc()
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer release()
		if counted {
			defer p.inFlight.Dec()
		}
		stop := keepInProgress(msg, p.tick)
		defer stop()
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			_ = msg.NakWithDelay(0) // never started: hand it back now
			return
		}
		defer func() { <-p.sem }()
		handle(ctx, msg)
	}()
}

func (p *pool) wait() { p.wg.Wait() }

// keepInProgress tells JetStream every tick that msg is still being worked
// on, until the returned func is called.
func keepInProgress(msg jetstream.Msg, tick time.Duration) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
