package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Config of a worker. New fills the zero values with defaults (see
// WithDefaults).
type Config struct {
	Subjects messages.Subjects
	Topology Topology
	Catalog  Catalog
	// Providers are the hosts this worker executes work for, by name.
	Providers map[string]Provider
	// NoIntake runs execution only; by default a worker also runs intake.
	NoIntake bool

	AckWait      time.Duration
	MaxAttempts  int
	ReadyTimeout time.Duration
	PollInterval time.Duration
	PinnedTTL    time.Duration
	Concurrency  int // work items run at once per host
	DrainTimeout time.Duration
	// CheckInterval is how often the worker checks that its consumers
	// exist and are consumed (besides when a consume reports an error),
	// and how often it looks again for a missing stream or bucket.
	CheckInterval time.Duration
	// ObserveInterval is how often the owner of a host re-reads its
	// running proxies; negative turns observation off.
	ObserveInterval time.Duration
	// ProgressEvery is the least time between two progress events
	// (provisioning, with the provider's report as reason) of one create.
	ProgressEvery time.Duration
	// DeletedTTL is how long a "deleted" event stays in PROXY_EVENTS.
	DeletedTTL time.Duration
	ProxyPort  int

	Backoff Backoff
	Now     func() time.Time
	Logger  *slog.Logger
	// OnRetry, if set, is told of every transient failure handed back.
	OnRetry func(RetryInfo)
}

// Worker runs intake and execution until stopped.
type Worker struct {
	cfg     Config
	js      jetstream.JetStream
	subj    messages.Subjects
	catalog Catalog
	log     *slog.Logger
	now     func() time.Time

	desired jetstream.KeyValue
	cmdIDs  jetstream.KeyValue
	events  *eventPublisher
	locks   *keyedLocks
	stats   Stats

	cancel      context.CancelFunc
	fence       *fence
	runs        []*consumerRun
	wg          sync.WaitGroup // tick loops and the fence
	superCancel context.CancelFunc
	superWG     sync.WaitGroup // consumer supervisors
}

// Stats counts what a worker did.
type Stats struct {
	accepted, rejected, converged, creates, retries, failed, dead, swept atomic.Int64
	// repairs counts consumers recreated, or consumed again, after they
	// were deleted or their consume stopped.
	repairs atomic.Int64
}

// Snapshot returns the counters.
func (s *Stats) Snapshot() map[string]int64 {
	return map[string]int64{
		"accepted": s.accepted.Load(), "rejected": s.rejected.Load(), "converged": s.converged.Load(),
		"creates": s.creates.Load(), "retries": s.retries.Load(), "failed": s.failed.Load(), "dead": s.dead.Load(),
		"swept": s.swept.Load(), "repairs": s.repairs.Load(),
	}
}

// New returns a worker on js. Call Start to run it.
func New(js jetstream.JetStream, cfg Config) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if len(cfg.Catalog.Hosts) == 0 {
		return nil, errors.New("worker: catalog has no hosts")
	}
	for h := range cfg.Providers {
		if !slices.Contains(cfg.Catalog.Hosts, h) {
			return nil, fmt.Errorf("worker: provider for %q, which the catalog does not name", h)
		}
	}
	return &Worker{
		cfg: cfg, js: js, subj: cfg.Subjects, catalog: cfg.Catalog,
		log: cfg.Logger, now: cfg.Now, locks: newKeyedLocks(),
	}, nil
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }

// Start waits until the streams and buckets the worker uses exist (they
// are set-up's to create: see Topology.Setup), refuses to start if their
// settings differ from the config, creates its consumers or updates the
// settings of the existing ones that differ (refusing to start, naming the
// setting, if the server will not change one in place), and starts
// consuming. It returns once the consumers run. While it runs, a consumer
// deleted under it is recreated within CheckInterval (see consumerRun).
func (w *Worker) Start(ctx context.Context) error {
	hosts := make([]string, 0, len(w.cfg.Providers))
	for h := range w.cfg.Providers {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	if err := w.awaitTopology(ctx); err != nil {
		return err
	}
	var err error
	if w.desired, err = w.js.KeyValue(ctx, messages.BucketDesired); err != nil {
		return fmt.Errorf("bind bucket %s: %w", messages.BucketDesired, err)
	}
	if w.cmdIDs, err = w.js.KeyValue(ctx, messages.BucketCommands); err != nil {
		return fmt.Errorf("bind bucket %s: %w", messages.BucketCommands, err)
	}
	if w.events, err = newEventPublisher(ctx, w.js, w.subj, w.cfg.DeletedTTL, w.now); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.fence = newFence(w.js.Conn(), w.cfg.AckWait/4, w.log)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.fence.run(runCtx)
	}()
	if !w.cfg.NoIntake {
		in := &intake{w: w}
		w.runs = append(w.runs, w.newRun(runCtx, messages.StreamCommands, w.cfg.Topology.intakeConsumer(), 64, in.handle))
	}
	for _, h := range hosts {
		ex := &executor{w: w, host: h, prov: w.cfg.Providers[h]}
		w.runs = append(w.runs, w.newRun(runCtx, messages.StreamWork, w.cfg.Topology.workConsumer(h), w.cfg.Concurrency, ex.handle,
			jetstream.PullPriorityGroup(PriorityGroup)))
	}
	for _, c := range w.runs {
		cons, err := c.ensure(ctx)
		if err == nil {
			err = c.consume(cons)
		}
		if err != nil {
			w.Stop(ctx)
			return err
		}
	}
	superCtx, superCancel := context.WithCancel(context.Background())
	w.superCancel = superCancel
	for _, c := range w.runs {
		w.superWG.Add(1)
		go func() {
			defer w.superWG.Done()
			c.supervise(superCtx)
		}()
	}
	if w.cfg.ObserveInterval > 0 {
		for _, h := range hosts {
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				w.tickLoop(runCtx, h)
			}()
		}
	}
	w.log.Info("worker started", "hosts", hosts, "intake", !w.cfg.NoIntake)
	return nil
}

// newRun is a consumer of stream the worker keeps consuming, on a pool of n.
func (w *Worker) newRun(runCtx context.Context, stream string, cfg jetstream.ConsumerConfig, n int, handle func(context.Context, jetstream.Msg), opts ...jetstream.PullConsumeOpt) *consumerRun {
	expiry := w.cfg.PinnedTTL / 2
	if expiry < time.Second {
		expiry = time.Second
	}
	if expiry > 30*time.Second {
		expiry = 30 * time.Second
	}
	opts = append(opts, jetstream.PullMaxMessages(n), jetstream.PullExpiry(expiry))
	return &consumerRun{
		w: w, stream: stream, cfg: cfg, handle: handle, opts: opts, runCtx: runCtx,
		pool: newPool(n, w.cfg.AckWait, w.log, w.fence), kick: make(chan struct{}, 1),
	}
}

// Stop stops pulling, lets in-flight work finish within the drain timeout,
// then cancels what is left (it is handed back to JetStream) and releases
// the host consumers' pins so other workers take over at once.
func (w *Worker) Stop(ctx context.Context) {
	// First the supervisors, so nothing restarts a consume behind us.
	if w.superCancel != nil {
		w.superCancel()
	}
	w.superWG.Wait()
	for _, c := range w.runs {
		if c.cc != nil {
			c.cc.Drain() // stop pulling; what was delivered still runs
		}
	}
	done := make(chan struct{})
	go func() {
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
	}()
	t := time.NewTimer(w.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		w.log.Warn("drain timeout: handing back in-flight work")
	case <-ctx.Done():
	}
	if w.cancel != nil {
		w.cancel()
	}
	<-done
	w.wg.Wait()
	w.unpin(ctx)
	w.runs = nil
}

// unpin releases this worker's pins, so the server pins another worker now
// instead of after PinnedTTL. Unpinning a host pinned to another worker
// costs that worker one pull; it repins at once.
func (w *Worker) unpin(ctx context.Context) {
	if len(w.cfg.Providers) == 0 {
		return
	}
	st, err := w.js.Stream(ctx, messages.StreamWork)
	if err != nil {
		return
	}
	for h := range w.cfg.Providers {
		uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = st.UnpinConsumer(uctx, WorkConsumer(h), PriorityGroup)
		cancel()
	}
}
