package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// DefaultHTTPAddr is where the health process serves HTTP unless told.
const DefaultHTTPAddr = "127.0.0.1:8080"

// NoHTTP as Config.HTTPAddr serves no HTTP of its own: the caller mounts
// Handler where it likes.
const NoHTTP = "-"

// Config of a health process. New fills the zero values with defaults.
type Config struct {
	Subjects messages.Subjects
	// HTTPAddr is the listen address of /rotation, /healthz and /metrics;
	// a port of 0 picks a free one (see Health.Addr). Empty: DefaultHTTPAddr;
	// NoHTTP: none.
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

	// Probing. A proxy is probed with a request through it to a target
	// that answers a value the prober checks (see HTTPProber). The prober
	// is Prober if set, else an HTTPProber of Target if set, else of this
	// process's own /probe served on ProbeListen. With none of the three,
	// nothing is probed: a running event puts a proxy in the rotation at
	// once (events only, as before probing; Rise and Fall unused).

	// Prober probes one proxy; tests inject one.
	Prober Prober
	// Target is the URL probed through each proxy (http or https). A
	// nonce query parameter is added; the answer must contain Expect or,
	// if Expect is empty, the nonce.
	Target string
	Expect string
	// ProbeListen is an address the guests can reach (an IP, not a
	// wildcard, when Target is empty) where this process serves
	// GET /probe?nonce=N, answering N. With an empty Target, the target is
	// http://<its bound address>/probe.
	ProbeListen string
	// Interval between probe rounds (default 2s); Timeout of each probe
	// (default 80% of Interval).
	Interval time.Duration
	Timeout  time.Duration
	// Rise passing probes in a row put a proxy in the rotation (default
	// 2); Fall failing ones take it out (default 3).
	Rise, Fall int
	// Concurrency bounds the probes in flight (default 64).
	Concurrency int

	// LeaseTTL is how long the publisher's lease in PROXY_LEASES lasts
	// without a renewal (default 15s); the holder renews every third of
	// it, a standby takes over once the lease's revision has not changed
	// for that long. At most the bucket's own TTL.
	LeaseTTL time.Duration
	// Instance names this process in the lease (default host-pid-random).
	Instance string
}

// DefaultLeaseTTL is Config.LeaseTTL's default.
const DefaultLeaseTTL = 15 * time.Second

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
	caughtUp           bool
	caughtUpCh         chan struct{}
	version            uint64
	snap               messages.Rotation
	publishErrors      uint64
	publishCount       uint64
	publishErr         error  // of the last attempt to publish, nil if it worked
	published          uint64 // version of the last snapshot published

	wake chan struct{}

	startOnce sync.Once
	started   bool
	kv        jetstream.KeyValue
	cons      jetstream.Consumer
	cc        jetstream.ConsumeContext
	ln        net.Listener
	srv       *http.Server
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	stopOnce  sync.Once

	// bucket is what the loop believes PROXY_ROTATION holds; nil until it
	// has been read once, after the catch-up. Owned by the loop.
	bucket map[string]string

	prober     Prober
	probeLn    net.Listener
	probeSrv   *http.Server
	lease      *lease // owned by the loop
	holder     bool   // mirror of lease.holding, under mu
	takeovers  uint64
	leaseErr   error
	pubGen     uint64 // generation of the fold last published
	gen        uint64 // generation of the fold: grows on every change once caught up
	probeStats probeStats
}

// New returns a health process on js. Call Start to run it.
func New(js jetstream.JetStream, cfg Config) (*Health, error) {
	if js == nil {
		return nil, errors.New("health: no JetStream context")
	}
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	if !messages.ValidPrefix(cfg.Subjects.Prefix) {
		return nil, fmt.Errorf("health: invalid subject prefix %q", cfg.Subjects.Prefix)
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = DefaultHTTPAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Grace < 0 {
		return nil, fmt.Errorf("health: negative grace %v", cfg.Grace)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.OpTimeout, 5*time.Second)
	def(&cfg.RetryInterval, time.Second)
	def(&cfg.CatchUpPoll, 500*time.Millisecond)
	def(&cfg.Interval, 2*time.Second)
	def(&cfg.Timeout, cfg.Interval*8/10)
	def(&cfg.LeaseTTL, DefaultLeaseTTL)
	if cfg.Rise == 0 {
		cfg.Rise = 2
	}
	if cfg.Fall == 0 {
		cfg.Fall = 3
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 64
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
	if cfg.Instance == "" {
		host, _ := os.Hostname()
		nonce, _ := newNonce()
		cfg.Instance = fmt.Sprintf("%s-%d-%.8s", host, os.Getpid(), nonce)
	}
	h := &Health{
		cfg: cfg, js: js, nc: js.Conn(), subj: cfg.Subjects,
		log: cfg.Logger.With("component", "health", "instance", cfg.Instance), now: cfg.Now,
		fold:       NewFold(cfg.Grace, cfg.Now),
		caughtUpCh: make(chan struct{}),
		wake:       make(chan struct{}, 1),
		probeStats: newProbeStats(),
	}
	h.prober = cfg.Prober
	if h.prober == nil && cfg.Target != "" {
		p, err := NewHTTPProber(cfg.Target, cfg.Expect)
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
	}
	if h.probing() {
		h.fold.Rise, h.fold.Fall = cfg.Rise, cfg.Fall
	}
	return h, nil
}

// probing reports whether proxies are probed (else: events only).
func (h *Health) probing() bool {
	return h.cfg.Prober != nil || h.cfg.Target != "" || h.cfg.ProbeListen != ""
}

// Start binds the stream and the bucket (created by the worker's topology;
// a missing one is an error naming it), listens on HTTPAddr and starts
// consuming. It returns once all runs; CaughtUp tells when the initial
// picture is complete.
func (h *Health) Start(ctx context.Context) error {
	err := errors.New("health: already started")
	h.startOnce.Do(func() { err = h.start(ctx) })
	return err
}

func (h *Health) start(ctx context.Context) error {
	stream, err := h.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return fmt.Errorf("health: bind stream %s (the worker creates it): %w", messages.StreamEvents, err)
	}
	if h.kv, err = h.js.KeyValue(ctx, messages.BucketRotation); err != nil {
		return fmt.Errorf("health: bind bucket %s (the worker creates it): %w", messages.BucketRotation, err)
	}
	leases, err := h.js.KeyValue(ctx, messages.BucketLeases)
	if err != nil {
		return fmt.Errorf("health: bind bucket %s (the worker creates it): %w", messages.BucketLeases, err)
	}
	st, err := leases.Status(ctx)
	if err != nil {
		return fmt.Errorf("health: read bucket %s: %w", messages.BucketLeases, err)
	}
	if st.TTL() > 0 && h.cfg.LeaseTTL > st.TTL() {
		return fmt.Errorf("health: lease ttl %v is longer than bucket %s's TTL %v", h.cfg.LeaseTTL, messages.BucketLeases, st.TTL())
	}
	h.lease = &lease{kv: leases, id: h.cfg.Instance, ttl: h.cfg.LeaseTTL, now: h.now, op: min(h.cfg.OpTimeout, h.cfg.LeaseTTL/3)}

	// Start from what is published: the proxies in PROXY_ROTATION are in
	// the rotation as risen until their events or probes say otherwise,
	// so a restart never empties it.
	seed, err := h.readBucket(ctx)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	h.mu.Lock()
	seeded := 0
	for id, addr := range seed {
		if messages.ValidID(id) && h.fold.Seed(id, addr, h.now()) {
			seeded++
		}
	}
	h.mu.Unlock()

	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("health: read stream %s: %w", messages.StreamEvents, err)
	}
	h.cons, err = stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{h.subj.StateAll()},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("health: ordered consumer on %s: %w", messages.StreamEvents, err)
	}
	if h.cfg.HTTPAddr != NoHTTP {
		if h.ln, err = net.Listen("tcp", h.cfg.HTTPAddr); err != nil {
			return fmt.Errorf("health: listen on %s: %w", h.cfg.HTTPAddr, err)
		}
		h.srv = &http.Server{Handler: h.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	}
	if h.cfg.ProbeListen != "" {
		if h.probeLn, err = net.Listen("tcp", h.cfg.ProbeListen); err != nil {
			if h.ln != nil {
				h.ln.Close()
			}
			return fmt.Errorf("health: listen on %s for probes: %w", h.cfg.ProbeListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET "+ProbePath, ProbeHandler())
		h.probeSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
		if h.prober == nil {
			p, err := NewHTTPProber("http://"+h.probeLn.Addr().String()+ProbePath, h.cfg.Expect)
			if err != nil {
				h.probeLn.Close()
				if h.ln != nil {
					h.ln.Close()
				}
				return fmt.Errorf("health: %w", err)
			}
			h.prober = p
		}
	}

	h.mu.Lock()
	h.startLastSeq = info.State.LastSeq
	h.mu.Unlock()

	h.cc, err = h.cons.Consume(h.handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		h.log.Warn("consuming state events", "err", err)
	}))
	if err != nil {
		if h.ln != nil {
			h.ln.Close()
		}
		if h.probeLn != nil {
			h.probeLn.Close()
		}
		return fmt.Errorf("health: consume %s: %w", messages.StreamEvents, err)
	}
	if info.State.Msgs == 0 {
		// Nothing to catch up with; whatever came in since is new.
		h.mu.Lock()
		h.caughtUpLocked("the stream was empty")
		h.mu.Unlock()
	}
	runCtx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.started = true
	if h.srv != nil {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error("http server", "err", err)
			}
		}()
	}
	if h.probeSrv != nil {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := h.probeSrv.Serve(h.probeLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error("probe target server", "err", err)
			}
		}()
	}
	if h.prober != nil {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.probeLoop(runCtx)
		}()
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.loop(runCtx)
	}()
	if h.prober != nil {
		h.log.Info("health started", "http", h.Addr(), "grace", h.cfg.Grace, "seeded", seeded,
			"probe_target", h.probeTarget(), "interval", h.cfg.Interval, "timeout", h.cfg.Timeout,
			"rise", h.cfg.Rise, "fall", h.cfg.Fall, "lease_ttl", h.cfg.LeaseTTL)
	} else {
		h.log.Warn("health started without probing: a running event alone puts a proxy in the rotation (set a probe target or listen address)",
			"http", h.Addr(), "grace", h.cfg.Grace, "seeded", seeded, "lease_ttl", h.cfg.LeaseTTL)
	}
	return nil
}

// Stop stops consuming, publishing and serving, and waits for its
// goroutines (or for ctx).
func (h *Health) Stop(ctx context.Context) {
	h.stopOnce.Do(func() {
		h.startOnce.Do(func() {}) // a Start after Stop fails
		if !h.started {
			return
		}
		h.cc.Stop()
		select {
		case <-h.cc.Closed():
		case <-ctx.Done():
		}
		h.cancel()
		for _, srv := range []*http.Server{h.srv, h.probeSrv} {
			if srv == nil {
				continue
			}
			if err := srv.Shutdown(ctx); err != nil {
				h.log.Warn("http shutdown", "err", err)
				srv.Close()
			}
		}
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			h.log.Warn("health stop: goroutines still running", "err", ctx.Err())
		}
		// The ordered consumer is ephemeral; remove it now rather than
		// after its inactivity threshold.
		if ci := h.cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
			_ = h.js.DeleteConsumer(dctx, messages.StreamEvents, ci.Name)
			cancel()
		}
		h.log.Info("health stopped")
	})
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

func (h *Health) probeTarget() string {
	if p, ok := h.prober.(*HTTPProber); ok {
		return p.Target.Redacted()
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

// Rotation returns the current snapshot and whether it is complete (caught
// up); before that it is empty.
func (h *Health) Rotation() (messages.Rotation, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snap, h.caughtUp
}

// Ready reports whether the process has caught up and its last attempt to
// publish the rotation worked; if not, the error says why.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.caughtUp {
		return errors.New("catching up")
	}
	if h.publishErr != nil {
		return fmt.Errorf("publishing the rotation: %w", h.publishErr)
	}
	if h.leaseErr != nil {
		return fmt.Errorf("lease: %w", h.leaseErr)
	}
	return nil
}

// Metrics are the health process's counters.
type Metrics struct {
	RotationSize    int
	InGrace         int // of which kept on grace
	RotationVersion uint64
	Changes         uint64 // changes of the rotation, catch-up included
	Entries         uint64 // proxies that entered the rotation (seeded at start included)
	Exits           uint64 // proxies that left it
	Events          uint64 // state events received
	Ignored         uint64 // of which stale, duplicate or not understood
	Published       uint64 // snapshots this process published
	PublishErrors   uint64
	CaughtUp        bool
	Holder          bool   // this process holds the lease and publishes
	Takeovers       uint64 // times this process took the lease
	Probing         bool
	Targets         int               // proxies being probed
	Probes          map[string]uint64 // probe outcomes by result (ResultOK, ...)
	ProbesIgnored   uint64            // results that came too late to count
	// ProbeLatency is a histogram of probe durations: cumulative counts
	// for each bound of ProbeBuckets, then +Inf.
	ProbeLatency      []uint64
	ProbeLatencySum   time.Duration
	ProbeLatencyCount uint64
}

// ProbeBuckets are the upper bounds of the probe latency histogram.
var ProbeBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// probeStats counts probe outcomes and latencies.
type probeStats struct {
	results map[string]uint64
	buckets []uint64 // not cumulative; len(ProbeBuckets)+1
	sum     time.Duration
	count   uint64
}

func newProbeStats() probeStats {
	r := make(map[string]uint64, len(probeResults))
	for _, k := range probeResults {
		r[k] = 0
	}
	return probeStats{results: r, buckets: make([]uint64, len(ProbeBuckets)+1)}
}

func (s *probeStats) add(result string, d time.Duration) {
	s.results[result]++
	i := 0
	for i < len(ProbeBuckets) && d > ProbeBuckets[i] {
		i++
	}
	s.buckets[i]++
	s.sum += d
	s.count++
}

// Metrics returns the counters.
func (h *Health) Metrics() Metrics {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.fold.Stats()
	m := Metrics{
		RotationSize:      h.fold.Len(),
		InGrace:           h.fold.GraceLen(),
		RotationVersion:   h.version,
		Changes:           st.Changes,
		Entries:           st.Entries,
		Exits:             st.Exits,
		Events:            st.Events + h.undecodable,
		Ignored:           st.Ignored + h.undecodable,
		Published:         h.publishCount,
		PublishErrors:     h.publishErrors,
		CaughtUp:          h.caughtUp,
		Holder:            h.holder,
		Takeovers:         h.takeovers,
		Probing:           h.prober != nil,
		Targets:           len(h.fold.Targets()),
		Probes:            make(map[string]uint64, len(h.probeStats.results)),
		ProbesIgnored:     st.ProbesIgnored,
		ProbeLatency:      make([]uint64, len(h.probeStats.buckets)),
		ProbeLatencySum:   h.probeStats.sum,
		ProbeLatencyCount: h.probeStats.count,
	}
	for k, v := range h.probeStats.results {
		m.Probes[k] = v
	}
	var cum uint64
	for i, n := range h.probeStats.buckets {
		cum += n
		m.ProbeLatency[i] = cum
	}
	return m
}

// handle folds one message of PROXY_EVENTS. The ordered consumer calls it
// from one goroutine at a time.
func (h *Health) handle(msg jetstream.Msg) {
	md, mdErr := msg.Metadata()
	marker := msg.Headers().Get(jetstream.MarkerReasonHeader) != ""
	var ev messages.StateEvent
	var err error
	if !marker {
		ev, err = h.decode(msg.Subject(), msg.Data())
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case marker:
		// A server-placed marker (an event aged out, if the stream is
		// ever configured to leave markers): nothing to fold.
	case err != nil:
		h.undecodable++
		h.log.Warn("ignoring a state event", "subject", msg.Subject(), "err", err)
	default:
		if h.fold.Apply(ev) {
			h.changedLocked()
			if h.caughtUp {
				h.log.Info("rotation changed", "id", ev.ID, "state", ev.State, "ip", ev.IP, "host", ev.Host, "command_id", ev.CommandID, "seq", ev.Seq, "size", len(h.snap.Proxies), "version", h.version)
			}
		} else if h.fold.InGrace(ev.ID) && ev.State != messages.StateRunning {
			h.log.Info("keeping a proxy in the rotation during its grace", "id", ev.ID, "state", ev.State, "seq", ev.Seq, "grace", h.cfg.Grace)
		}
	}
	if mdErr == nil {
		h.handledSeq = max(h.handledSeq, md.Sequence.Stream)
		h.handledConsumer, h.handledConsumerSeq = md.Consumer, md.Sequence.Consumer
		switch {
		case md.NumPending == 0:
			h.caughtUpLocked("no event pending")
		case h.handledSeq >= h.startLastSeq:
			h.caughtUpLocked("reached the stream's last sequence at start")
		}
	}
	h.signal()
}

// decode reads a state event. It is lenient about fields it does not know
// (a newer worker may add some; a health process that dropped every event
// it could not fully read would freeze the rotation) and strict about the
// rest: the version, the size, and the id against the subject's.
func (h *Health) decode(subject string, body []byte) (messages.StateEvent, error) {
	var ev messages.StateEvent
	id, err := h.subj.ParseState(subject)
	if err != nil {
		return ev, err
	}
	if !messages.ValidID(id) {
		return ev, fmt.Errorf("invalid id %q", id)
	}
	if len(body) > messages.MaxBodySize {
		return ev, fmt.Errorf("body of %d bytes, more than %d", len(body), messages.MaxBodySize)
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, fmt.Errorf("malformed: %w", err)
	}
	if ev.V != messages.Version {
		return ev, fmt.Errorf("version %d, want %d", ev.V, messages.Version)
	}
	if ev.ID != id {
		return ev, fmt.Errorf("body id %q does not match the subject's %q", ev.ID, id)
	}
	return ev, nil
}

func (h *Health) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// changedLocked makes a new generation of the rotation once caught up.
// Before that, the fold is a partial picture and nothing is published. The
// snapshot served over HTTP carries the last version known to be
// published; a published snapshot gets its version when it is published.
func (h *Health) changedLocked() {
	if !h.caughtUp {
		return
	}
	h.gen++
	h.snap = messages.Rotation{V: messages.Version, Version: h.version, Proxies: h.fold.Snapshot(), At: h.now().UTC()}
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
	h.changedLocked()
	h.log.Info("caught up", "why", why, "rotation", len(h.snap.Proxies), "events", h.fold.Stats().Events+h.undecodable)
	h.signal()
}

// loop owns the lease, publishing and the grace timer.
func (h *Health) loop(ctx context.Context) {
	defer h.releaseLease()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	renew := time.NewTicker(h.cfg.LeaseTTL / 3)
	defer renew.Stop()
	leaseDue := true
	var retry, poll <-chan time.Time
	for {
		h.mu.Lock()
		if h.fold.Tick(h.now()) {
			h.changedLocked()
			h.log.Info("grace over: proxies demoted", "size", len(h.snap.Proxies))
		}
		deadline, graceRunning := h.fold.NextDeadline()
		caughtUp := h.caughtUp
		h.mu.Unlock()

		if leaseDue {
			leaseDue = false
			h.tickLease(ctx)
		}

		retry = nil
		err := h.publish(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		if err != nil {
			h.publishErrors++
		}
		h.publishErr = err
		h.mu.Unlock()
		if err != nil {
			// Read the bucket again before the next attempt: what
			// it holds is no longer known (it may even have been
			// deleted and created again).
			h.bucket = nil
			h.log.Warn("publishing the rotation", "err", err)
			retry = time.After(h.cfg.RetryInterval)
		}
		poll = nil
		if !caughtUp {
			h.pollCatchUp(ctx)
			poll = time.After(h.cfg.CatchUpPoll)
		}
		var graceC <-chan time.Time
		if graceRunning {
			timer.Reset(max(deadline.Sub(h.now()), time.Millisecond))
			graceC = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-graceC:
		case <-retry:
		case <-poll:
		case <-renew.C:
			leaseDue = true
		}
	}
}

// tickLease renews the lease or looks whether it can be taken. Taking it
// over reads PROXY_ROTATION: the proxies the previous holder had admitted
// and this process has as running at the same address are adopted, so a
// takeover removes no proxy that is passing, and the next publish
// reconciles the bucket with this process's fold.
func (h *Health) tickLease(ctx context.Context) {
	was := h.lease.holding
	took, err := h.lease.tick(ctx)
	if err != nil && ctx.Err() != nil {
		return
	}
	if err != nil {
		h.log.Warn("lease", "err", err, "holding", h.lease.holding)
	}
	if was && !h.lease.holding {
		h.log.Warn("lost the lease: standing by", "err", err)
		h.bucket = nil
	}
	h.mu.Lock()
	h.leaseErr = err
	h.holder = h.lease.holding
	h.version = max(h.version, h.lease.version)
	h.mu.Unlock()
	if !took {
		return
	}
	h.bucket = nil
	b, err := h.readBucket(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.takeovers++
	h.pubGen = 0 // publish at once, whatever this process published before
	adopted := 0
	if err == nil {
		h.bucket = b
		for id, addr := range b {
			if h.fold.Adopt(id, addr, h.now()) {
				adopted++
			}
		}
		if adopted > 0 {
			h.changedLocked()
		}
	}
	h.log.Info("took the lease: publishing", "revision", h.lease.rev, "last_version", h.lease.version, "adopted", adopted, "bucket_err", err)
}

func (h *Health) releaseLease() {
	if h.lease == nil || !h.lease.holding {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.OpTimeout)
	defer cancel()
	if err := h.lease.release(ctx); err != nil {
		h.log.Warn("releasing the lease (a standby takes over when it expires)", "err", err)
	} else {
		h.log.Info("lease released")
	}
	h.mu.Lock()
	h.holder = false
	h.mu.Unlock()
}

// pollCatchUp declares the catch-up complete if the consumer has nothing
// pending and everything it delivered was handled: the case where no
// message said it was the last one (events aged out while catching up).
func (h *Health) pollCatchUp(ctx context.Context) {
	ictx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	ci, err := h.cons.Info(ictx)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Compare consumer sequences, not stream ones: a consumer that
	// delivered nothing may still report the stream sequence it skipped to.
	// An ordered consumer that was reset is a new consumer, by name.
	handledAll := ci.Delivered.Consumer == 0 ||
		(ci.Name == h.handledConsumer && ci.Delivered.Consumer <= h.handledConsumerSeq)
	if ci.NumPending == 0 && handledAll {
		h.caughtUpLocked("the consumer has nothing pending")
	}
}

// publish brings PROXY_ROTATION and <prefix>.rotation to the latest
// snapshot, if this process holds the lease and the fold changed since it
// last published. First it renews the lease with compare-and-set: that
// proves it still holds it, and the revision of that write is the
// snapshot's version (see the package doc). Every request then ends
// before the lease's validity does, so a holder that lost the lease
// without knowing (paused, partitioned) stops writing before a standby may
// take over. Snapshots that came and went while it was busy are skipped:
// versions published only grow, possibly by more than one.
func (h *Health) publish(ctx context.Context) error {
	h.mu.Lock()
	snap, gen, ready, done := h.snap, h.gen, h.caughtUp, h.pubGen
	h.mu.Unlock()
	if !ready || gen == done || !h.lease.holding {
		return nil
	}
	rev, err := h.lease.write(ctx)
	if err != nil {
		if !h.lease.holding {
			h.bucket = nil
			h.mu.Lock()
			h.holder = false
			h.mu.Unlock()
			h.log.Warn("lost the lease: standing by", "err", err)
			return nil
		}
		return err
	}
	version := max(rev, h.lease.version+1)
	until, _ := h.lease.valid()
	opCtx := func() (context.Context, context.CancelFunc) {
		d := h.now().Add(h.cfg.OpTimeout)
		if until.Before(d) {
			d = until
		}
		return context.WithDeadline(ctx, d)
	}
	if h.bucket == nil {
		octx, cancel := opCtx()
		b, err := h.readBucket(octx)
		cancel()
		if err != nil {
			return err
		}
		h.bucket = b
	}
	want := make(map[string]string, len(snap.Proxies))
	for _, e := range snap.Proxies {
		want[e.ID] = e.Addr
	}
	for _, e := range snap.Proxies {
		if addr, ok := h.bucket[e.ID]; ok && addr == e.Addr {
			continue
		}
		octx, cancel := opCtx()
		_, err := h.kv.PutString(octx, e.ID, e.Addr)
		cancel()
		if err != nil {
			return fmt.Errorf("put %s in %s: %w", e.ID, messages.BucketRotation, err)
		}
		h.bucket[e.ID] = e.Addr
	}
	for key := range h.bucket {
		if _, ok := want[key]; ok {
			continue
		}
		octx, cancel := opCtx()
		err := h.kv.Delete(octx, key)
		cancel()
		if err != nil {
			return fmt.Errorf("delete %s from %s: %w", key, messages.BucketRotation, err)
		}
		delete(h.bucket, key)
	}
	if _, ok := h.lease.valid(); !ok {
		return fmt.Errorf("the lease ran out while publishing version %d", version)
	}
	snap.Version = version
	body, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if err := h.nc.Publish(h.subj.Rotation(), body); err != nil {
		return fmt.Errorf("publish %s: %w", h.subj.Rotation(), err)
	}
	h.lease.version = version
	h.mu.Lock()
	h.pubGen = gen
	h.published = version
	h.publishCount++
	h.version = max(h.version, version)
	if h.gen == gen {
		h.snap.Version = version
	}
	h.mu.Unlock()
	h.log.Debug("rotation published", "version", version, "size", len(snap.Proxies))
	return nil
}

// readBucket returns every key and value of PROXY_ROTATION.
func (h *Health) readBucket(ctx context.Context) (map[string]string, error) {
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	w, err := h.kv.WatchAll(octx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketRotation, err)
	}
	defer w.Stop()
	out := make(map[string]string)
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			out[e.Key()] = string(e.Value())
		case <-octx.Done():
			return nil, fmt.Errorf("read %s: %w", messages.BucketRotation, octx.Err())
		}
	}
}
