package worker

import (
	"container/list"
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
//
// A message waiting for a slot costs its place in a queue, not a
// goroutine: at most n runners take messages from the queue (started as
// messages come, ending when it is empty), and one ticker tells JetStream
// that every message held (waiting or running) is in progress, so a
// burst costs a worker memory by the message, not by the goroutine stack
// (TestPoolQueuesABurstWithoutAGoroutineEach).
type pool struct {
	n     int
	wg    sync.WaitGroup // every message submitted and not ended, the runners and the ticker
	log   *slog.Logger
	tick  time.Duration
	fence *fence // abandons in-flight work when cut off from NATS; nil: none
	// inFlight, if set, counts the messages submitted and not yet ended,
	// but for those isTick says are observation ticks.
	inFlight prometheus.Gauge
	isTick   func(jetstream.Msg) bool

	mu       sync.Mutex
	waiting  list.List              // of *poolItem, in the order they came
	held     map[*poolItem]struct{} // waiting or running
	runners  int
	stopTick chan struct{} // closed when none is held; nil: no ticker
}

// poolItem is one message from submit until its handler returned (or it
// was handed back without running).
type poolItem struct {
	ctx     context.Context
	msg     jetstream.Msg
	handle  func(context.Context, jetstream.Msg)
	release func()        // the fence binding and stopCtx
	elem    *list.Element // in waiting, nil once taken
	counted bool
}

// newPool ticks InProgress every quarter of ackWait (see fence for why a
// quarter).
func newPool(n int, ackWait time.Duration, log *slog.Logger, f *fence) *pool {
	t := ackWait / 4
	if t <= 0 {
		t = time.Second
	}
	return &pool{n: max(n, 1), log: log, tick: t, fence: f, held: map[*poolItem]struct{}{}}
}

// submit queues msg; the pool owns it until its handler returns. msg is
// bound to the fence's generation of its delivery: waiting for a slot
// counts as in flight. A message whose ctx ends while it waits is handed
// back at once, never started.
func (p *pool) submit(ctx context.Context, msg jetstream.Msg, handle func(context.Context, jetstream.Msg)) {
	ctx, release := p.fence.bind(ctx)
	it := &poolItem{ctx: ctx, msg: msg, handle: handle}
	it.counted = p.inFlight != nil && (p.isTick == nil || !p.isTick(msg))
	if it.counted {
		p.inFlight.Inc()
	}
	p.wg.Add(1)
	stopCtx := context.AfterFunc(ctx, func() { p.abandon(it) })
	it.release = func() { stopCtx(); release() }

	p.mu.Lock()
	defer p.mu.Unlock()
	it.elem = p.waiting.PushBack(it)
	p.held[it] = struct{}{}
	if p.stopTick == nil {
		p.stopTick = make(chan struct{})
		p.wg.Add(1)
		go p.ticker(p.stopTick)
	}
	if p.runners < p.n {
		p.runners++
		p.wg.Add(1)
		go p.run()
	}
}

// run takes waiting messages and handles them until none is left.
func (p *pool) run() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		front := p.waiting.Front()
		if front == nil {
			p.runners--
			p.mu.Unlock()
			return
		}
		it := p.waiting.Remove(front).(*poolItem)
		it.elem = nil
		p.mu.Unlock()
		if it.ctx.Err() != nil {
			_ = it.msg.NakWithDelay(0) // never started: hand it back now
		} else {
			it.handle(it.ctx, it.msg)
		}
		p.end(it)
	}
}

// abandon hands back it if it is still waiting when its ctx ends.
func (p *pool) abandon(it *poolItem) {
	p.mu.Lock()
	if it.elem == nil {
		p.mu.Unlock()
		return // running (its handler sees ctx) or ended
	}
	p.waiting.Remove(it.elem)
	it.elem = nil
	p.mu.Unlock()
	_ = it.msg.NakWithDelay(0) // never started: hand it back now
	p.end(it)
}

// end forgets it, which no longer runs nor waits.
func (p *pool) end(it *poolItem) {
	p.mu.Lock()
	delete(p.held, it)
	if len(p.held) == 0 && p.stopTick != nil {
		close(p.stopTick)
		p.stopTick = nil
	}
	p.mu.Unlock()
	it.release()
	if it.counted {
		p.inFlight.Dec()
	}
	p.wg.Done()
}

// ticker tells JetStream every tick that each message held is still being
// worked on, until stop is closed (none is held).
func (p *pool) ticker(stop <-chan struct{}) {
	defer p.wg.Done()
	t := time.NewTicker(p.tick)
	defer t.Stop()
	var msgs []jetstream.Msg
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		msgs = msgs[:0]
		for it := range p.held {
			msgs = append(msgs, it.msg)
		}
		p.mu.Unlock()
		for _, m := range msgs {
			_ = m.InProgress()
		}
		clear(msgs)
	}
}

func (p *pool) wait() { p.wg.Wait() }
