package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker/hostshare"
)

// Config of a worker. New fills the zero values with defaults (see
// WithDefaults).
type Config struct {
	// ID names the worker in PROXY_WORKERS, which the hosts are shared
	// over, and in its logs: stable and readable. Empty: <hostname>-<pid>
	// (and -2, -3... for further workers of one process).
	ID       string
	Subjects messages.Subjects
	Topology topology.Topology
	Catalog  Catalog
	// Providers are the hosts this worker executes work for, by name.
	Providers map[string]Provider
	// NoIntake runs execution only; by default a worker also runs intake.
	NoIntake bool

	AckWait      time.Duration
	MaxAttempts  int
	ReadyTimeout time.Duration
	PollInterval time.Duration // the longest pause between reads of a booting proxy (they start at 100ms and double)
	PinnedTTL    time.Duration
	Concurrency  int // work items run at once per host (default 20; a create holds one until its proxy runs)
	// DrainTimeout bounds the whole stop: work in flight, then handing
	// the hosts over and deleting the record (see drain).
	DrainTimeout time.Duration
	// CheckInterval is how often the worker checks that its consumers
	// exist and are consumed (besides when a consume reports an error),
	// and how often it looks again for a missing stream or bucket.
	CheckInterval time.Duration
	// ObserveInterval is how often the owner of a host re-reads its
	// running proxies; negative turns observation off.
	ObserveInterval time.Duration
	// ObservePasses bounds the observation passes the worker runs at
	// once, of all its hosts: every host's tick comes in the same window,
	// and each pass holds its host's listing, last events and desired
	// records until it is done. A pass that cannot start within
	// ObserveInterval is skipped (the next tick comes).
	ObservePasses int
	// SweepGrace is how long a volume must have gone unused before the
	// observation pass removes it, when the host's provider is a Sweeper;
	// negative turns volume sweeps off.
	SweepGrace time.Duration
	// ProgressEvery is the least time between two progress events
	// (provisioning, with the provider's report as reason) of one create.
	ProgressEvery time.Duration
	// Heartbeat is how often the worker renews its record in
	// PROXY_WORKERS; Liveness is how young a record must be (its time, by
	// the reader's clock) for its worker to count as live. A dead worker's
	// hosts are pulled by the others Liveness (plus up to a Heartbeat)
	// after its last renewal, and owned once its pins expire (PinnedTTL).
	Heartbeat time.Duration
	Liveness  time.Duration
	// DeletedTTL is how long a "deleted" event stays in PROXY_EVENTS.
	DeletedTTL time.Duration
	ProxyPort  int

	// A host whose calls fail transiently QuarantineFailures times within
	// QuarantineWindow is quarantined (placement skips it, its work waits)
	// for QuarantineCoolDown, then probed; a failed probe doubles the
	// cool-down, up to QuarantineMaxCoolDown. A negative
	// QuarantineFailures turns quarantine off.
	QuarantineFailures    int
	QuarantineWindow      time.Duration
	QuarantineCoolDown    time.Duration
	QuarantineMaxCoolDown time.Duration

	Backoff Backoff
	Now     func() time.Time
	Logger  *slog.Logger
	// OnRetry, if set, is told of every transient failure handed back.
	OnRetry func(RetryInfo)
	// Registerer, if set, is where the worker registers its metrics (see
	// metrics.go); nil: they are kept but exported nowhere.
	Registerer prometheus.Registerer
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
	hosts   jetstream.KeyValue // PROXY_HOSTS: room and quarantine (room.go, quarantine.go)
	events  *eventPublisher
	// hostView is every host's record, for placement to rank hosts (hostview.go).
	hostView *hostView
	rooms    []int // the room of each host of catalog.Hosts, in its order
	// band is the width of placement's top band (placeBand); 0 counts
	// each free place.
	band int
	// owned is which of catalog.Hosts, in its order, the membership
	// assigned this worker (ownedHosts), as of the assignment ownedOf.
	ownedMu sync.Mutex
	ownedOf []string
	owned   []bool
	locks   *keyedLocks
	// observing bounds the observation passes run at once (ObservePasses).
	observing chan struct{}
	stats     Stats
	metrics   *metrics

	// draining is closed when the worker starts to drain: work waiting
	// on a quarantined host is handed back at once.
	draining chan struct{}
	// writers batch this worker's changes of each host's record
	// (hostrec.go); their goroutines run in stageWriters.
	writers   map[string]*hostWriter
	writersMu sync.Mutex // guards each writer's running

	ran     atomic.Bool
	started chan struct{} // closed once Run consumes

	// life owns every goroutine of the run and stops them in one order
	// (lifecycle.go).
	life lifecycle

	// Owned by Run.
	members sharing // set by start once joined
	begun   bool    // start got as far as the handlers: drain has work to do
	fence   *fence
	runs    []*consumerRun

	// A run's supervisor runs only while the run has something to
	// supervise (see consumerRun.idle), so a host this worker does not
	// pull costs it no goroutine or ticker (a worker configured with 500
	// hosts pulls a tenth of them in a fleet of ten workers).
	superMu sync.Mutex // guards each run's superOn

	// unpins bounds the unpins in flight, of hand-overs, of the stop and
	// of stray pins, and keeps the work stream's handle they use.
	unpins *hostshare.Unpinner
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
	// observePasses counts observation passes; observeEventsRead the
	// state events they read to choose the proxies to look at.
	observePasses, observeEventsRead atomic.Int64
}

// Snapshot returns the counters.
func (s *Stats) Snapshot() map[string]int64 {
	return map[string]int64{
		"accepted": s.accepted.Load(), "rejected": s.rejected.Load(), "converged": s.converged.Load(),
		"creates": s.creates.Load(), "retries": s.retries.Load(), "failed": s.failed.Load(), "dead": s.dead.Load(),
		"swept": s.swept.Load(), "repairs": s.repairs.Load(),
		"redriven": s.redriven.Load(), "volumes_swept": s.volumesSwept.Load(),
		"observe_passes": s.observePasses.Load(), "observe_events_read": s.observeEventsRead.Load(),
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
	if cfg.ID == "" {
		cfg.ID = defaultID()
	}
	if !ValidID(cfg.ID) {
		return nil, fmt.Errorf("worker: id %q: want letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128", cfg.ID)
	}
	if cfg.ObservePasses < 1 {
		return nil, fmt.Errorf("worker: observe passes %d: want at least 1", cfg.ObservePasses)
	}
	if cfg.Liveness <= cfg.Heartbeat {
		return nil, fmt.Errorf("worker: liveness %s must be longer than the heartbeat %s", cfg.Liveness, cfg.Heartbeat)
	}
	w := &Worker{
		cfg: cfg, js: js, subj: cfg.Subjects, catalog: cfg.Catalog,
		log: cfg.Logger.With("worker", cfg.ID), now: cfg.Now, locks: newKeyedLocks(), started: make(chan struct{}),
		metrics: newMetrics(), unpins: hostshare.NewUnpinner(js),
		observing: make(chan struct{}, cfg.ObservePasses),
	}
	w.metrics.init(slices.Sorted(maps.Keys(cfg.Providers)))
	if cfg.Registerer != nil {
		if err := w.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("worker: register metrics: %w", err)
		}
	}
	return w, nil
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.cfg.ID }

// ValidID reports whether id may name a worker: letters, digits, '.', '_'
// and '-', starting with a letter or digit and not ending with '.', at
// most 128 characters (it is a key of PROXY_WORKERS).
func ValidID(id string) bool {
	if id == "" || len(id) > 128 || strings.HasSuffix(id, ".") {
		return false
	}
	for i, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case i > 0 && (r == '.' || r == '_' || r == '-'):
		default:
			return false
		}
	}
	return true
}

// workersMade numbers the workers of this process, for their default ids.
var workersMade atomic.Int64

// defaultID is <hostname>-<pid>, with -<n> for the n-th worker of the
// process after the first.
func defaultID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.Trim(host, "."))
	if host == "" || !ValidID(host) {
		host = "worker"
	}
	id := host + "-" + strconv.Itoa(os.Getpid())
	if n := workersMade.Add(1); n > 1 {
		id += "-" + strconv.FormatInt(n, 10)
	}
	return id
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }
