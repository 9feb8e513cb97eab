package rotation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/bans"
	"proxyfleet/messages"
	"proxyfleet/rotation/defaults"
)

// Proxy is one proxy of the rotation, as a pick returns it.
type Proxy struct {
	ID   string
	Addr string // ip:port, where it listens
	// Host is the KVM host it runs on.
	Host string
	// Egress is the address its requests leave from, as health's probe
	// target saw them, when known; else "".
	Egress string
	// Labels are its labels, from its create command (nil when it has
	// none). The map is shared by every copy of this Proxy: read it,
	// never write it.
	Labels map[string]string
	// Since is when it entered the rotation (or its address last
	// changed).
	Since time.Time
	// EgressAddrs are the addresses its host's address plan gave it,
	// the ones it may be asked to leave from (its IPv4 address first);
	// nil for a proxy whose host has no plan. The slice is shared by
	// every copy of this Proxy: read it, never write it.
	EgressAddrs []netip.Addr
}

// Strategy is how Pick chooses among the matching proxies.
type Strategy string

const (
	// RoundRobin takes each matching proxy in turn (the default).
	RoundRobin Strategy = "round-robin"
	// Random takes one at random.
	Random Strategy = "random"
	// LeastBusy takes the one with the fewest requests in flight (counted
	// by Acquire), ties going round robin.
	LeastBusy Strategy = "least-busy"
)

// Defaults of Config: package proxyfleet/rotation/defaults's constants.
const (
	DefaultCooldown      = defaults.Cooldown
	DefaultCheckInterval = defaults.CheckInterval
	DefaultRetryMax      = defaults.RetryMax
	// missingRepeat is how often a stream or bucket that stays missing is
	// logged again (health does the same).
	missingRepeat = 30 * time.Second
	// opTimeout bounds one request to JetStream (a lookup, a consumer's
	// creation).
	opTimeout = 10 * time.Second
)

// Config configures a Rotation. The zero value follows the default prefix
// with no proxy credential.
type Config struct {
	// Subjects are the fleet's subjects; zero means the default prefix
	// "proxy".
	Subjects messages.Subjects
	// User and Password are the fleet's proxy credential (proxy.auth):
	// ProxyURL and Proxy put them in the URLs they return.
	User, Password string
	// Strategy is Pick's; empty means RoundRobin.
	Strategy Strategy
	// Cooldown is how long a proxy this process reported is passed over
	// while another matches (default 10s; negative: never). Health decides
	// whether the proxy is really down; meanwhile this process stops
	// sending it traffic that would likely fail again.
	Cooldown time.Duration
	// Reporter names this process in its reports (Report.By); default
	// <hostname>-<pid>.
	Reporter string
	// CheckInterval is how long the feed may be silent before the
	// publisher is asked for its version (one page of one proxy), to
	// find a lost message (default 5s; health sends a heartbeat every
	// third of its lease's TTL, 5s by default).
	CheckInterval time.Duration
	// RetryMax bounds the backoff between attempts to read the rotation's
	// pages (default 5s; the first waits RetryMax/50).
	RetryMax time.Duration
	Logger   *slog.Logger
	// Now is the clock of cooldowns, reports and bans (default time.Now).
	Now func() time.Time
	// MaxBans bounds the bans held in memory (default
	// bans.DefaultMaxEntries); past it the bans ending first are dropped.
	MaxBans int
	// LookupNetIP resolves a target's name for Proxy, which tells a
	// proxy with addresses one of the family it will reach the target
	// over (TargetFamily; nil: DefaultLookup).
	LookupNetIP LookupFunc
}

// Stats are counters of a Rotation's life.
type Stats struct {
	// Restarts counts the times the rotation was read whole again after
	// the first: a gap in the feed, a new publisher (a takeover).
	Restarts uint64
	// Version is the version of the rotation held.
	Version uint64
	// Changes counts changes of the rotation (a proxy in, out, or its
	// address, host, labels or egress changed).
	Changes uint64
	// Picks counts Pick and PickSession calls, EmptyPicks those that found
	// nothing (ErrEmpty).
	Picks, EmptyPicks uint64
	// Reports counts reports published, ReportErrors those that failed.
	Reports, ReportErrors uint64
}

// ErrEmpty says that no proxy in the rotation matches what was asked.
// Errors of Pick, PickSession and Proxy wrap it with what that was.
var ErrEmpty = errors.New("rotation: no proxy matches")

// Rotation follows the rotation and picks proxies from it. Its methods are
// safe for concurrent use.
type Rotation struct {
	nc   *nats.Conn
	cfg  Config
	subj messages.Subjects
	log  *slog.Logger
	// families are the families of Proxy's target names.
	families *FamilyCache

	mu  sync.RWMutex
	idx *index
	// cool holds the end of each reported proxy's cooldown, by id.
	cool      map[string]time.Time
	nextPrune time.Time
	changed   chan struct{}
	taken     bool // someone holds changed: close it at the next change
	isReady   bool // the rotation was read once
	version   atomic.Uint64

	ready chan struct{}

	// The bans followed from PROXY_BANS (bans.go).
	banMu          sync.RWMutex
	bans           *bans.Set
	bansNextExpire time.Time // with banMu
	bansReady      chan struct{}
	bansReadyOnce  sync.Once

	runMu     sync.Mutex
	running   bool
	runCancel context.CancelFunc
	runDone   chan struct{}
	runErr    error

	restarts, changes, picks, emptyPicks, reports, reportErrors atomic.Uint64
}

// New returns a Rotation that follows nothing yet: Run follows. Its
// picks find nothing until the rotation is read (Ready).
func New(nc *nats.Conn, cfg Config) (*Rotation, error) {
	if nc == nil {
		return nil, errors.New("rotation: no NATS connection")
	}
	r, err := newRotation(cfg)
	if err != nil {
		return nil, err
	}
	r.nc = nc
	return r, nil
}

// newRotation is a Rotation of cfg with its defaults, connected to nothing.
func newRotation(cfg Config) (*Rotation, error) {
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	if !messages.ValidPrefix(cfg.Subjects.Prefix) {
		return nil, fmt.Errorf("rotation: invalid subject prefix %q", cfg.Subjects.Prefix)
	}
	switch cfg.Strategy {
	case "":
		cfg.Strategy = defaults.Strategy
	case RoundRobin, Random, LeastBusy:
	default:
		return nil, fmt.Errorf("rotation: unknown strategy %q (want %s, %s or %s)", cfg.Strategy, RoundRobin, Random, LeastBusy)
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.Reporter == "" {
		host, _ := os.Hostname()
		cfg.Reporter = fmt.Sprintf("%s-%d", cmp.Or(host, "unknown"), os.Getpid())
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = DefaultRetryMax
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Rotation{
		cfg: cfg, subj: cfg.Subjects,
		log:       cfg.Logger.With("component", "rotation"),
		families:  NewFamilyCache(cfg.LookupNetIP, cfg.Now),
		idx:       newIndex(),
		cool:      map[string]time.Time{},
		changed:   make(chan struct{}),
		ready:     make(chan struct{}),
		bans:      bans.NewSet(cfg.MaxBans),
		bansReady: make(chan struct{}),
	}, nil
}

// Run follows the rotation until ctx ends (or Close), then returns nil,
// having stopped every goroutine it started. A gap in the feed makes it
// read the rotation again (see the package doc); Run returns an error
// only for what keeps it from following at all: it is already running,
// or the NATS connection is closed.
func (r *Rotation) Run(ctx context.Context) error {
	ctx, err := r.begin(ctx)
	if err != nil {
		return err
	}
	return r.follow(ctx)
}

// begin registers a Run, so that Close can stop it, and returns its
// context.
func (r *Rotation) begin(ctx context.Context) (context.Context, error) {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if r.running {
		return nil, errors.New("rotation: Run called while running")
	}
	ctx, cancel := context.WithCancel(ctx)
	r.running, r.runCancel, r.runDone, r.runErr = true, cancel, make(chan struct{}), nil
	return ctx, nil
}

// follow is the body of Run, once begun.
func (r *Rotation) follow(ctx context.Context) error {
	r.runMu.Lock()
	cancel, done := r.runCancel, r.runDone
	r.runMu.Unlock()

	banCtx, stopBans := context.WithCancel(ctx)
	bansDone := make(chan struct{})
	go func() {
		defer close(bansDone)
		r.followBans(banCtx)
	}()
	err := r.followFeed(ctx)
	stopBans()
	<-bansDone
	cancel()

	r.runMu.Lock()
	r.running, r.runErr = false, err
	close(done)
	r.runMu.Unlock()
	return err
}

// Ready is closed once the rotation has been read (the first time: a
// read again later does not reopen it).
func (r *Rotation) Ready() <-chan struct{} { return r.ready }

// Follow is New, then Run in a goroutine of its own; it returns once the
// rotation is Ready, or fails when ctx ends first (or Run stops). ctx only
// bounds that wait: the Rotation follows until Close.
func Follow(ctx context.Context, nc *nats.Conn, cfg Config) (*Rotation, error) {
	r, err := New(nc, cfg)
	if err != nil {
		return nil, err
	}
	runCtx, err := r.begin(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.follow(runCtx) }()
	select {
	case <-r.ready:
		return r, nil
	case err := <-runErr:
		return nil, fmt.Errorf("rotation: follow: %w", cmp.Or(err, errors.New("stopped before ready")))
	case <-ctx.Done():
		_ = r.Close()
		return nil, fmt.Errorf("rotation: not ready: %w", ctx.Err())
	}
}

// Close stops Run (whoever started it) and waits for it to return, with
// its error. The rotation keeps what it knew: picks go on from it. It may
// be called more than once.
func (r *Rotation) Close() error {
	r.runMu.Lock()
	cancel, done := r.runCancel, r.runDone
	r.runMu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	r.runMu.Lock()
	defer r.runMu.Unlock()
	return r.runErr
}

// Stats returns the counters.
func (r *Rotation) Stats() Stats {
	return Stats{
		Restarts: r.restarts.Load(), Version: r.version.Load(), Changes: r.changes.Load(),
		Picks: r.picks.Load(), EmptyPicks: r.emptyPicks.Load(),
		Reports: r.reports.Load(), ReportErrors: r.reportErrors.Load(),
	}
}

// Proxies returns the rotation, sorted by id: a copy, O(n log n), for
// listing rather than for picking.
func (r *Rotation) Proxies() []Proxy {
	r.mu.RLock()
	out := make([]Proxy, 0, len(r.idx.all.items))
	for _, m := range r.idx.all.items {
		out = append(out, m.p)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Proxy) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Get returns the proxy id if it is in the rotation.
func (r *Rotation) Get(id string) (Proxy, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if m := r.idx.members[id]; m != nil {
		return m.p, true
	}
	return Proxy{}, false
}

// Len is the number of proxies in the rotation.
func (r *Rotation) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.idx.all.items)
}

// Changed returns a channel closed at the next change of the rotation;
// take it again after it closes:
//
//	for {
//		ch := rot.Changed()
//		use(rot.Proxies())
//		<-ch
//	}
func (r *Rotation) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.taken = true
	return r.changed
}

// changedLocked counts a change and wakes whoever waits in Changed; with
// r.mu held.
func (r *Rotation) changedLocked() {
	r.changes.Add(1)
	if r.taken {
		close(r.changed)
		r.changed = make(chan struct{})
		r.taken = false
	}
}

// readyLocked records that the rotation has been read; with r.mu held.
func (r *Rotation) readyLocked() {
	if r.isReady {
		return
	}
	r.isReady = true
	close(r.ready)
	r.log.Info("rotation ready", "proxies", len(r.idx.all.items))
}
