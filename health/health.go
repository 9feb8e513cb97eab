package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
	// Now is the clock of the fold (grace) and of the snapshots' time.
	Now func() time.Time
	// Grace is how long a proxy keeps its place after reporting
	// provisioning without an address. Zero demotes it at once.
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
	caughtUp           bool
	caughtUpCh         chan struct{}
	version            uint64
	snap               messages.Rotation
	publishErrors      uint64
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
	return &Health{
		cfg: cfg, js: js, nc: js.Conn(), subj: cfg.Subjects,
		log: cfg.Logger.With("component", "health"), now: cfg.Now,
		fold:       NewFold(cfg.Grace, cfg.Now),
		caughtUpCh: make(chan struct{}),
		wake:       make(chan struct{}, 1),
	}, nil
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
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.loop(runCtx)
	}()
	h.log.Info("health started", "http", h.Addr(), "grace", h.cfg.Grace)
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
		if h.srv != nil {
			if err := h.srv.Shutdown(ctx); err != nil {
				h.log.Warn("http shutdown", "err", err)
				h.srv.Close()
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
	return nil
}

// Metrics are the health process's counters.
type Metrics struct {
	RotationSize    int
	InGrace         int // of which kept on grace
	RotationVersion uint64
	Changes         uint64 // changes of the rotation, catch-up included
	Events          uint64 // state events received
	Ignored         uint64 // of which stale, duplicate or not understood
	PublishErrors   uint64
	CaughtUp        bool
}

// Metrics returns the counters.
func (h *Health) Metrics() Metrics {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.fold.Stats()
	return Metrics{
		RotationSize:    h.fold.Len(),
		InGrace:         h.fold.GraceLen(),
		RotationVersion: h.version,
		Changes:         st.Changes,
		Events:          st.Events + h.undecodable,
		Ignored:         st.Ignored + h.undecodable,
		PublishErrors:   h.publishErrors,
		CaughtUp:        h.caughtUp,
	}
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
				h.log.Info("rotation changed", "id", ev.ID, "state", ev.State, "ip", ev.IP, "seq", ev.Seq, "size", len(h.snap.Proxies), "version", h.version)
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

// changedLocked makes a new snapshot version once caught up. Before that,
// the fold is a partial picture and nothing is published.
func (h *Health) changedLocked() {
	if !h.caughtUp {
		return
	}
	h.version++
	h.snap = messages.Rotation{V: messages.Version, Version: h.version, Proxies: h.fold.Snapshot(), At: h.now().UTC()}
}

func (h *Health) caughtUpLocked(why string) {
	if h.caughtUp {
		return
	}
	h.caughtUp = true
	close(h.caughtUpCh)
	h.changedLocked()
	h.log.Info("caught up", "why", why, "rotation", len(h.snap.Proxies), "events", h.fold.Stats().Events+h.undecodable)
	h.signal()
}

// loop owns publishing and the grace timer.
func (h *Health) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var retry, poll <-chan time.Time
	for {
		h.mu.Lock()
		if h.fold.Tick(h.now()) {
			h.changedLocked()
			h.log.Info("grace over: proxies demoted", "size", len(h.snap.Proxies), "version", h.version)
		}
		deadline, graceRunning := h.fold.NextDeadline()
		caughtUp := h.caughtUp
		h.mu.Unlock()

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
		}
	}
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
// snapshot, if it is newer than the last one published. Snapshots that
// came and went while it was busy are skipped: versions published only
// grow, possibly by more than one.
func (h *Health) publish(ctx context.Context) error {
	h.mu.Lock()
	snap, ready, done := h.snap, h.caughtUp, h.published
	h.mu.Unlock()
	if !ready || snap.Version == done {
		return nil
	}
	if h.bucket == nil {
		b, err := h.readBucket(ctx)
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
		octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
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
		octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
		err := h.kv.Delete(octx, key)
		cancel()
		if err != nil {
			return fmt.Errorf("delete %s from %s: %w", key, messages.BucketRotation, err)
		}
		delete(h.bucket, key)
	}
	body, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if err := h.nc.Publish(h.subj.Rotation(), body); err != nil {
		return fmt.Errorf("publish %s: %w", h.subj.Rotation(), err)
	}
	h.mu.Lock()
	h.published = snap.Version
	h.mu.Unlock()
	h.log.Debug("rotation published", "version", snap.Version, "size", len(snap.Proxies))
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
