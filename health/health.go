package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/health/defaults"
	"proxyfleet/internal/lease"
	"proxyfleet/messages"
)

// NoHTTP as Config.HTTPAddr serves no HTTP of its own: the caller mounts
// Handler where it likes.
const NoHTTP = "-"

// Config of a health process. New fills the zero values with defaults (see
// WithDefaults).
type Config struct {
	Subjects messages.Subjects
	// HTTPAddr is the listen address of /rotation, /healthz, /readyz and
	// /metrics;
	// a port of 0 picks a free one (see Health.Addr). Empty:
	// defaults.HTTPAddr; NoHTTP: none.
	HTTPAddr string
	Logger   *slog.Logger
	// Now is the clock of the fold (grace, probe times), of the
	// snapshots' time and of the lease's validity and expiry.
	Now func() time.Time
	// Grace is how long a proxy keeps its place after reporting
	// provisioning without an address from the same command and host
	// (another command or host takes it out at once). Zero demotes it at
	// once.
	Grace time.Duration

	// OpTimeout bounds each request to NATS made while publishing
	// (default 5s).
	OpTimeout time.Duration
	// RetryInterval is the wait before publishing again after a failure
	// (default 1s).
	RetryInterval time.Duration
	// CatchUpPoll is how often the consumer's info is read while catching
	// up, in case no message says it was the last (default 500ms).
	CatchUpPoll time.Duration
	// CheckInterval is how often the stream, the buckets and the
	// consumer are looked at, to repair what someone deleted (default
	// 2s). It is also the consumer's heartbeat (at least 500ms): a
	// consumer that was deleted without a word is noticed after two.
	CheckInterval time.Duration

	// Probing. A proxy is probed with a request through it to a target
	// that answers a value the prober checks (see HTTPProber). The prober
	// is Prober if set, else an HTTPProber of Target if set, else of this
	// process's own /probe served on ProbeListen. With none of the three,
	// a TCP connect to each proxy's address is all that is probed
	// (TCPProber; logged at warn level at start). Proxies of the sim
	// driver (a running event with source sim) are never probed: they
	// enter on their event.

	// Prober probes one proxy; tests inject one.
	Prober Prober
	// Target is the URL probed through each proxy (http or https). A
	// nonce query parameter is added; the answer must contain Expect or,
	// if Expect is empty, the nonce. Only a target that answers as
	// ProbeHandler does (a health process's /probe) reports the proxy's
	// egress and the headers that reached it; another yields no egress
	// and no leak verdict (the open check works with any target).
	Target string
	Expect string
	// ProbeListen is an address the guests can reach (an IP, not a
	// wildcard, when Target is empty) where this process serves
	// GET /probe?nonce=N, answering N. With an empty Target, the target is
	// http://<its bound address>/probe.
	ProbeListen string
	// TargetIPv6 is the URL probed through each proxy for its IPv6
	// egress addresses, as Target is for its IPv4 ones: each probe names
	// one of the proxy's addresses (messages.HeaderEgress), and squid uses
	// a named address only over its family. Its host is an IPv6 address
	// or a name the guests reach over IPv6. Empty: the /probe served on
	// ProbeListenIPv6, if set; with neither, no IPv6 egress address is
	// probed one by one (proxyfleet_health_egress_target{family="ipv6"}
	// is 0). Needs Target or ProbeListen, whose target is then the IPv4
	// one; set when that one is itself an IPv6 address, it is an error.
	TargetIPv6 string
	// ProbeListenIPv6 is a second address (an IPv6 one the guests can
	// reach, when TargetIPv6 is empty) where this process serves
	// GET /probe: with an empty TargetIPv6, the IPv6 target is
	// http://[its bound address]/probe.
	ProbeListenIPv6 string
	// Interval between probe rounds (default 2s); Timeout of each probe
	// (default 80% of Interval).
	Interval time.Duration
	Timeout  time.Duration
	// Rise passing probes in a row put a proxy in the rotation (default
	// 2); Fall failing ones take it out (default 3).
	Rise, Fall int
	// Concurrency bounds the probes in flight (default 64).
	Concurrency int

	// ProxyUser and ProxyPassword are the credentials the fleet's proxies
	// require (proxy.auth): every probe health makes through a proxy
	// carries them (Proxy-Authorization: Basic), and with a target to
	// probe, a proxy is also checked to refuse the same request without
	// them (see OpenCheckInterval). An empty user: no credentials, no
	// open check. The password is never logged, nor put in an error,
	// a metric or anything published.
	ProxyUser, ProxyPassword string
	// OpenCheckInterval is how often a proxy in the rotation is checked
	// again to refuse a request without credentials (default 1m). A
	// candidate is checked before it enters, and one found open is
	// checked at every round until it refuses.
	OpenCheckInterval time.Duration
	// ReportInterval is how soon after a report made health probe a proxy
	// another report of it asks for nothing (default 5s); ReportRate how
	// many probes a second reports may ask for over all proxies (default
	// 20). See report.go.
	ReportInterval time.Duration
	ReportRate     float64

	// SnapshotInterval is the least time between two snapshots published
	// on <prefix>.rotation (default 1s): a snapshot costs O(fleet) bytes,
	// so under churn it is sent at this pace, the latest version each
	// time, while the feed carries every change as it happens. The first
	// change after a quiet interval goes out at once.
	SnapshotInterval time.Duration
	// SnapshotRate bounds the bytes a second the snapshots on
	// <prefix>.rotation carry under churn (default 256 KiB): after a
	// snapshot of B bytes the next waits B/SnapshotRate if that is longer
	// than SnapshotInterval, so a 1 MiB snapshot goes out at most every
	// 4 s at the default (docs/DECISIONS.md, "Snapshots paced by their
	// bytes"). The feed is not paced.
	SnapshotRate int
	// SnapshotMaxBytes is the largest snapshot published whole on
	// <prefix>.rotation (0: the server's max_payload, 1 MiB by default);
	// a larger rotation is announced there with a notice (truncated,
	// its size, the feed's subject) instead of its proxies.
	SnapshotMaxBytes int

	// LeaseTTL is how long the publisher's lease in PROXY_LEASES lasts
	// without a renewal (default 15s); the holder renews every third of
	// it, a standby takes over once the lease's revision has not changed
	// for that long. At most the bucket's own TTL.
	LeaseTTL time.Duration
	// Instance names this process in the lease (default host-pid-random).
	Instance string

	// Registry is where the process registers its metrics and what
	// /metrics serves (the process's registry: cmd/proxyfleet adds the Go,
	// process and build collectors and the worker's metrics); nil: a
	// registry of this process's own. Nothing is registered globally.
	Registry *prometheus.Registry
	// ReadyCheck, if set, must also return nil for /readyz to answer 200
	// (serve adds its worker's readiness).
	ReadyCheck func() error

	// leaseLooked, if set, is called by the loop after each look at the
	// lease (a renewal, or a standby's read): a test that must show a
	// lease was not taken, or that a standby published nothing, waits
	// for the loop's looks instead of sleeping. Set by export_test.go.
	leaseLooked func()
}

// feedRingBytes bounds the feed messages kept for GET /rotation?since=V.
const feedRingBytes = 1 << 20

// WithDefaults returns cfg with every zero value (and negative duration)
// filled with its default, the constants of package health/defaults,
// which package config fills a file's gaps with too. Timeout's follows
// Interval (defaults.Timeout); Grace has none (zero demotes at once);
// Instance is New's to make.
func (cfg Config) WithDefaults() Config {
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = defaults.HTTPAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.OpTimeout, defaults.OpTimeout)
	def(&cfg.RetryInterval, defaults.RetryInterval)
	def(&cfg.CatchUpPoll, defaults.CatchUpPoll)
	def(&cfg.CheckInterval, defaults.CheckInterval)
	def(&cfg.Interval, defaults.Interval)
	def(&cfg.Timeout, defaults.Timeout(cfg.Interval))
	def(&cfg.LeaseTTL, defaults.LeaseTTL)
	def(&cfg.SnapshotInterval, defaults.SnapshotInterval)
	if cfg.SnapshotRate == 0 {
		cfg.SnapshotRate = defaults.SnapshotRate
	}
	def(&cfg.OpenCheckInterval, defaults.OpenCheckInterval)
	def(&cfg.ReportInterval, defaults.ReportInterval)
	if cfg.ReportRate <= 0 {
		cfg.ReportRate = defaults.ReportRate
	}
	cfg.Rise = cmp.Or(cfg.Rise, defaults.Rise)
	cfg.Fall = cmp.Or(cfg.Fall, defaults.Fall)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaults.Concurrency)
	return cfg
}

// Health consumes state events and publishes the rotation.
type Health struct {
	cfg  Config
	js   jetstream.JetStream
	nc   *nats.Conn
	subj messages.Subjects
	log  *slog.Logger
	now  func() time.Time

	// mu guards the fold and everything derived from it.
	mu          sync.Mutex
	fold        *Fold
	undecodable uint64 // events the fold never saw: bad subject or body
	handledSeq  uint64 // stream sequence of the last event handled
	// the consumer and consumer sequence of the last event handled
	handledConsumer    string
	handledConsumerSeq uint64
	startLastSeq       uint64 // the stream's last sequence when the consumer started
	feedGen            uint64 // generation of the current consumer; messages of older ones are ignored
	suspect            error  // trouble the consumer reported, for the keeper to look at
	suspectAt          time.Time
	missing            map[string]*missingSince // streams and buckets found gone, by "kind name"
	bindErr            error                    // why the first bind has not happened yet
	repairs            uint64                   // consumers made anew
	caughtUp           bool
	caughtUpCh         chan struct{}
	version            uint64 // the last version known to be published (by anyone)
	publishErrors      uint64
	publishCount       uint64
	publishErr         error  // of the last attempt to publish, nil if it worked
	published          uint64 // the last version this process published

	// The published rotation (see view.go, publish.go): the view, the
	// ids the fold marked that may differ from it (by the drain that
	// marked them), whether the next message is a reset, the last
	// messages for ?since, and whether the feed carried a message since
	// the last heartbeat's turn.
	view        *view
	pending     map[string]uint64
	pendingPeak int // the most ids pending since pending was made
	drains      uint64
	feedReset   bool
	ring        feedRing
	feedSent    bool
	feed        feedStats
	snap        snapState
	pages       map[string]uint64 // page requests by outcome
	bans        banState          // the answers to <prefix>.ban (bans.go)
	http        httpCache
	httpAnswers map[string]uint64 // GET /rotation by answer

	wake chan struct{}

	// The lifecycle (see Run): ln, srv, probeLn and probeSrv are set by
	// Run before it closes started, then only read.
	ran      atomic.Bool
	started  chan struct{}
	ln       net.Listener
	srv      *http.Server
	serveErr chan error // a server that stopped serving
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// bucket is what the loop believes PROXY_ROTATION holds; nil until it
	// has been read once, after the catch-up. Owned by the loop.
	bucket map[string]string

	// Set by the first successful bind (in Run's start, or by the keeper), then
	// only read, by the loop once boundCh is closed.
	kv      jetstream.KeyValue
	boundCh chan struct{}
	// Owned by Run's start, then by the keeper (see feed.go).
	bound         bool
	seeded        int
	events        *feed
	feedSeq       uint64
	streamCreated time.Time
	bindLogged    time.Time
	check         chan struct{} // asks the keeper to look at once

	prober     Prober
	tcpOnly    bool        // no target: the prober is a TCPProber
	sched      *probeSched // set by Run's start when probing, before it binds
	probeLn    net.Listener
	probeSrv   *http.Server
	pendingV6  *HTTPProber  // TargetIPv6's prober, until ProbeListen's is made
	probeLn6   net.Listener // ProbeListenIPv6's
	probeSrv6  *http.Server
	lease      *lease.Lease       // owned by the loop
	pageSub    *nats.Subscription // owned by the loop: answering page requests while serving
	holder     bool               // mirror of lease.holding, under mu
	takeovers  uint64
	leaseErr   error
	probeStats probeStats
	// probeLatency is the histogram of probe durations; registry what
	// /metrics serves.
	probeLatency prometheus.Histogram
	admission    prometheus.Histogram // latency.go
	registry     *prometheus.Registry

	// PROXY_CHECKS: checksKV is set (under mu) once the bucket is bound;
	// the checks writer owns checksBucket. leaseUntil and leaseEpoch
	// mirror the loop's lease for the writer: until when the holder may
	// write, and a count of takeovers and losses (a new epoch re-reads
	// the bucket).
	checksKV     jetstream.KeyValue
	checksErr    error
	checksWrites uint64
	leaseUntil   time.Time
	leaseEpoch   uint64
	checksWake   chan struct{}

	reports reports // under mu
}

// New returns a health process on js. Call Run to run it.
func New(js jetstream.JetStream, cfg Config) (*Health, error) {
	if js == nil {
		return nil, errors.New("health: no JetStream context")
	}
	if cfg.Grace < 0 {
		return nil, fmt.Errorf("health: negative grace %v", cfg.Grace)
	}
	cfg = cfg.WithDefaults()
	if !messages.ValidPrefix(cfg.Subjects.Prefix) {
		return nil, fmt.Errorf("health: invalid subject prefix %q", cfg.Subjects.Prefix)
	}
	switch {
	case cfg.Rise < 0:
		return nil, fmt.Errorf("health: rise %d is negative", cfg.Rise)
	case cfg.Fall < 0:
		return nil, fmt.Errorf("health: fall %d is negative", cfg.Fall)
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("health: concurrency %d is negative", cfg.Concurrency)
	case cfg.Timeout > cfg.Interval:
		return nil, fmt.Errorf("health: probe timeout %v is longer than the interval %v", cfg.Timeout, cfg.Interval)
	}
	if cfg.SnapshotRate < 0 {
		return nil, fmt.Errorf("health: snapshot rate %d is negative", cfg.SnapshotRate)
	}
	if cfg.SnapshotMaxBytes < 0 {
		return nil, fmt.Errorf("health: snapshot max bytes %d is negative", cfg.SnapshotMaxBytes)
	}
	if cfg.ProxyUser == "" && cfg.ProxyPassword != "" {
		return nil, errors.New("health: a proxy password without a user")
	}
	if cfg.Instance == "" {
		host, _ := os.Hostname()
		nonce, _ := newNonce()
		cfg.Instance = fmt.Sprintf("%s-%d-%.8s", host, os.Getpid(), nonce)
	}
	h := &Health{
		cfg: cfg, js: js, nc: js.Conn(), subj: cfg.Subjects,
		log: cfg.Logger.With("component", "health", "instance", cfg.Instance), now: cfg.Now,
		fold:        NewFold(cfg.Grace, cfg.Now),
		caughtUpCh:  make(chan struct{}),
		started:     make(chan struct{}),
		serveErr:    make(chan error, 2),
		wake:        make(chan struct{}, 1),
		boundCh:     make(chan struct{}),
		check:       make(chan struct{}, 1),
		checksWake:  make(chan struct{}, 1),
		missing:     make(map[string]*missingSince),
		probeStats:  newProbeStats(),
		view:        newView(),
		pending:     make(map[string]uint64),
		feedReset:   true, // the first message of a lease is a reset
		ring:        feedRing{max: feedRingBytes},
		pages:       map[string]uint64{PageServed: 0, PageInvalid: 0, PageStandby: 0},
		httpAnswers: map[string]uint64{HTTPSnapshot: 0, HTTPChanges: 0, HTTPNotModified: 0},
		reports:     newReports(cfg.ReportRate),

		probeLatency: newProbeLatency(),
		registry:     cfg.Registry,
	}
	h.prober = cfg.Prober
	if h.prober == nil && cfg.Target != "" {
		p, err := NewHTTPProber(cfg.Target, cfg.Expect, h.proberOptions()...)
		if err != nil {
			return nil, fmt.Errorf("health: %w", err)
		}
		h.prober = p
	}
	if h.prober == nil && cfg.ProbeListen != "" {
		host, _, err := net.SplitHostPort(cfg.ProbeListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
			return nil, fmt.Errorf("health: probe listen address %q: with no target, it must be an IP the guests can reach (or set a target)", cfg.ProbeListen)
		}
		// The prober is made once the listener is bound (its port may be 0).
		if _, err := NewHTTPProber("http://"+cfg.ProbeListen+ProbePath, cfg.Expect, h.proberOptions()...); err != nil {
			return nil, fmt.Errorf("health: %w", err) // the credentials, checked now
		}
	}
	if err := h.checkIPv6Target(); err != nil {
		return nil, err
	}
	if h.prober == nil && cfg.ProbeListen == "" {
		// Nothing to probe through the proxies: at least something must
		// listen on a proxy's port before it enters.
		h.prober, h.tcpOnly = TCPProber{}, true
	}
	h.fold.Rise, h.fold.Fall = cfg.Rise, cfg.Fall
	h.fold.OpenInterval = cfg.OpenCheckInterval
	h.setCheckOpen()
	if h.registry == nil {
		h.registry = prometheus.NewRegistry()
	}
	if err := h.registry.Register(collector{h}); err != nil {
		return nil, fmt.Errorf("health: register metrics: %w", err)
	}
	if err := h.initLatency(); err != nil {
		return nil, fmt.Errorf("health: register metrics: %w", err)
	}
	return h, nil
}

// proberOptions are the options of the HTTPProbers health makes.
func (h *Health) proberOptions() []ProberOption {
	return []ProberOption{WithCredentials(h.cfg.ProxyUser, h.cfg.ProxyPassword)}
}

// setCheckOpen tells the fold whether candidates must pass an open check
// (the prober can make one: it has credentials to leave out), and the
// families of the egress addresses probes name (those the prober has a
// target for).
func (h *Health) setCheckOpen() {
	c, ok := h.prober.(Checker)
	h.fold.CheckOpen = ok && c.ChecksOpen()
	h.fold.EgressFamilies = 0
	if e, ok := h.prober.(EgressChecker); ok {
		h.fold.EgressFamilies = e.Families()
	}
}

// checkIPv6Target checks TargetIPv6 and ProbeListenIPv6, and with an HTTP
// prober of Target, pairs it with one of TargetIPv6 (ProbeListenIPv6's is
// made once its listener is bound).
func (h *Health) checkIPv6Target() error {
	cfg := h.cfg
	if cfg.TargetIPv6 == "" && cfg.ProbeListenIPv6 == "" {
		return nil
	}
	field := "target_ipv6"
	if cfg.TargetIPv6 == "" {
		field = "probe_listen_ipv6"
	}
	if cfg.Target == "" && cfg.ProbeListen == "" {
		return fmt.Errorf("health: %s without a target or probe listen address for IPv4", field)
	}
	main := cfg.Target
	if main == "" {
		main = "http://" + cfg.ProbeListen
	}
	if u, err := url.Parse(main); err == nil {
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && a.Unmap().Is6() {
			return fmt.Errorf("health: %s with an IPv6 target (%s): that one is the IPv6 target already", field, u.Host)
		}
	}
	if cfg.ProbeListenIPv6 != "" && cfg.TargetIPv6 == "" {
		host, _, err := net.SplitHostPort(cfg.ProbeListenIPv6)
		if a, perr := netip.ParseAddr(host); err != nil || perr != nil || !a.Is6() || a.Is4In6() || a.IsUnspecified() {
			return fmt.Errorf("health: probe listen address for IPv6 %q: with no IPv6 target, it must be an IPv6 address the guests can reach", cfg.ProbeListenIPv6)
		}
		if _, err := NewHTTPProber("http://"+cfg.ProbeListenIPv6+ProbePath, cfg.Expect, h.proberOptions()...); err != nil {
			return fmt.Errorf("health: %w", err)
		}
	}
	if cfg.TargetIPv6 == "" {
		return nil
	}
	p6, err := NewHTTPProber(cfg.TargetIPv6, cfg.Expect, h.proberOptions()...)
	if err != nil {
		return fmt.Errorf("health: ipv6 %w", err)
	}
	if a, err := netip.ParseAddr(p6.Target.Hostname()); err == nil && a.Unmap().Is4() {
		return fmt.Errorf("health: ipv6 probe target %q: its host is an IPv4 address", cfg.TargetIPv6)
	}
	h.pairIPv6(p6)
	return nil
}

// pairIPv6 makes the prober one that sends probes naming an IPv6 address
// to p6, if it is an HTTP prober of its own target (not a Config.Prober).
func (h *Health) pairIPv6(p6 *HTTPProber) {
	if v4, ok := h.prober.(*HTTPProber); ok && h.cfg.Prober == nil {
		h.prober = familyProber{v4: v4, v6: p6}
	} else if h.prober == nil {
		h.pendingV6 = p6 // paired once ProbeListen's prober is made
	}
}

// Addr is the address HTTP is served on, once started ("" before, or with
// NoHTTP).
func (h *Health) Addr() string {
	if h.ln == nil {
		return ""
	}
	return h.ln.Addr().String()
}

// ProbeAddr is the address the probe target is served on, once started
// ("" without ProbeListen).
func (h *Health) ProbeAddr() string {
	if h.probeLn == nil {
		return ""
	}
	return h.probeLn.Addr().String()
}

// ProbeAddrIPv6 is the address the probe target is served on for IPv6,
// once started ("" without ProbeListenIPv6).
func (h *Health) ProbeAddrIPv6() string {
	if h.probeLn6 == nil {
		return ""
	}
	return h.probeLn6.Addr().String()
}

func (h *Health) probeTarget() string {
	switch p := h.prober.(type) {
	case *HTTPProber:
		return p.Target.Redacted()
	case familyProber:
		return p.v4.Target.Redacted() + " (IPv4), " + p.v6.Target.Redacted() + " (IPv6)"
	case TCPProber:
		return "a TCP connect to each proxy"
	}
	return fmt.Sprintf("%T", h.prober)
}

// Holder reports whether this process holds the publisher's lease.
func (h *Health) Holder() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holder
}

// CaughtUp is closed once the events the stream held at start are folded.
func (h *Health) CaughtUp() <-chan struct{} { return h.caughtUpCh }

// Rotation returns the rotation this process serves and whether it is
// complete (caught up; before that it is empty): the lease holder's last
// published version, a standby's own fold (see viewLocked). O(fleet).
func (h *Health) Rotation() (messages.Rotation, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.caughtUp {
		return messages.Rotation{V: messages.Version, Proxies: []messages.RotationEntry{}}, false
	}
	return h.viewLocked().rotation(), true
}

// viewLocked returns the view to serve: the lease holder's published one
// as it is; a standby's (or a holder's before its first message) brought
// up to its fold, at the last version it knows to be published. Only the
// loop publishes, and only when it holds the lease, so this never brings
// forward what a message being published has yet to carry.
func (h *Health) viewLocked() *view {
	if !h.holder || h.feedReset {
		h.materializeLocked()
		h.view.version = max(h.view.version, h.version)
	}
	return h.view
}

// Ready reports whether the process has caught up and its last attempt to
// publish the rotation worked; if not, the error says why.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.missingErrorLocked(); err != nil {
		return err
	}
	if !h.caughtUp {
		if h.bindErr != nil && h.feedGen == 0 {
			return fmt.Errorf("catching up: %w", h.bindErr)
		}
		return errors.New("catching up")
	}
	if h.publishErr != nil {
		return fmt.Errorf("publishing the rotation: %w", h.publishErr)
	}
	if h.leaseErr != nil {
		return fmt.Errorf("lease: %w", h.leaseErr)
	}
	if h.checksErr != nil {
		return fmt.Errorf("writing %s: %w", messages.BucketChecks, h.checksErr)
	}
	return nil
}

func (h *Health) caughtUpLocked(why string) {
	if h.caughtUp {
		return
	}
	h.caughtUp = true
	close(h.caughtUpCh)
	if h.fold.DropUnseen() {
		h.log.Info("dropped proxies of the published rotation that no event knows")
	}
	h.log.Info("caught up", "why", why, "rotation", h.fold.Len(), "events", h.fold.Stats().Events+h.undecodable)
	h.signal()
}
