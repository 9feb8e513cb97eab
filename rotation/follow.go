package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Errors that break a source, so it is made anew.
var (
	errWatcherClosed = errors.New("watcher closed")
	errRecreated     = errors.New("created anew")
	errGone          = errors.New("gone")
)

// kvStream is the stream behind KV bucket b.
func kvStream(b string) string { return "KV_" + b }

// sourceRun is one life of a source: it reads from a watcher or consumer
// of generation gen on the stream whose creation time is created, until it
// breaks (its error) or ctx ends (nil). caughtUp is called once its initial
// values are in.
type sourceRun func(ctx context.Context, gen uint64, created time.Time) error

// supervise runs a source, making it anew with a backoff whenever it
// breaks, until ctx ends (nil) or the connection is closed (its error).
// kind and name ("bucket", "PROXY_ROTATION") are for the logs; stream is
// the stream looked up.
func (r *Rotation) supervise(ctx context.Context, kind, name, stream string, run sourceRun) error {
	log := r.log.With(kind, name)
	wait := r.cfg.RetryMax / 50
	var gen uint64
	var missingSince, missingLogged time.Time
	for {
		if ctx.Err() != nil {
			return nil
		}
		if r.nc.IsClosed() {
			return fmt.Errorf("rotation: %s %s: %w", kind, name, nats.ErrConnectionClosed)
		}
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		st, err := r.js.Stream(octx, stream)
		cancel()
		var broke error
		if err == nil {
			if !missingSince.IsZero() {
				log.Warn(kind+" "+name+" is back", "after", time.Since(missingSince).Round(time.Millisecond))
				missingSince = time.Time{}
			}
			gen++
			began := time.Now()
			broke = run(ctx, gen, st.CachedInfo().Created)
			if ctx.Err() != nil {
				return nil
			}
			if r.nc.IsClosed() {
				return fmt.Errorf("rotation: %s %s: %w", kind, name, nats.ErrConnectionClosed)
			}
			if time.Since(began) > r.cfg.RetryMax {
				wait = r.cfg.RetryMax / 50 // it ran well for a while: start over
			}
			r.restarts.Add(1)
			log.Error("following "+kind+" "+name+" broke: making it anew", "err", broke, "generation", gen, "retry_in", wait)
		} else if errors.Is(err, jetstream.ErrStreamNotFound) {
			now := time.Now()
			if missingSince.IsZero() {
				missingSince = now
			}
			if missingLogged.IsZero() || now.Sub(missingLogged) >= missingRepeat {
				missingLogged = now
				log.Error(kind+" "+name+" is missing: waiting for it (proxyfleet setup creates it); the rotation is kept meanwhile",
					"for", now.Sub(missingSince).Round(time.Second))
			}
		} else {
			log.Warn("looking up "+kind+" "+name, "err", err, "retry_in", wait)
		}
		// Wait, with jitter, then longer next time.
		t := time.NewTimer(wait + rand.N(wait/5+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(wait*2, r.cfg.RetryMax)
	}
}

// checkStream looks stream up: gone or created anew is an error that
// breaks the source; a lookup that fails otherwise (a timeout, no
// responders for a moment) is not.
func (r *Rotation) checkStream(ctx context.Context, stream string, created time.Time) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	st, err := r.js.Stream(octx, stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("stream %s: %w", stream, errGone)
	case err != nil:
		if ctx.Err() == nil {
			r.log.Debug("looking at a stream", "stream", stream, "err", err)
		}
		return nil
	case !st.CachedInfo().Created.Equal(created):
		return fmt.Errorf("stream %s: %w at %s", stream, errRecreated, st.CachedInfo().Created.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// watchKV follows bucket with a KV watcher of every key (deletes
// included): apply is called with r.mu held for each entry, in batches,
// and sweep once the initial values are in.
func (r *Rotation) watchKV(ctx context.Context, bucket string, gen uint64, created time.Time,
	apply func(e jetstream.KeyValueEntry, gen uint64) bool, sweep func(gen uint64) int, src int) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	kv, err := r.js.KeyValue(octx, bucket)
	cancel()
	if err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := kv.WatchAll(wctx)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer func() { _ = w.Stop() }()
	if r.watchHook != nil {
		r.watchHook(bucket, w)
	}
	tick := time.NewTicker(r.cfg.CheckInterval)
	defer tick.Stop()
	updates := w.Updates()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := r.checkStream(ctx, kvStream(bucket), created); err != nil {
				return err
			}
		case e, ok := <-updates:
			if !ok {
				return errWatcherClosed
			}
			// Apply what is there in one hold of the lock: the initial
			// values of a large bucket come in a burst.
			r.mu.Lock()
			for more := true; more; {
				if e == nil {
					if n := sweep(gen); n > 0 {
						r.log.Warn("dropped what a remade watcher no longer has", "bucket", bucket, "entries", n)
					}
					r.readyLocked(src)
				} else if apply(e, gen) {
					r.changedLocked()
				}
				select {
				case e, ok = <-updates:
					more = ok
				default:
					more = false
				}
			}
			r.mu.Unlock()
			if !ok {
				return errWatcherClosed
			}
		}
	}
}

// followRotation follows PROXY_ROTATION, the membership.
func (r *Rotation) followRotation(ctx context.Context) error {
	b := messages.BucketRotation
	return r.supervise(ctx, "bucket", b, kvStream(b), func(ctx context.Context, gen uint64, created time.Time) error {
		return r.watchKV(ctx, b, gen, created, r.applyRotationLocked, func(gen uint64) int {
			n := r.idx.sweepMembers(gen)
			for range n {
				r.changedLocked()
			}
			return n
		}, srcRotation)
	})
}

// applyRotationLocked applies one entry of PROXY_ROTATION.
func (r *Rotation) applyRotationLocked(e jetstream.KeyValueEntry, gen uint64) bool {
	id := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		return r.idx.delMember(id)
	}
	addr := string(e.Value())
	if !messages.ValidID(id) {
		r.log.Warn("ignoring a rotation key that is no proxy id", "key", id)
		return false
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		r.log.Warn("ignoring a rotation entry that is no ip:port", "id", id, "value", addr, "err", err)
		return r.idx.delMember(id)
	}
	return r.idx.putMember(id, addr, e.Created().UTC(), gen)
}

// followChecks follows PROXY_CHECKS, health's check records.
func (r *Rotation) followChecks(ctx context.Context) error {
	b := messages.BucketChecks
	return r.supervise(ctx, "bucket", b, kvStream(b), func(ctx context.Context, gen uint64, created time.Time) error {
		return r.watchKV(ctx, b, gen, created, r.applyCheckLocked, func(gen uint64) int {
			n := r.idx.sweepChecks(gen)
			for range n {
				r.changedLocked()
			}
			return n
		}, srcChecks)
	})
}

// applyCheckLocked applies one entry of PROXY_CHECKS.
func (r *Rotation) applyCheckLocked(e jetstream.KeyValueEntry, gen uint64) bool {
	id := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		return r.idx.delCheck(id)
	}
	var c messages.CheckRecord
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		r.log.Warn("ignoring a check record that does not decode", "id", id, "err", err)
		return r.idx.delCheck(id)
	}
	return r.idx.putCheck(id, c.Addr, c.Egress, gen)
}

// followEvents follows PROXY_EVENTS with an ordered consumer: the last
// event of every proxy, then new ones.
func (r *Rotation) followEvents(ctx context.Context) error {
	s := messages.StreamEvents
	return r.supervise(ctx, "stream", s, s, r.consumeEvents)
}

// consumeEvents is one life of the events source. The ordered consumer
// repairs some breaks itself (a gap), but it resumes at the next stream
// sequence, which is wrong for a stream created anew; so on missed
// heartbeats or a deleted consumer this makes a new one from scratch,
// which reads the last event of every proxy again.
func (r *Rotation) consumeEvents(ctx context.Context, gen uint64, created time.Time) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	cons, err := r.js.OrderedConsumer(octx, messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{r.subj.StateAll()},
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: 2 * time.Minute,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("ordered consumer: %w", err)
	}
	r.eventsGen.Store(gen)
	if cons.CachedInfo().NumPending == 0 {
		r.eventsCaughtUp(gen)
	}
	broke := make(chan error, 1)
	hb := min(max(r.cfg.CheckInterval, 500*time.Millisecond), 15*time.Second)
	cc, err := cons.Consume(func(msg jetstream.Msg) { r.handleEvent(gen, msg) },
		jetstream.PullHeartbeat(hb), jetstream.PullExpiry(5*hb),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrConsumerDeleted),
				errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, nats.ErrNoResponders),
				errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrConnectionClosed):
				select {
				case broke <- err:
				default:
				}
			default:
				r.log.Warn("consuming state events", "err", err)
			}
		}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	defer func() {
		cc.Stop()
		t := time.NewTimer(opTimeout)
		select {
		case <-cc.Closed():
		case <-t.C:
		}
		t.Stop()
		// The ordered consumer is ephemeral and memory-backed: delete it
		// now rather than leave it to its inactivity threshold.
		if name := cons.CachedInfo().Name; name != "" && !r.nc.IsClosed() {
			dctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			_ = r.js.DeleteConsumer(dctx, messages.StreamEvents, name)
			cancel()
		}
	}()
	tick := time.NewTicker(r.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-broke:
			return fmt.Errorf("consumer: %w", err)
		case <-tick.C:
			if err := r.checkStream(ctx, messages.StreamEvents, created); err != nil {
				return err
			}
		}
	}
}

// handleEvent folds one message of PROXY_EVENTS from the consumer of
// generation gen (called from one goroutine at a time).
func (r *Rotation) handleEvent(gen uint64, msg jetstream.Msg) {
	if r.eventsGen.Load() != gen {
		return // a consumer replaced since
	}
	md, mdErr := msg.Metadata()
	id, err := r.subj.ParseState(msg.Subject())
	var ev messages.StateEvent
	marker := msg.Headers().Get(jetstream.MarkerReasonHeader) != ""
	if err == nil && !marker {
		err = decodeEvent(id, msg.Data(), &ev)
	}
	r.mu.Lock()
	switch {
	case err != nil:
		r.log.Warn("ignoring a state event", "subject", msg.Subject(), "err", err)
	case marker:
		// The server removed the proxy's last event (aged out).
		if r.idx.delEvent(id) {
			r.changedLocked()
		}
	default:
		if r.idx.putEvent(id, ev.Host, ev.Labels, gen) {
			r.changedLocked()
		}
	}
	r.mu.Unlock()
	if mdErr == nil && md.NumPending == 0 {
		r.eventsCaughtUp(gen)
	}
}

// eventsCaughtUp is called when the events consumer of generation gen has
// delivered the last event of every proxy.
func (r *Rotation) eventsCaughtUp(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eventsSwept >= gen {
		return
	}
	r.eventsSwept = gen
	if n := r.idx.sweepEvents(gen); n > 0 {
		r.log.Warn("dropped the events a remade consumer no longer has", "proxies", n)
		for range n {
			r.changedLocked()
		}
	}
	r.readyLocked(srcEvents)
}

// decodeEvent reads a state event leniently about fields it does not know
// (a newer worker may add some) and strictly about the version and the
// id against the subject's.
func decodeEvent(id string, body []byte, ev *messages.StateEvent) error {
	if !messages.ValidID(id) {
		return fmt.Errorf("invalid id %q", id)
	}
	if len(body) > messages.MaxBodySize {
		return fmt.Errorf("body of %d bytes, more than %d", len(body), messages.MaxBodySize)
	}
	if err := json.Unmarshal(body, ev); err != nil {
		return fmt.Errorf("malformed: %w", err)
	}
	if ev.V != messages.Version {
		return fmt.Errorf("version %d, want %d", ev.V, messages.Version)
	}
	if ev.ID != id {
		return fmt.Errorf("body id %q does not match the subject's %q", ev.ID, id)
	}
	if len(ev.Labels) == 0 {
		ev.Labels = nil
	}
	return nil
}
