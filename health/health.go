package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/internal/lease"
	"proxyfleet/messages"
)

// feedRingBytes bounds the feed messages kept for GET /rotation?since=V.
const feedRingBytes = 1 << 20

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
	cfg = cfg.WithDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
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
	if err := h.initProber(); err != nil {
		return nil, err
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
