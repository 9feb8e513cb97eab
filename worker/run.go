package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker/hostshare"
)

// Run runs the worker until ctx is done, then drains it.
//
// First it waits until the streams and buckets it uses exist (they are
// set-up's to create: see topology.Topology.Setup), refuses to start if their
// settings differ from the config, creates its consumers or updates the
// settings of the existing ones that differ (refusing to start, naming the
// setting, if the server will not change one in place; trying again while
// the cluster does not answer in time), and consumes;
// Started is closed then. While it runs, a consumer deleted under it is
// recreated within CheckInterval (see consumerRun).
//
// It pulls only its share of the hosts (package hostshare): it writes its
// record in PROXY_WORKERS before it consumes, and follows the others' while
// it runs, taking and handing over hosts as the membership changes.
//
// Once ctx is done it drains: its record says so (the others start pulling
// its hosts), it stops pulling, lets in-flight work finish within
// DrainTimeout, then cancels what is left (it is handed back to JetStream)
// and releases the host consumers' pins so other workers take over at
// once, and deletes its record.
//
// Run returns nil after a drain that ctx asked for (also when ctx ends
// before the worker started), the error that kept it from starting, or,
// after draining, what ended it: its NATS connection closed for good. A
// worker runs once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("worker: run twice")
	}
	err := w.start(ctx)
	switch {
	case err == nil:
		close(w.started)
		err = watchConn(ctx, w.js.Conn(), w.cfg.CheckInterval)
		if err != nil {
			err = fmt.Errorf("worker: %w", err)
			w.log.Error("stopping", "err", err)
		}
	case ctx.Err() != nil:
		err = nil // stopped before it started
	}
	w.drain()
	return err
}

// Started is closed once Run consumes.
func (w *Worker) Started() <-chan struct{} { return w.started }

// watchConn waits until ctx is done (nil) or nc is closed for good (an
// error), looking every interval.
func watchConn(ctx context.Context, nc *nats.Conn, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// start binds what the worker uses and starts consuming, opening the
// stages of its lifecycle as what their goroutines use becomes ready;
// what it started before a failure is for drain to stop.
func (w *Worker) start(ctx context.Context) error {
	hosts := slices.Sorted(maps.Keys(w.cfg.Providers))
	if err := w.awaitTopology(ctx); err != nil {
		return err
	}
	if err := w.bind(ctx); err != nil {
		return err
	}
	w.startHandlers()
	w.startWriters()
	w.recordHosts(ctx, hosts)
	hostRuns := w.makeRuns(hosts)
	// Its record, and everyone's: which hosts are its share to pull.
	w.life.open(stageMembers)
	if err := w.join(ctx, hostRuns); err != nil {
		return err
	}
	if err := w.consumeShare(ctx); err != nil {
		return err
	}
	// It claims the hosts it pulls without a pin, and its record says
	// what it pulls now.
	w.life.goIn(stageMembers, w.members.Run)
	w.life.open(stageSupervisors)
	for _, c := range w.runs {
		// Not c.idle(): a want may have started its supervisor, which
		// owns c.cc from then on.
		if c.host == "" || c.wanted.Load() || c.pulling.Load() {
			w.supervise(c)
		}
	}
	if w.cfg.ObserveInterval > 0 {
		ticked := make([]*consumerRun, 0, len(hosts))
		for _, h := range hosts {
			ticked = append(ticked, hostRuns[h])
		}
		w.life.goIn(stageHandlers, func(ctx context.Context) { w.tickLoop(ctx, ticked) })
	}
	w.log.Info("worker started", "id", w.cfg.ID, "hosts", hosts, "intake", !w.cfg.NoIntake,
		"pulling", w.members.Mine(), "heartbeat", w.cfg.Heartbeat, "liveness", w.cfg.Liveness)
	return nil
}

// bind binds the buckets and the event publisher the worker uses.
func (w *Worker) bind(ctx context.Context) error {
	for _, b := range []struct {
		kv   *jetstream.KeyValue
		name string
	}{{&w.desired, messages.BucketDesired}, {&w.cmdIDs, messages.BucketCommands}, {&w.hosts, messages.BucketHosts}} {
		kv, err := w.js.KeyValue(ctx, b.name)
		if err != nil {
			return fmt.Errorf("bind bucket %s: %w", b.name, err)
		}
		*b.kv = kv
	}
	var err error
	w.events, err = newEventPublisher(ctx, w.js, w.subj, w.cfg.DeletedTTL, w.now)
	return err
}

// startHandlers opens stageHandlers, whose context is the handlers' (drain
// cancels it, not Run's ctx), and starts what they lean on: the host view
// placement ranks from and the fence that abandons work once cut off.
func (w *Worker) startHandlers() {
	w.life.open(stageHandlers)
	w.begun = true
	w.draining = make(chan struct{})
	w.hostView = newHostView(w.hosts, w.js.Conn(), w.cfg.CheckInterval, w.log)
	w.rankInOrder()
	w.life.goIn(stageHandlers, w.hostView.run)
	w.fence = newFence(w.js.Conn(), w.cfg.AckWait/4, w.log)
	w.life.goIn(stageHandlers, w.fence.run)
}

// makeRuns makes the intake's run and the host commands' (unless
// NoIntake) and one run per host,
// returning the hosts' by host.
func (w *Worker) makeRuns(hosts []string) map[string]*consumerRun {
	runCtx := w.life.ctx(stageHandlers)
	if !w.cfg.NoIntake {
		in := &intake{w: w}
		c := w.newRun(runCtx, messages.StreamCommands, w.cfg.Topology.IntakeConsumerConfig(), 64, in.handle)
		c.wanted.Store(true)
		w.runs = append(w.runs, c)
		// Host commands (an operator's quarantine and release), one at a
		// time: see hostcmd.go.
		hc := &hostCommands{w: w}
		hcr := w.newRun(runCtx, messages.StreamHostCommands, w.cfg.Topology.HostsConsumerConfig(), 1, hc.handle)
		hcr.wanted.Store(true)
		w.runs = append(w.runs, hcr)
	}
	hostRuns := map[string]*consumerRun{}
	for _, h := range hosts {
		g := newHostGuard(w, h, w.cfg.Providers[h])
		ex := &executor{w: w, host: h, prov: guarded{Provider: w.cfg.Providers[h], g: g}, guard: g}
		c := w.newRun(runCtx, messages.StreamWork, w.cfg.Topology.WorkConsumerConfig(h), w.cfg.Concurrency, ex.handle,
			jetstream.PullPriorityGroup(topology.PriorityGroup))
		c.host = h
		c.pool.inFlight = w.metrics.inFlight.WithLabelValues(h)
		c.pool.isTick = func(m jetstream.Msg) bool {
			_, id, err := w.subj.ParseWork(m.Subject())
			return err == nil && id == observeToken
		}
		hostRuns[h] = c
		w.runs = append(w.runs, c)
	}
	return hostRuns
}

// consumeShare makes every consumer to the config (a difference refuses
// the start) and consumes those the membership wants pulled.
func (w *Worker) consumeShare(ctx context.Context) error {
	for _, c := range w.runs {
		cons, err := c.ensureRetrying(ctx)
		if err != nil {
			return err
		}
		if !c.wanted.Load() {
			continue
		}
		c.begin()
		if err := c.consume(cons); err != nil {
			return err
		}
		c.pulling.Store(true)
	}
	return nil
}

// newRun is a consumer of stream the worker keeps consuming, on a pool of n.
func (w *Worker) newRun(runCtx context.Context, stream string, cfg jetstream.ConsumerConfig, n int, handle func(context.Context, jetstream.Msg), opts ...jetstream.PullConsumeOpt) *consumerRun {
	expiry := min(max(w.cfg.PinnedTTL/2, time.Second), 30*time.Second)
	opts = append(opts, jetstream.PullMaxMessages(n), jetstream.PullExpiry(expiry))
	return &consumerRun{
		w: w, stream: stream, cfg: cfg, handle: handle, opts: opts, runCtx: runCtx,
		pool: newPool(n, w.cfg.AckWait, w.log, w.fence), kick: make(chan struct{}, 1),
	}
}

// drain stops the worker's lifecycle, its stages in their order (see
// stage), doing between them what the stop needs: its record says it is
// draining once the membership's loop has stopped, so the others start
// pulling its hosts at once; once the supervisors have stopped it stops
// pulling and lets in-flight work finish within the drain timeout, then
// cancels what is left (it is handed back to JetStream) by stopping
// stageHandlers; it keeps each host's pin until the host's in-flight work
// has ended (see holdPin); once the writers have stopped it releases the
// host consumers' pins so other workers take over at once, and deletes
// its record last.
//
// The whole stop fits within DrainTimeout, however many hosts the worker
// owns: work in flight gets the timeout less the hand-over's share
// (handoverShare), and every NATS call of the stop (the draining record,
// the unpins, made concurrently, and the record's deletion) ends at the
// one deadline. A call that cannot finish by then (NATS unreachable) is
// given up: nothing is lost, only the time a takeover waits, since the
// server moves a pin nobody renews after PinnedTTL and the others count a
// record nobody renews dead after Liveness.
func (w *Worker) drain() {
	defer w.life.stopAll() // whatever start opened, if it stopped early
	if !w.begun {
		return // it never got as far as consuming
	}
	stopBy := time.Now().Add(w.cfg.DrainTimeout)
	stopCtx, stopCancel := context.WithDeadline(context.Background(), stopBy)
	defer stopCancel()
	w.life.stop(stageMembers)
	if w.members != nil {
		w.members.Draining(stopCtx)
	}
	w.life.stop(stageSupervisors) // nothing restarts a consume behind us
	close(w.draining)
	w.log.Info("draining worker", "timeout", w.cfg.DrainTimeout)
	var holds []func()
	for _, c := range w.runs {
		c.pulling.Store(false)
		c.stopPulling() // what was delivered still runs
		if c.host != "" {
			holds = append(holds, c.holdPin())
		}
	}
	done := make(chan struct{})
	w.life.goIn(stageHandlers, func(context.Context) {
		// A draining consumer still hands its buffered messages to the
		// pool; only once it is closed may the pool be waited for (a
		// WaitGroup's Add must not race its Wait).
		for _, c := range w.runs {
			for _, cc := range append(c.retired, c.cc) {
				if cc != nil {
					<-cc.Closed()
				}
			}
		}
		for _, c := range w.runs {
			c.pool.wait()
		}
		close(done)
	})
	t := time.NewTimer(time.Until(stopBy.Add(-handoverShare(w.cfg.DrainTimeout))))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		w.log.Warn("drain timeout: handing back in-flight work")
	}
	w.life.stop(stageHandlers) // cancels the work left, waits for the pools
	w.life.stop(stageWriters)
	for _, stop := range holds {
		stop()
	}
	w.unpinHosts(stopCtx)
	if w.members != nil {
		w.members.Leave(stopCtx)
	}
	if stopCtx.Err() != nil {
		w.log.Warn("stop: NATS calls given up at the drain timeout (pins expire after pinned_ttl, the record after liveness)",
			"timeout", w.cfg.DrainTimeout)
	}
	w.runs = nil
}

// handoverShare is the part of the drain timeout kept for handing the
// hosts over once the work in flight has ended or been cancelled: a tenth,
// at least a second, at most half. With NATS up the unpins take
// milliseconds; the share only bounds how long they may wait for it.
func handoverShare(drain time.Duration) time.Duration {
	return min(drain/2, max(drain/10, time.Second))
}

// unpinHosts releases the pins the worker holds, at most
// hostshare.UnpinAtOnce at a time, on one lookup of the work stream,
// giving up when ctx ends (each call after hostshare.UnpinTimeout).
func (w *Worker) unpinHosts(ctx context.Context) {
	var pinned []*consumerRun
	for _, c := range w.runs {
		if c.host != "" && c.Pin() != "" {
			pinned = append(pinned, c)
		}
	}
	if len(pinned) == 0 || w.js.Conn().IsClosed() {
		return // they expire after PinnedTTL
	}
	// One lookup, which the unpins then share (Unpinner.Stream): one
	// that fails gives them all up at once.
	lctx, cancel := context.WithTimeout(ctx, hostshare.UnpinTimeout)
	_, err := w.unpins.Stream(lctx)
	cancel()
	if err != nil {
		w.log.Warn("unpin hosts: look up stream "+messages.StreamWork+" (the pins expire after pinned_ttl)", "hosts", len(pinned), "err", err)
		return
	}
	sem := make(chan struct{}, hostshare.UnpinAtOnce)
	var wg sync.WaitGroup
	for _, c := range pinned {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.unpinOn(ctx)
		}()
	}
	wg.Wait()
}
