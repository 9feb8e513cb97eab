package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/topology"
)

// Taking a host and handing it over. A host's work consumer is pinned to
// one pulling worker at a time; the server tells the pinned worker its pin
// id in the Nats-Pin-Id header of every message it delivers, which is how a
// worker knows it owns a host (the consumer's PinnedClientID is the same
// id, which the worker's record publishes for readers of consumer info).
//
// A worker that is to take a host pulls it and publishes a claim, an empty
// work item (proxy.work.<host>._claim) the owner acks at once: the server
// pins the host on its next delivery, so ownership is settled, and seen,
// without waiting for real work. A worker that is to give a host up stops
// pulling it but keeps its pin while the host's in-flight work ends (pull
// requests that carry the pin and can take no message renew it), then
// unpins it, so the next owner gets the host's work only once the last one
// has finished with it: never two owners of one host at a time.

// pinHeader is the header in which the server tells a puller its pin id.
const pinHeader = "Nats-Pin-Id"

// claimToken is the id token of a claim. Like observeToken it is not a
// valid proxy id.
const claimToken = "_claim"

func (c *consumerRun) getPin() string {
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

// want tells the run whether to pull its host; the supervisor acts on it.
func (c *consumerRun) want(pull bool) {
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
	if pin := msg.Headers().Get(pinHeader); pin != "" {
		c.setPin(pin)
	}
	if _, id, err := c.w.subj.ParseWork(msg.Subject()); err == nil && id == claimToken {
		_ = msg.Ack()
		return
	}
	c.pool.submit(ctx, msg, c.handle)
}

// claim publishes a claim of the host (see above), without waiting for
// its ack: the membership's loop claims every host it pulls without a
// pin, once a heartbeat, and a loaded server answering each in turn held
// that loop past Liveness, so the others counted this worker dead (and it
// them), and every worker came to pull every host. A claim lost is made
// again at the next heartbeat.
func (c *consumerRun) claim(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	if _, err := c.w.js.PublishAsync(c.w.subj.Work(c.host, claimToken), nil); err != nil {
		c.w.log.Debug("publish claim", "host", c.host, "err", err)
	}
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
	c.claim(ctx)
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
// called: a hold request every quarter of PinnedTTL. An answer that the pin
// is not (or no longer) the consumer's means the worker lost it: it is
// forgotten, and nothing is held.
func (c *consumerRun) holdPin() (stop func()) {
	pin := c.getPin()
	nc := c.w.js.Conn()
	if pin == "" || nc.IsClosed() {
		return func() {}
	}
	lost := make(chan struct{})
	var lostOnce sync.Once
	hold, err := jsapi.New(c.w.js).HoldPin(c.stream, c.name(), topology.PriorityGroup, pin, func() {
		lostOnce.Do(func() { close(lost) })
	})
	if err != nil {
		c.w.log.Warn("hold pin", "host", c.host, "err", err)
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(c.w.cfg.PinnedTTL/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			_ = hold.Renew()
			select {
			case <-quit:
				return
			case <-lost:
				c.w.log.Warn("lost the pin of host while handing it over", "host", c.host)
				c.dropPin(pin)
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
			_ = hold.Stop()
		})
	}
}

// unpinner bounds a worker's unpins in flight to unpinAtOnce, and keeps
// the handle of each stream they are made on. A handle is a name and a
// connection, but looking one up asks the server for the stream's info,
// and workers started together hand most of their hosts over within
// seconds: unbounded, a lookup and an unpin a host would queue on a busy
// JetStream API past the unpins' timeout. A pin not released expires only
// after pinned_ttl, and the host's new owner gets none of its work until
// then (BenchmarkUnpinLookups and TestUnpinsAreBoundedOnTheirStream).
type unpinner struct {
	once    sync.Once
	slots   chan struct{}
	mu      sync.Mutex
	streams map[string]jetstream.Stream
}

// slot takes one of the unpins' slots, or fails when ctx ends first
// (a free slot is taken whatever ctx says).
func (u *unpinner) slot(ctx context.Context) (release func(), err error) {
	u.once.Do(func() { u.slots = make(chan struct{}, unpinAtOnce) })
	select {
	case u.slots <- struct{}{}:
		return func() { <-u.slots }, nil
	default:
	}
	select {
	case u.slots <- struct{}{}:
		return func() { <-u.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stream returns the handle of stream name, looking it up once.
func (u *unpinner) stream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st, ok := u.streams[name]; ok {
		return st, nil
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	if u.streams == nil {
		u.streams = map[string]jetstream.Stream{}
	}
	u.streams[name] = st
	return st, nil
}

// Why an unpinner's unpin did not happen, beside the server's answer.
var (
	errNoUnpinSlot = errors.New("no unpin slot")
	errUnpinLookup = errors.New("look up the stream")
)

// unpin unpins consumer of stream: it takes a slot while wait lasts
// (errNoUnpinSlot when wait ends first), then looks the stream up
// (errUnpinLookup) and unpins within unpinTimeout of parent.
func (u *unpinner) unpin(wait, parent context.Context, js jetstream.JetStream, stream, consumer string) error {
	release, err := u.slot(wait)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoUnpinSlot, err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(parent, unpinTimeout)
	defer cancel()
	st, err := u.stream(ctx, js, stream)
	if err != nil {
		return fmt.Errorf("%w %s: %w", errUnpinLookup, stream, err)
	}
	return st.UnpinConsumer(ctx, consumer, topology.PriorityGroup)
}

// unpin releases the host's pin if the worker holds it, so the server pins
// the next worker that pulls it now instead of after PinnedTTL. It waits
// for one of the worker's unpin slots while ctx lasts, and no longer than
// the pin would; the worker's stop (ctx ends) leaves the pin to its own
// unpins. The unpin, once begun, has unpinTimeout, as before.
func (c *consumerRun) unpin(ctx context.Context) {
	if c.getPin() == "" || c.w.js.Conn().IsClosed() {
		return // it expires after PinnedTTL
	}
	wait, cancel := context.WithTimeout(ctx, c.w.cfg.PinnedTTL)
	defer cancel()
	c.unpinWithin(wait, context.Background(), false)
}

// unpinOn is unpin within ctx, at the worker's stop (unpinHosts): it waits
// for an unpin slot while ctx lasts, then gives the unpin at most
// unpinTimeout.
func (c *consumerRun) unpinOn(ctx context.Context) {
	c.unpinWithin(ctx, ctx, true)
}

// unpinWithin unpins the host's consumer (see unpinner.unpin) and forgets
// the pin whatever the server answers (a pin not released expires after
// pinned_ttl). Without a slot it keeps the pin, saying so if warnNoSlot;
// a stream it cannot look up keeps it too.
func (c *consumerRun) unpinWithin(wait, parent context.Context, warnNoSlot bool) {
	pin := c.getPin()
	if pin == "" {
		return
	}
	err := c.w.unpins.unpin(wait, parent, c.w.js, c.stream, c.name())
	switch {
	case errors.Is(err, errNoUnpinSlot):
		if warnNoSlot {
			c.w.log.Warn("unpin host (the pin expires after pinned_ttl)", "host", c.host, "err", err)
		}
		return
	case errors.Is(err, errUnpinLookup):
		c.w.log.Warn("unpin host", "host", c.host, "err", err)
		return
	case err != nil:
		c.w.log.Warn("unpin host (the pin expires after pinned_ttl)", "host", c.host, "err", err)
	}
	c.dropPin(pin)
}
