package health

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/lease"
	"proxyfleet/messages"
)

// The keeper binds the stream and buckets health uses (waiting for them if
// they are missing: health has no right to create them), consumes
// PROXY_EVENTS, and repairs what someone else deletes: its consumer, or
// the stream itself (created anew). See the package doc, "Repairs".

// consumerInactive is how long the server keeps a consumer of a health
// process it no longer hears from (a process that died without stopping).
const consumerInactive = 5 * time.Minute

// staleRepeat is how often an error about a stream or bucket that stays
// missing is logged again.
const staleRepeat = time.Minute

// errMismatch marks a difference between this process's settings and what
// the server has: refused at start (Run returns it), logged and retried afterwards.
var errMismatch = errors.New("settings disagree with the server")

// errGap marks events lost in transit: the consumer's delivery sequence
// jumped, or delivered events never arrived.
var errGap = errors.New("events lost in transit")

// feed is one consumer of PROXY_EVENTS and its consume context.
type feed struct {
	name string
	gen  uint64
	cons jetstream.Consumer
	cc   jetstream.ConsumeContext
	// what the keeper saw at its last look, to tell a stall
	delivered, handled uint64
}

// isGone reports an error that means a stream or bucket does not exist.
// No responders is not one: JetStream itself may be unavailable for a
// moment.
func isGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// consumerName is the name of this process's n-th consumer: readable in a
// consumer list, unique per process.
func (h *Health) consumerName(n uint64) string {
	inst := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, h.cfg.Instance)
	if len(inst) > 48 {
		inst = inst[len(inst)-48:]
	}
	return fmt.Sprintf("health-%s-%d", inst, n)
}

// missingError says which streams and buckets are gone, nil if none.
func (h *Health) missingErrorLocked() error {
	if len(h.missing) == 0 {
		return nil
	}
	names := make([]string, 0, len(h.missing))
	for n := range h.missing {
		names = append(names, n)
	}
	slices.Sort(names)
	return fmt.Errorf("waiting for %s (gone; proxyfleet setup creates them)", strings.Join(names, ", "))
}

// noteMissing records that a stream or bucket is gone and says so at error
// level: once when it goes, then every staleRepeat while it stays gone.
func (h *Health) noteMissing(kind, name string, err error) {
	key := kind + " " + name
	now := time.Now()
	h.mu.Lock()
	m, was := h.missing[key]
	if !was {
		m = &missingSince{since: now}
		h.missing[key] = m
	}
	due := !was || now.Sub(m.logged) >= staleRepeat
	if due {
		m.logged = now
	}
	h.mu.Unlock()
	if due {
		h.log.Error(kind+" "+name+" is gone: waiting for it to be created again (proxyfleet setup); the rotation is kept meanwhile",
			kind, name, "for", now.Sub(m.since).Round(time.Second), "err", err)
	}
}

type missingSince struct{ since, logged time.Time }

// noteBack records that a stream or bucket exists (again).
func (h *Health) noteBack(kind, name string) {
	key := kind + " " + name
	h.mu.Lock()
	m, was := h.missing[key]
	delete(h.missing, key)
	h.mu.Unlock()
	if was {
		h.log.Warn(kind+" "+name+" is back", kind, name, "after", time.Since(m.since).Round(time.Millisecond))
		h.signal() // what waited for it (the checks writer) goes on
	}
}

// bind binds PROXY_EVENTS, PROXY_ROTATION and PROXY_LEASES, checks the
// lease against the leases bucket, loads the published rotation into the
// fold and starts consuming. A missing stream or bucket is noted (and
// logged) and its error returned; the keeper tries again.
func (h *Health) bind(ctx context.Context) error {
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	// Look at all three, so that every one missing is named.
	var errs []error
	note := func(kind, name string, err error) {
		switch {
		case err == nil:
			h.noteBack(kind, name)
		case isGone(err):
			h.noteMissing(kind, name, err)
			fallthrough
		default:
			errs = append(errs, fmt.Errorf("bind %s %s: %w", kind, name, err))
		}
	}
	stream, err := h.js.Stream(octx, messages.StreamEvents)
	note("stream", messages.StreamEvents, err)
	kv, err := h.js.KeyValue(octx, messages.BucketRotation)
	note("bucket", messages.BucketRotation, err)
	leases, err := h.js.KeyValue(octx, messages.BucketLeases)
	note("bucket", messages.BucketLeases, err)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	st, err := leases.Status(octx)
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", messages.BucketLeases, err)
	}
	if st.TTL() > 0 && h.cfg.LeaseTTL > st.TTL() {
		return fmt.Errorf("%w: lease ttl %v is longer than bucket %s's TTL %v", errMismatch, h.cfg.LeaseTTL, messages.BucketLeases, st.TTL())
	}
	h.kv = kv
	h.lease = lease.New(leases, LeaseKey, h.cfg.Instance, h.cfg.LeaseTTL, min(h.cfg.OpTimeout, h.cfg.LeaseTTL/3), h.now)

	// Start from what is published: the proxies in PROXY_ROTATION are in
	// the rotation as risen until their events or probes say otherwise,
	// so a restart never empties it.
	seed, err := h.readBucket(ctx)
	if err != nil {
		return err
	}
	h.mu.Lock()
	for id, addr := range seed {
		if messages.ValidID(id) && h.fold.Seed(id, addr, h.now()) {
			h.seeded++
		}
	}
	h.mu.Unlock()
	if err := h.startFeed(ctx, stream.CachedInfo()); err != nil {
		return err
	}
	h.bound = true
	close(h.boundCh)
	return nil
}

// startFeed makes a new consumer of PROXY_EVENTS that delivers the last
// event of every proxy, then new ones, and consumes it. Re-reading the
// last events is a valid resume at any time: the fold ignores events at or
// below a seq it has folded.
func (h *Health) startFeed(ctx context.Context, info *jetstream.StreamInfo) error {
	h.feedSeq++
	name := h.consumerName(h.feedSeq)
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	cons, err := h.js.CreateOrUpdateConsumer(octx, messages.StreamEvents, jetstream.ConsumerConfig{
		Name:              name,
		Description:       "health " + h.cfg.Instance + ": the last state event of every proxy, then new ones",
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		FilterSubject:     h.subj.StateAll(),
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: consumerInactive,
	})
	if err != nil {
		if isGone(err) {
			h.noteMissing("stream", messages.StreamEvents, err)
		}
		return fmt.Errorf("consumer of %s: %w", messages.StreamEvents, err)
	}
	h.mu.Lock()
	h.feedGen++
	gen := h.feedGen
	h.handledConsumer, h.handledConsumerSeq, h.handledSeq = name, 0, 0
	h.startLastSeq = info.State.LastSeq
	h.suspect = nil
	h.mu.Unlock()

	hb := min(max(h.cfg.CheckInterval, 500*time.Millisecond), 30*time.Second)
	cc, err := cons.Consume(func(msg jetstream.Msg) { h.handle(gen, msg) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { h.consumeErr(gen, err) }),
		jetstream.PullHeartbeat(hb), jetstream.PullExpiry(5*hb))
	if err != nil {
		h.deleteConsumer(name)
		return fmt.Errorf("consume %s: %w", messages.StreamEvents, err)
	}
	h.events = &feed{name: name, gen: gen, cons: cons, cc: cc}
	h.streamCreated = info.Created
	if info.State.Msgs == 0 {
		// Nothing to catch up with; whatever came in since is new.
		h.mu.Lock()
		h.caughtUpLocked("the stream was empty")
		h.mu.Unlock()
	}
	return nil
}

// stopFeed stops consuming and deletes the consumer (its own: a health
// process deletes no consumer it did not make).
func (h *Health) stopFeed() {
	f := h.events
	if f == nil {
		return
	}
	h.events = nil
	f.cc.Stop()
	t := time.NewTimer(h.cfg.OpTimeout)
	select {
	case <-f.cc.Closed():
	case <-t.C:
	}
	t.Stop()
	h.deleteConsumer(f.name)
}

func (h *Health) deleteConsumer(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.OpTimeout)
	defer cancel()
	err := h.js.DeleteConsumer(ctx, messages.StreamEvents, name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !isGone(err) {
		h.log.Warn("deleting a consumer of this process", "consumer", name, "err", err)
	}
}

// consumeErr hears what the consumer reports. One that was deleted stops
// delivering: the keeper looks at once. Missing heartbeats may mean it was
// deleted without a word reaching us: the keeper looks too.
func (h *Health) consumeErr(gen uint64, err error) {
	switch {
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
		errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrBadRequest),
		errors.Is(err, nats.ErrNoResponders): // a pull for a consumer that is not there
		h.log.Warn("consuming state events: looking at the consumer", "err", err)
		h.suspectFeed(gen, err)
	default:
		h.log.Warn("consuming state events", "err", err)
	}
}

// suspectFeed asks the keeper to look at feed gen at once.
func (h *Health) suspectFeed(gen uint64, err error) {
	h.mu.Lock()
	if gen == h.feedGen && h.suspect == nil {
		h.suspect = err
		h.suspectAt = time.Now()
	}
	h.mu.Unlock()
	select {
	case h.check <- struct{}{}:
	default:
	}
}

// keep runs the keeper until ctx ends: it binds what Run could not at start,
// then looks at the stream, the buckets and the consumer every
// CheckInterval (CatchUpPoll while catching up) or when the consumer
// reports trouble, and repairs what it must.
func (h *Health) keep(ctx context.Context) {
	defer h.stopFeed()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.check:
		}
		h.look(ctx)
		wait := h.cfg.CheckInterval
		h.mu.Lock()
		if !h.caughtUp {
			wait = min(wait, h.cfg.CatchUpPoll)
		}
		h.mu.Unlock()
		t.Reset(wait)
	}
}

// look is one look of the keeper.
func (h *Health) look(ctx context.Context) {
	if !h.bound {
		err := h.bind(ctx)
		h.mu.Lock()
		h.bindErr = err
		h.mu.Unlock()
		switch {
		case err == nil:
			h.log.Info("bound the stream and buckets: consuming", "seeded", h.seeded)
		case ctx.Err() != nil, isGone(err): // noted and logged by bind
		case time.Since(h.bindLogged) >= staleRepeat:
			// A difference with the server (the leases bucket's TTL)
			// or an error binding: said at error level, now and then.
			h.bindLogged = time.Now()
			h.log.Error("not consuming yet: binding the stream and buckets failed; trying again", "err", err)
		}
		return
	}
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	for _, b := range []string{messages.BucketRotation, messages.BucketLeases} {
		_, err := h.js.KeyValue(octx, b)
		switch {
		case err == nil:
			h.noteBack("bucket", b)
		case isGone(err):
			h.noteMissing("bucket", b, err)
		case ctx.Err() == nil:
			h.log.Warn("looking at a bucket", "bucket", b, "err", err)
		}
	}
	stream, err := h.js.Stream(octx, messages.StreamEvents)
	switch {
	case err == nil:
	case isGone(err):
		h.noteMissing("stream", messages.StreamEvents, err)
		h.stopFeed()
		return
	default:
		if ctx.Err() == nil {
			h.log.Warn("looking at the stream", "stream", messages.StreamEvents, "err", err)
		}
		return
	}
	h.noteBack("stream", messages.StreamEvents)
	info := stream.CachedInfo()

	h.mu.Lock()
	suspect, since := h.suspect, h.suspectAt
	h.mu.Unlock()
	anew := !info.Created.Equal(h.streamCreated)
	if anew {
		h.log.Error("stream "+messages.StreamEvents+" was created anew: reading the last event of every proxy in it",
			"stream", messages.StreamEvents, "was_created", h.streamCreated, "created", info.Created, "first_seq", info.State.FirstSeq)
	}
	switch {
	case anew:
		h.repair(ctx, info, "the stream was created anew", time.Time{})
		return
	case h.events == nil:
		h.repair(ctx, info, "the stream is back", time.Time{})
		return
	case errors.Is(suspect, jetstream.ErrConsumerDeleted), errors.Is(suspect, errGap):
		h.repair(ctx, info, suspect.Error(), since)
		return
	}
	ci, err := h.events.cons.Info(octx)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		h.repair(ctx, info, "the consumer is gone", since)
		return
	case err != nil:
		if ctx.Err() == nil {
			h.log.Warn("looking at the consumer", "consumer", h.events.name, "err", err)
		}
		return
	}
	h.mu.Lock()
	h.suspect = nil
	handled := h.handledConsumerSeq
	h.mu.Unlock()
	// Delivered but never handled, with no progress since the last look:
	// lost in transit (a reconnect, a slow consumer).
	f := h.events
	if ci.Delivered.Consumer > handled && handled == f.handled && f.delivered == ci.Delivered.Consumer {
		h.repair(ctx, info, errGap.Error()+": delivered events never arrived", time.Time{})
		return
	}
	f.delivered, f.handled = ci.Delivered.Consumer, handled
	h.pollCatchUp(ci)
}

// repair replaces the consumer and counts it.
func (h *Health) repair(ctx context.Context, info *jetstream.StreamInfo, why string, since time.Time) {
	old := ""
	if h.events != nil {
		old = h.events.name
	}
	h.stopFeed()
	if err := h.startFeed(ctx, info); err != nil {
		if ctx.Err() == nil {
			h.log.Error("repairing the consumer of "+messages.StreamEvents+" failed: trying again", "why", why, "err", err)
		}
		return
	}
	h.mu.Lock()
	h.repairs++
	h.mu.Unlock()
	args := []any{"stream", messages.StreamEvents, "why", why, "old", old, "consumer", h.events.name}
	if !since.IsZero() {
		args = append(args, "after", time.Since(since).Round(time.Millisecond))
	}
	h.log.Error("made the consumer of "+messages.StreamEvents+" anew: reading the last event of every proxy again", args...)
}

// pollCatchUp declares the catch-up complete if the consumer has nothing
// pending and everything it delivered was handled: the case where no
// message said it was the last one (events aged out while catching up).
func (h *Health) pollCatchUp(ci *jetstream.ConsumerInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.caughtUp {
		return
	}
	// Compare consumer sequences, not stream ones: a consumer that
	// delivered nothing may still report the stream sequence it skipped to.
	handledAll := ci.Delivered.Consumer == 0 ||
		(ci.Name == h.handledConsumer && ci.Delivered.Consumer <= h.handledConsumerSeq)
	if ci.NumPending == 0 && handledAll {
		h.caughtUpLocked("the consumer has nothing pending")
	}
}
