package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/worker/hostshare"
)

// Taking a host and handing it over, on the worker's side: a host's run
// pulls while the membership wants it to (package hostshare), learns its
// pin from the messages it is given, claims a host it starts to pull, and,
// handing one over, keeps the pin until the work already delivered has
// ended, then unpins the host (the pin's requests are hostshare's).

// A host's run is the Host the membership tells whether to pull.
var _ hostshare.Host = (*consumerRun)(nil)

// Pin is the pin the server gave the worker on the host; "" for none known.
func (c *consumerRun) Pin() string {
	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	return c.pin
}

// setPin records the pin the worker holds on the host ("" for none).
func (c *consumerRun) setPin(pin string) {
	c.pinMu.Lock()
	diff := c.pin != pin
	c.pin = pin
	c.pinMu.Unlock()
	if diff && c.changed != nil {
		c.changed()
	}
}

// dropPin forgets pin if it is still the one recorded.
func (c *consumerRun) dropPin(pin string) {
	c.pinMu.Lock()
	diff := c.pin == pin && pin != ""
	if diff {
		c.pin = ""
	}
	c.pinMu.Unlock()
	if diff && c.changed != nil {
		c.changed()
	}
}

// Pulling reports whether the run pulls its host, means to (repairing),
// or is still handing it over.
func (c *consumerRun) Pulling() bool { return c.pulling.Load() }

// Want tells the run whether to pull its host; the supervisor acts on it.
func (c *consumerRun) Want(pull bool) {
	if c.wanted.Swap(pull) != pull {
		select {
		case c.kick <- struct{}{}:
		default:
		}
		c.w.supervise(c)
	}
}

// deliver is the consume handler of a host run: it notes the pin, acks a
// claim, and runs everything else on the pool under ctx.
func (c *consumerRun) deliver(ctx context.Context, msg jetstream.Msg) {
	if pin := msg.Headers().Get(hostshare.PinHeader); pin != "" {
		c.setPin(pin)
	}
	if _, id, err := c.w.subj.ParseWork(msg.Subject()); err == nil && id == hostshare.ClaimToken {
		_ = msg.Ack()
		return
	}
	c.pool.submit(ctx, msg, c.handle)
}

// acquire starts pulling the host, which the membership assigned to this
// worker.
func (c *consumerRun) acquire(ctx context.Context) {
	cons, err := c.ensure(ctx)
	if err == nil {
		c.begin()
		if err = c.consume(cons); err != nil {
			c.workCancel()
		}
	}
	if err != nil {
		c.w.log.Error("could not start pulling host "+c.host+" (will retry)", "err", err)
		return
	}
	c.pulling.Store(true)
	if c.changed != nil {
		c.changed()
	}
	c.w.log.Info("pulling host", "host", c.host)
	hostshare.Claim(ctx, c.w.js, c.w.subj, c.host, c.w.log)
}

// stopPulling ends the run's pulls. While the connection is up it drains
// the consume context: the messages already delivered to the worker still
// reach the handler. With the connection down it stops it instead: a
// drain waits for the server to answer a flush (nats.go gives it 10s),
// which would hold up a stop that must fit the drain timeout, and the
// messages it drops could not be acked anyway (the server delivers them
// again after AckWait).
func (c *consumerRun) stopPulling() {
	if c.cc == nil {
		return
	}
	if c.w.js.Conn().Status() == nats.CONNECTED {
		c.cc.Drain()
		return
	}
	c.cc.Stop()
}

// begin starts an active period: the context the handlers of its
// deliveries run under.
func (c *consumerRun) begin() {
	c.workCtx, c.workCancel = context.WithCancel(c.runCtx)
}

// release hands the host over: it stops pulling, holds the pin while the
// work the host's consumer delivered ends (cancelling what is left after
// DrainTimeout: it is handed back), then unpins the host. If ctx ends
// first (the worker is stopping), the drain takes over.
func (c *consumerRun) release(ctx context.Context) {
	w := c.w
	start := time.Now()
	c.pulling.Store(false)
	if c.changed != nil {
		c.changed()
	}
	c.stopPulling()
	stop := c.holdPin()
	defer stop()
	if !c.awaitIdle(ctx, w.cfg.DrainTimeout) {
		return
	}
	c.cc, c.retired = nil, nil
	c.workCancel()
	stop()
	c.unpin(ctx)
	w.log.Info("handed host over", "host", c.host, "took", time.Since(start).Round(time.Millisecond))
}

// awaitIdle waits until the host run's consume contexts have closed and
// its handlers returned, cancelling them after timeout. It reports false
// if ctx ended first.
func (c *consumerRun) awaitIdle(ctx context.Context, timeout time.Duration) bool {
	var ccs []jetstream.ConsumeContext
	for _, cc := range append(c.retired, c.cc) {
		if cc != nil {
			ccs = append(ccs, cc)
		}
	}
	done := make(chan struct{})
	if !c.w.life.goIn(stageHandlers, func(context.Context) {
		// As in drain: the pool may be waited for only once every
		// consume that feeds it has closed.
		for _, cc := range ccs {
			<-cc.Closed()
		}
		c.pool.wait()
		close(done)
	}) {
		return false // the worker drains: it waits for the pools itself
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		c.w.log.Warn("handing host over: in-flight work past the drain timeout is handed back", "host", c.host)
		c.workCancel()
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// holdPin keeps the host's pin, if the worker holds it, until stop is
// called (see hostshare.HoldPin). An answer that the pin is not (or no
// longer) the consumer's means the worker lost it: it is forgotten, and
// nothing is held.
func (c *consumerRun) holdPin() (stop func()) {
	pin := c.Pin()
	if pin == "" || c.w.js.Conn().IsClosed() {
		return func() {}
	}
	stop, err := hostshare.HoldPin(c.w.js, c.host, pin, c.w.cfg.PinnedTTL, func() {
		c.w.log.Warn("lost the pin of host while handing it over", "host", c.host)
		c.dropPin(pin)
	})
	if err != nil {
		c.w.log.Warn("hold pin", "host", c.host, "err", err)
		return func() {}
	}
	return stop
}

// unpin releases the host's pin if the worker holds it, so the server pins
// the next worker that pulls it now instead of after PinnedTTL. It waits
// for one of the worker's unpin slots while ctx lasts, and no longer than
// the pin would; the worker's stop (ctx ends) leaves the pin to its own
// unpins. The unpin, once begun, has hostshare.UnpinTimeout.
func (c *consumerRun) unpin(ctx context.Context) {
	if c.Pin() == "" || c.w.js.Conn().IsClosed() {
		return // it expires after PinnedTTL
	}
	wait, cancel := context.WithTimeout(ctx, c.w.cfg.PinnedTTL)
	defer cancel()
	c.unpinWithin(wait, context.Background(), false)
}

// unpinOn is unpin within ctx, at the worker's stop (unpinHosts): it waits
// for an unpin slot while ctx lasts, then gives the unpin at most
// hostshare.UnpinTimeout.
func (c *consumerRun) unpinOn(ctx context.Context) {
	c.unpinWithin(ctx, ctx, true)
}

// unpinWithin unpins the host's consumer (see hostshare.Unpinner.Unpin)
// and forgets the pin whatever the server answers (a pin not released
// expires after pinned_ttl). Without a slot it keeps the pin, saying so if warnNoSlot;
// a stream it cannot look up keeps it too.
func (c *consumerRun) unpinWithin(wait, parent context.Context, warnNoSlot bool) {
	pin := c.Pin()
	if pin == "" {
		return
	}
	err := c.w.unpins.Unpin(wait, parent, c.host)
	switch {
	case errors.Is(err, hostshare.ErrNoUnpinSlot):
		if warnNoSlot {
			c.w.log.Warn("unpin host (the pin expires after pinned_ttl)", "host", c.host, "err", err)
		}
		return
	case errors.Is(err, hostshare.ErrUnpinLookup):
		c.w.log.Warn("unpin host", "host", c.host, "err", err)
		return
	case err != nil:
		c.w.log.Warn("unpin host (the pin expires after pinned_ttl)", "host", c.host, "err", err)
	}
	c.dropPin(pin)
}
