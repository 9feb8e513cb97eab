package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// setupHint is what a worker that finds the streams not as configured says.
const setupHint = "run `proxyfleet setup` with this config, or fix the config"

// workerStreams are the streams and buckets (by the stream behind them) a
// worker uses, as the config (t) wants them.
func workerStreams(t topology.Topology) []jetstream.StreamConfig {
	// The pools' stream is the pool controllers' alone: a worker neither
	// waits for it nor checks it.
	out := slices.DeleteFunc(t.Streams(), func(sc jetstream.StreamConfig) bool { return sc.Name == messages.StreamPoolCommands })
	for _, kc := range t.Buckets() {
		if kc.Bucket == messages.BucketDesired || kc.Bucket == messages.BucketCommands || kc.Bucket == messages.BucketHosts || kc.Bucket == messages.BucketWorkers {
			out = append(out, topology.BucketStreamConfig(kc))
		}
	}
	return out
}

// awaitTopology waits until every stream and bucket the worker uses exists
// (topology.Awaiter: it never creates one, that is set-up's job), then
// compares their settings with the config. A difference is a
// *topology.MismatchError: the worker would run with settings that
// disagree with the server.
func (w *Worker) awaitTopology(ctx context.Context) error {
	await := topology.Awaiter{Interval: w.cfg.CheckInterval, Log: w.log, Now: w.now}
	for _, want := range workerStreams(w.cfg.Topology) {
		st, err := await.Await(ctx, w.js, want.Name)
		if err != nil {
			return err
		}
		kind, name, diff := "stream", want.Name, topology.DiffStream
		if b, ok := strings.CutPrefix(want.Name, "KV_"); ok {
			kind, name, diff = "bucket", b, topology.DiffBucket
		}
		if ds := diff(st.CachedInfo().Config, want); len(ds) > 0 {
			return &topology.MismatchError{Kind: kind, Name: name, Diffs: ds, Hint: setupHint}
		}
	}
	return nil
}

// consumerRun is one of the worker's durable consumers (intake, or a host's
// work consumer) and the consume context pulling from it, kept running by
// supervise: a consumer deleted under it is recreated, a consume that
// stopped (the server ends a pull on a deleted consumer) is restarted, a
// stream that went missing is waited for.
//
// A host's run (host set) pulls only while the membership wants it to (see
// package hostshare and handover.go); the intake's always does.
type consumerRun struct {
	w      *Worker
	stream string
	host   string // "" for the intake
	cfg    jetstream.ConsumerConfig
	handle func(context.Context, jetstream.Msg)
	opts   []jetstream.PullConsumeOpt
	pool   *pool
	runCtx context.Context // the parent of workCtx, cancelled only after the drain

	kick    chan struct{} // the consume error handler, or a change of want, asks for a check
	superOn bool          // a supervisor runs (under w.superMu)
	wanted  atomic.Bool   // whether to pull: set by the membership
	pulling atomic.Bool   // whether it pulls (or means to, repairing), or is handing over
	changed func()        // told when the pin, or whether it pulls, changes

	pinMu sync.Mutex
	pin   string // the pin id the server gave this worker on the host; "" for none known

	// Owned by start, then by supervise, then by drain once supervise ended.
	cc         jetstream.ConsumeContext
	workCtx    context.Context // the handlers' of this pulling period
	workCancel context.CancelFunc
	created    time.Time // of the consumer cc pulls from
	retired    []jetstream.ConsumeContext
	missing    time.Time // when the stream was found missing; zero while it is there
	logged     time.Time
}

func (c *consumerRun) name() string { return c.cfg.Durable }

// ensure creates the consumer, or updates the settings of the existing one
// that differ from the config, saying what it changed.
func (c *consumerRun) ensure(ctx context.Context) (jetstream.Consumer, error) {
	cons, diffs, err := topology.EnsureConsumer(ctx, c.w.js, c.stream, c.cfg)
	if len(diffs) > 0 {
		c.w.log.Warn("consumer "+c.name()+" on "+c.stream+" differed from the config: updated it",
			"changed", topology.JoinDiffs(diffs))
	}
	return cons, err
}

// start creates or updates the consumer and consumes it. A failure the
// cluster gets over by itself (a request that timed out or found no
// responder while replicas elect a leader, a 5xx from JetStream) is logged
// and tried again every CheckInterval until ctx is done: in a cluster,
// creating a replicated consumer can outlast one request. Anything else (a
// setting the server refuses, a permission) is returned.
func (c *consumerRun) ensureRetrying(ctx context.Context) (jetstream.Consumer, error) {
	for {
		cons, err := c.ensure(ctx)
		if err == nil || ctx.Err() != nil || !passing(err) {
			return cons, err
		}
		c.w.log.Warn("consumer "+c.name()+" on "+c.stream+": not ready, trying again", "err", err, "in", c.w.cfg.CheckInterval)
		t := time.NewTimer(c.w.cfg.CheckInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// passing reports whether a JetStream API call's failure is one the
// cluster gets over by itself.
func passing(err error) bool {
	var refused *topology.RefusedError
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &refused):
		return false // the server answered, and will answer the same
	case errors.As(err, &apiErr):
		return apiErr.Code >= 500
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	}
	return false
}

// consume starts pulling from cons.
func (c *consumerRun) consume(cons jetstream.Consumer) error {
	opts := append(slices.Clip(c.opts), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrPinIDMismatch) {
			c.w.log.Debug("consume", "consumer", c.name(), "err", err)
			c.setPin("") // the server pinned another puller
			return
		}
		lvl := c.w.log.Debug
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
			errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders) {
			lvl = c.w.log.Warn
		}
		lvl("consume", "consumer", c.name(), "stream", c.stream, "err", err)
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}))
	ctx := c.workCtx
	handler := func(msg jetstream.Msg) { c.pool.submit(ctx, msg, c.handle) }
	if c.host != "" {
		handler = func(msg jetstream.Msg) { c.deliver(ctx, msg) }
	}
	cc, err := cons.Consume(handler, opts...)
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", c.name(), c.stream, err)
	}
	c.cc, c.created = cc, cons.CachedInfo().Created
	return nil
}

func closed(cc jetstream.ConsumeContext) bool {
	select {
	case <-cc.Closed():
		return true
	default:
		return false
	}
}

// retire stops the current consume context; drain still waits for it.
func (c *consumerRun) retire() {
	if c.cc == nil {
		return
	}
	c.cc.Stop()
	c.retired = append(c.retired, c.cc)
	c.cc = nil
}

// supervise starts c's supervisor unless one runs, or the worker is
// stopping, or start has not opened stageSupervisors yet (start then
// starts those of the runs that are not idle).
func (w *Worker) supervise(c *consumerRun) {
	w.superMu.Lock()
	defer w.superMu.Unlock()
	if c.superOn {
		return
	}
	c.superOn = w.life.goIn(stageSupervisors, c.supervise)
}

// idle reports whether the run has nothing to supervise: a host's run
// the membership does not want pulled, which does not pull and has no
// consume running. The intake's is never idle.
func (c *consumerRun) idle() bool {
	return c.host != "" && !c.wanted.Load() && !c.pulling.Load() && c.cc == nil
}

// leaveIdle ends the supervisor of an idle run with no check asked for,
// reporting whether it did; want wakes one again.
func (c *consumerRun) leaveIdle() bool {
	if !c.idle() {
		return false
	}
	c.w.superMu.Lock()
	defer c.w.superMu.Unlock()
	if !c.idle() || len(c.kick) > 0 {
		return false
	}
	c.superOn = false
	return true
}

// supervise checks the consumer every CheckInterval, when the consume
// reports an error and when the consume stops, until ctx is done or the
// run is idle.
func (c *consumerRun) supervise(ctx context.Context) {
	t := time.NewTicker(c.w.cfg.CheckInterval)
	defer t.Stop()
	for {
		var stopped <-chan struct{}
		if c.cc != nil && !closed(c.cc) {
			stopped = c.cc.Closed()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		case <-stopped:
		}
		c.check(ctx)
		if c.leaveIdle() {
			return
		}
	}
}

// check starts or stops pulling as the membership wants, and repairs what
// it finds wrong with the consumer it pulls from.
func (c *consumerRun) check(ctx context.Context) {
	w := c.w
	want, pulling := c.wanted.Load(), c.pulling.Load()
	if !want {
		if pulling {
			c.release(ctx) // as long as the host's in-flight work takes
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(w.cfg.CheckInterval, 5*time.Second))
	defer cancel()
	if !pulling {
		c.acquire(ctx)
		return
	}
	cons, err := w.js.Consumer(ctx, c.stream, c.name())
	var why string
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		c.retire() // nothing to pull from
		now := w.now()
		if c.missing.IsZero() {
			c.missing = now
		}
		if now.Sub(c.logged) >= topology.MissingLogEvery {
			w.log.Error("stream "+c.stream+" is missing: waiting for set-up to recreate it (`proxyfleet setup`, or `serve`)",
				"consumer", c.name(), "waited", now.Sub(c.missing).Round(time.Millisecond))
			c.logged = now
		}
		return
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		why = "was deleted"
		if !c.missing.IsZero() {
			why = "is gone with its stream, which is back"
		}
	case err != nil:
		if ctx.Err() == nil {
			w.log.Warn("check consumer", "consumer", c.name(), "stream", c.stream, "err", err)
		}
		return
	case c.cc != nil && !closed(c.cc):
		if created := cons.CachedInfo().Created; !created.Equal(c.created) {
			// Another worker recreated it; our pulls reach the new one.
			// Make sure it has our settings.
			c.created = created
			if _, err := c.ensure(ctx); err != nil {
				w.log.Error("consumer "+c.name()+" on "+c.stream+" was recreated by another process with other settings", "err", err)
			}
		}
		return
	default:
		why = "had stopped consuming"
	}
	cons, err = c.ensure(ctx)
	if err != nil {
		w.log.Error("consumer "+c.name()+" on "+c.stream+" "+why+": could not recreate it (will retry)", "err", err)
		return
	}
	c.retire()
	c.setPin("") // a new consume learns its pin afresh
	if err := c.consume(cons); err != nil {
		w.log.Error("consumer "+c.name()+" on "+c.stream+" "+why+": could not consume it again (will retry)", "err", err)
		return
	}
	w.stats.repairs.Add(1)
	w.metrics.repairs.Inc()
	attrs := []any{"repairs", w.stats.repairs.Load()}
	if !c.missing.IsZero() {
		attrs = append(attrs, "stream_missing_for", w.now().Sub(c.missing).Round(time.Millisecond))
	}
	c.missing, c.logged = time.Time{}, time.Time{}
	w.log.Error("consumer "+c.name()+" on "+c.stream+" "+why+": recreated it and resumed consuming", attrs...)
}
