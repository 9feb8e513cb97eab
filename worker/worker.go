package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	// SweepGrace is how long a volume must have gone unused before the
	// observation pass removes it, when the host's provider is a Sweeper;
	// negative turns volume sweeps off.
	SweepGrace time.Duration
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

// Worker runs intake and execution (see Run).
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

	ran     atomic.Bool
	started chan struct{} // closed once Run consumes

	// Owned by Run.
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
	// redriven counts proxies re-created because their domain was gone;
	// volumesSwept the volumes the observation passes removed.
	redriven, volumesSwept atomic.Int64
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
		"redriven": s.redriven.Load(), "volumes_swept": s.volumesSwept.Load(),
	}
}

// New returns a worker on js. Call Run to run it.
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
		log: cfg.Logger, now: cfg.Now, locks: newKeyedLocks(), started: make(chan struct{}),
	}, nil
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }
