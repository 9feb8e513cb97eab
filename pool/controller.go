package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/lease"
	"proxyfleet/messages"
	"proxyfleet/rotation"
	"proxyfleet/topology"
)

// opTimeout bounds one request to JetStream.
const opTimeout = 5 * time.Second

// Controller keeps the pools of PROXY_POOLS: every controller applies the
// pool commands it is given (a shared durable consumer), and the one
// holding the lease runs the passes that create and delete members. See
// the package doc.
type Controller struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  Config
	log  *slog.Logger
	subj messages.Subjects
	rot  *rotation.Rotation

	pools, leases, hosts jetstream.KeyValue
	events               jetstream.Stream

	wake chan struct{}

	mu       sync.Mutex
	view     map[string]entry // the pools as the watcher last delivered them
	viewRead bool             // the watcher delivered every pool once

	active    atomic.Bool
	consuming atomic.Bool
	bound     atomic.Bool
	started   chan struct{}
	startOnce sync.Once

	metrics *metrics
}

// entry is a pool's record and its revision; a deleted pool's entry is
// kept (gone) so that an older write the watcher delivers late does not
// bring it back.
type entry struct {
	rec  messages.PoolRecord
	rev  uint64
	gone bool
}

// New returns a controller on nc. Call Run to run it.
func New(nc *nats.Conn, cfg Config) (*Controller, error) {
	if nc == nil {
		return nil, errors.New("pool: no NATS connection")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("pool: jetstream: %w", err)
	}
	log := cfg.Logger.With("component", "pools")
	// The rotation names its own component in its logs.
	rot, err := rotation.New(nc, rotation.Config{Subjects: cfg.Subjects, Logger: cfg.Logger, CheckInterval: cfg.CheckInterval})
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	c := &Controller{
		nc: nc, js: js, cfg: cfg, log: log, subj: cfg.Subjects, rot: rot,
		wake: make(chan struct{}, 1), view: map[string]entry{}, started: make(chan struct{}),
	}
	c.metrics = newMetrics(c)
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(c.metrics); err != nil {
			return nil, fmt.Errorf("pool: register metrics: %w", err)
		}
	}
	return c, nil
}

// Started is closed once the controller has bound its streams and
// buckets and consumes its commands.
func (c *Controller) Started() <-chan struct{} { return c.started }

// Active reports whether this controller holds the lease (runs the
// passes).
func (c *Controller) Active() bool { return c.active.Load() }

// Ready reports whether the controller is ready: its streams and buckets
// bound, its commands consumed, the rotation and the pools read.
func (c *Controller) Ready() error {
	switch {
	case !c.bound.Load():
		return errors.New("pools: waiting for the streams and buckets (proxyfleet setup)")
	case !c.consuming.Load():
		return errors.New("pools: not consuming pool commands")
	}
	select {
	case <-c.rot.Ready():
	default:
		return errors.New("pools: the rotation is not read yet")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.viewRead {
		return errors.New("pools: the pools are not read yet")
	}
	return nil
}

// Run runs the controller until ctx ends, then releases the lease and
// returns nil, having stopped every goroutine it started. It waits for
// set-up to have made its streams and buckets. It fails when its NATS
// connection is closed for good.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.bind(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.bound.Store(true)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, run := range []func(context.Context) error{c.rot.Run, c.watchPools, c.consumeCommands, c.loop} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				errs[i] = err
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// bind waits until the streams and buckets the controller uses exist
// (set-up makes them), then binds them.
func (c *Controller) bind(ctx context.Context) error {
	// The rotation is not among them: package rotation follows health's
	// feed, which needs no stream.
	names := []string{
		messages.StreamPoolCommands, topology.BucketStream(messages.BucketPools), topology.BucketStream(messages.BucketLeases),
		messages.StreamEvents,
	}
	await := topology.Awaiter{Interval: c.cfg.CheckInterval, Timeout: opTimeout, Log: c.log}
	if err := await.AwaitAll(ctx, c.js, names...); err != nil {
		return fmt.Errorf("pools: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var err error
	if c.pools, err = c.js.KeyValue(octx, messages.BucketPools); err != nil {
		return fmt.Errorf("pools: bind %s: %w", messages.BucketPools, err)
	}
	if c.leases, err = c.js.KeyValue(octx, messages.BucketLeases); err != nil {
		return fmt.Errorf("pools: bind %s: %w", messages.BucketLeases, err)
	}
	if c.events, err = c.js.Stream(octx, messages.StreamEvents); err != nil {
		return fmt.Errorf("pools: bind %s: %w", messages.StreamEvents, err)
	}
	// The hosts' records are read when members are placed; a fleet
	// without them yet places by the config's room.
	if c.hosts, err = c.js.KeyValue(octx, messages.BucketHosts); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("pools: bind %s: %w", messages.BucketHosts, err)
	}
	return nil
}

// caughtUp reports whether the rotation and the pools are read: a pass on
// a half-read rotation would take members for gone.
func (c *Controller) caughtUp() bool {
	select {
	case <-c.rot.Ready():
	default:
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.viewRead
}

// sleep waits d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// poke asks the loop for a pass soon.
func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// watchPools keeps the view of PROXY_POOLS with a watcher of every key,
// made anew (with a backoff) when it closes.
func (c *Controller) watchPools(ctx context.Context) error {
	wait := c.cfg.CheckInterval / 10
	for {
		err := c.watchPoolsOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if c.nc.IsClosed() {
			return fmt.Errorf("pools: watch %s: %w", messages.BucketPools, nats.ErrConnectionClosed)
		}
		c.log.Error("watching "+messages.BucketPools+" broke: watching anew", "err", err, "retry_in", wait)
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, c.cfg.CheckInterval)
	}
}

func (c *Controller) watchPoolsOnce(ctx context.Context) error {
	w, err := c.pools.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	seen := map[string]bool{}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watcher closed")
			}
			if e == nil {
				// Every pool delivered: drop what the new watcher no
				// longer has (deleted while it was broken).
				c.mu.Lock()
				for name := range c.view {
					if !seen[name] {
						delete(c.view, name)
					}
				}
				c.viewRead, initial = true, false
				c.mu.Unlock()
				c.poke()
				continue
			}
			if initial {
				seen[e.Key()] = true
			}
			c.apply(e)
		}
	}
}

// apply puts one watched entry in the view, newer revisions only (the
// pass puts its own writes there at once).
func (c *Controller) apply(e jetstream.KeyValueEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, ok := c.view[e.Key()]
	if ok && cur.rev >= e.Revision() {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		c.view[e.Key()] = entry{rev: e.Revision(), gone: true}
		return
	}
	var rec messages.PoolRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		c.log.Error("ignoring an unreadable pool record", "pool", e.Key(), "err", err)
		return
	}
	c.view[e.Key()] = entry{rec: rec, rev: e.Revision()}
	c.poke()
}

// stored puts a record the controller wrote (or deleted) in the view.
func (c *Controller) stored(name string, rec *messages.PoolRecord, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.view[name]; ok && cur.rev >= rev {
		return
	}
	if rec == nil {
		c.view[name] = entry{rev: rev, gone: true}
		return
	}
	c.view[name] = entry{rec: *rec, rev: rev}
}

// snapshot is a copy of the view.
func (c *Controller) snapshot() []entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]entry, 0, len(c.view))
	for _, e := range c.view {
		if !e.gone {
			out = append(out, e)
		}
	}
	return out
}

// loop renews or takes the lease every third of its TTL and, while it
// holds it, runs a pass every Interval and soon after a change of the
// rotation or of a pool. It releases the lease when ctx ends.
func (c *Controller) loop(ctx context.Context) error {
	l := lease.New(c.leases, topology.PoolsLeaseKey, c.cfg.ID, c.cfg.LeaseTTL, opTimeout, c.cfg.Now)
	defer func() {
		c.active.Store(false)
		rctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		held := l.Holding()
		if err := l.Release(rctx); err != nil {
			c.log.Warn("release the lease", "err", err)
		} else if held {
			c.log.Info("released the pools' lease")
		}
	}()
	tick := time.NewTicker(min(c.cfg.Interval, c.cfg.LeaseTTL/3))
	defer tick.Stop()
	var lastLease, lastPass time.Time
	for {
		if c.nc.IsClosed() {
			return fmt.Errorf("pools: %w", nats.ErrConnectionClosed)
		}
		now := c.cfg.Now()
		if now.Sub(lastLease) >= c.cfg.LeaseTTL/3 {
			lastLease = now
			was := l.Holding()
			took, err := l.Tick(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				c.log.Warn("pool lease", "err", err)
			case took:
				c.log.Info("took the pools' lease: this controller is active", "id", c.cfg.ID)
			}
			if was && !l.Holding() {
				c.log.Warn("lost the pools' lease: standing by")
			}
		}
		// Active while the lease is valid: a holder whose renewals fail
		// stops acting (and saying it does) once its last one is too old.
		c.active.Store(l.Valid())
		if l.Valid() && c.caughtUp() && now.Sub(lastPass) >= c.cfg.Interval/10 {
			lastPass = now
			c.pass(ctx, l)
		}
		changed := c.rot.Changed()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-c.wake:
		case <-changed:
		}
	}
}
