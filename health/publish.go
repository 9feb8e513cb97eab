package health

import (
	"context"
	"fmt"
	"time"

	"proxyfleet/messages"
)

// LeaseKey is the key of the publisher's lease in PROXY_LEASES.
const LeaseKey = "health"

// loop owns the lease, publishing (PROXY_ROTATION, the feed, the
// snapshot), the pages' subscription and the grace timer.
func (h *Health) loop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-h.boundCh: // the keeper (or Run's start) bound the buckets
	}
	defer h.releaseLease()
	defer h.stopPages()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	snapTimer := time.NewTimer(time.Hour)
	defer snapTimer.Stop()
	renew := time.NewTicker(h.cfg.LeaseTTL / 3)
	defer renew.Stop()
	leaseDue, beat := true, false
	var retry <-chan time.Time
	for {
		h.mu.Lock()
		if h.fold.Tick(h.now()) {
			h.log.Info("grace over: proxies demoted", "size", h.fold.Len())
		}
		deadline, graceRunning := h.fold.NextDeadline()
		h.mu.Unlock()

		if leaseDue {
			leaseDue = false
			h.tickLease(ctx)
			if h.cfg.leaseLooked != nil {
				h.cfg.leaseLooked()
			}
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
		} else if beat {
			h.heartbeat()
		}
		beat = false
		h.syncPages()
		var snapC <-chan time.Time
		if due := h.snapshot(); !due.IsZero() {
			snapTimer.Reset(max(time.Until(due), time.Millisecond))
			snapC = snapTimer.C
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
		case <-snapC:
		case <-renew.C:
			leaseDue, beat = true, true
		}
	}
}

// tickLease renews the lease or looks whether it can be taken. Taking it
// over reads PROXY_ROTATION: the proxies the previous holder had admitted
// and this process has as running at the same address are adopted, so a
// takeover removes no proxy that is passing, and the next publish
// reconciles the bucket with this process's fold.
func (h *Health) tickLease(ctx context.Context) {
	was := h.lease.Holding()
	took, err := h.lease.Tick(ctx)
	if err != nil && ctx.Err() != nil {
		return
	}
	if err != nil {
		h.log.Warn("lease", "err", err, "holding", h.lease.Holding())
	}
	if was && !h.lease.Holding() {
		h.log.Warn("lost the lease: standing by", "err", err)
		h.bucket = nil
		h.mu.Lock()
		h.feedReset = true
		h.mu.Unlock()
	}
	h.mu.Lock()
	h.leaseErr = err
	h.mirrorLeaseLocked(took)
	h.version = max(h.version, h.lease.Version)
	h.mu.Unlock()
	if !took {
		return
	}
	h.bucket = nil
	b, err := h.readBucket(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.takeovers++
	// The first message of this lease follows no version a consumer
	// holds (theirs came from another publisher, or from this one before
	// it lost the lease): it says so, and the bucket is reconciled with
	// this process's rotation.
	h.feedReset = true
	adopted := 0
	if err == nil {
		h.bucket = b
		for id, addr := range b {
			if h.fold.Adopt(id, addr, h.now()) {
				adopted++
			}
		}
	}
	h.log.Info("took the lease: publishing", "revision", h.lease.Rev(), "last_version", h.lease.Version, "adopted", adopted, "bucket_err", err)
}

func (h *Health) releaseLease() {
	if h.lease == nil || !h.lease.Holding() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.OpTimeout)
	defer cancel()
	if err := h.lease.Release(ctx); err != nil {
		h.log.Warn("releasing the lease (a standby takes over when it expires)", "err", err)
	} else {
		h.log.Info("lease released")
	}
	h.mu.Lock()
	h.mirrorLeaseLocked(false)
	h.mu.Unlock()
}

// mirrorLeaseLocked copies the loop's lease for the others: the holder
// flag, and for the checks writer until when it may write and an epoch
// that moves on every takeover and loss (a new holder reconciles
// PROXY_CHECKS from a fresh read).
func (h *Health) mirrorLeaseLocked(took bool) {
	holding := h.lease != nil && h.lease.Holding()
	if took || holding != h.holder {
		h.leaseEpoch++
	}
	h.holder = holding
	h.leaseUntil = time.Time{}
	if holding {
		h.leaseUntil = h.lease.Until()
	}
	h.signalChecks()
}

// publish brings PROXY_ROTATION and the feed up to the fold, a message at
// a time, if this process holds the lease: see publishOnce.
func (h *Health) publish(ctx context.Context) error {
	for {
		more, err := h.publishOnce(ctx)
		if err != nil || !more || ctx.Err() != nil {
			return err
		}
	}
}

// publishOnce publishes one message of the feed: the changes of the ids
// the fold marked since the last one (at most a message's worth; more
// reports that others wait), after writing PROXY_ROTATION for them. First
// it renews the lease with compare-and-set: that proves it still holds
// it, and the revision of that write is the message's version (see the
// package doc). Every request then ends before the lease's validity does,
// so a holder that lost the lease without knowing (paused, partitioned)
// stops writing before a standby may take over. The first message of a
// lease (or after a failure) is a reset: it lists no changes and follows
// no version (prev 0); the bucket is reconciled with the whole rotation
// first, and consumers read the pages again. Everything here is
// O(changes), but for that reset.
func (h *Health) publishOnce(ctx context.Context) (more bool, err error) {
	h.mu.Lock()
	if !h.caughtUp || !h.lease.Holding() {
		h.mu.Unlock()
		return false, nil
	}
	h.drainLocked()
	reset := h.feedReset
	var chunk []change
	if reset {
		h.materializeLocked()
	} else {
		chunk, more = h.chunkLocked()
	}
	h.mu.Unlock()
	if !reset && len(chunk) == 0 {
		return false, nil
	}
	rev, err := h.lease.Renew(ctx)
	h.mu.Lock()
	h.mirrorLeaseLocked(false)
	h.mu.Unlock()
	if err != nil {
		if !h.lease.Holding() {
			h.bucket = nil
			h.mu.Lock()
			h.feedReset = true
			h.mu.Unlock()
			h.log.Warn("lost the lease: standing by", "err", err)
			return false, nil
		}
		return false, err
	}
	version := max(rev, h.lease.Version+1)
	until := h.lease.Until()
	opCtx := func() (context.Context, context.CancelFunc) {
		d := h.now().Add(h.cfg.OpTimeout)
		if until.Before(d) {
			d = until
		}
		return context.WithDeadline(ctx, d)
	}
	var puts []kvPut
	var dels []string
	if h.bucket == nil || reset {
		if h.bucket == nil {
			octx, cancel := opCtx()
			b, err := h.readBucket(octx)
			cancel()
			if err != nil {
				return false, err
			}
			h.bucket = b
		}
		h.mu.Lock()
		want := make(map[string]string, h.view.Len()+len(chunk))
		for id, e := range h.view.entries {
			want[id] = e.e.Addr
		}
		h.mu.Unlock()
		for _, c := range chunk {
			if c.op == messages.ChangeLeft {
				delete(want, c.id)
			} else {
				want[c.id] = c.e.Addr
			}
		}
		puts, dels = h.reconcileWrites(want)
	} else {
		puts, dels = h.bucketWrites(chunk)
	}
	if err := h.writeBucket(puts, dels, opCtx); err != nil {
		return false, err
	}
	if !h.lease.Valid() {
		return false, fmt.Errorf("the lease ran out while publishing version %d", version)
	}

	h.mu.Lock()
	prev := h.view.version
	if reset {
		prev = 0
	}
	at := h.now().UTC()
	body := appendFeed(nil, version, prev, h.view.sizeAfter(chunk), chunk, at)
	for _, c := range chunk {
		h.view.apply(c, at)
		if h.pending[c.id] == c.mark {
			delete(h.pending, c.id) // not marked again since
		}
	}
	h.shrinkPendingLocked()
	if reset {
		h.view.at = at
	}
	h.view.version = version
	h.ring.add(version, prev, chunk)
	h.feedReset = false
	h.feedSent = true
	h.lease.Version = version
	h.published = version
	h.publishCount++
	h.version = max(h.version, version)
	h.feed.messages++
	h.feed.changes += uint64(len(chunk))
	h.feed.bytes += uint64(len(body))
	if reset {
		h.feed.resets++
	}
	size := h.view.Len()
	h.mu.Unlock()
	if err := h.nc.Publish(h.subj.RotationChanges(), body); err != nil {
		// Consumers miss this version: the next message follows none
		// they can hold, and they read the pages again.
		h.mu.Lock()
		h.feed.errors++
		h.feedReset = true
		h.mu.Unlock()
		return false, fmt.Errorf("publish %s: %w", h.subj.RotationChanges(), err)
	}
	h.log.Debug("rotation published", "version", version, "prev", prev, "changes", len(chunk), "size", size, "bytes", len(body))
	return more, nil
}

// drainLocked moves the ids the fold marked into pending, each marked with
// the drain that moved it (so that publishing an older computation of its
// change does not forget a newer one).
func (h *Health) drainLocked() {
	if h.fold.Dirty() == 0 {
		return
	}
	h.drains++
	h.fold.TakeDirty(func(id string) { h.pending[id] = h.drains })
	h.pendingPeak = max(h.pendingPeak, len(h.pending))
}

// shrinkPendingLocked makes pending a new map once it holds far fewer ids
// than it once did: iterating a map costs its capacity, so after a burst
// every chunk would walk the burst's empty slots.
func (h *Health) shrinkPendingLocked() {
	if n := len(h.pending); h.pendingPeak > 1024 && n*8 < h.pendingPeak {
		// Not maps.Clone, which keeps the capacity.
		m := make(map[string]uint64, n)
		for id, mark := range h.pending {
			m[id] = mark
		}
		h.pending, h.pendingPeak = m, n
	}
}

// chunkLocked computes the changes of the pending ids against the view,
// as many as one feed message holds (more: others wait), forgetting the
// ids whose entry did not change.
func (h *Health) chunkLocked() (out []change, more bool) {
	budget := messages.MaxBodySize - feedOverhead
	for id, mark := range h.pending {
		cur, in := h.fold.Entry(id)
		c, ok := h.view.diff(id, cur, in)
		if !ok {
			delete(h.pending, id)
			continue
		}
		if len(out) > 0 && len(c.wire)+1 > budget {
			return out, true
		}
		c.mark = mark
		out = append(out, c)
		budget -= len(c.wire) + 1
	}
	return out, false
}

// materializeLocked brings the view to the fold without a message: what
// a standby serves, and what a reset starts from.
func (h *Health) materializeLocked() {
	h.drainLocked()
	if len(h.pending) == 0 {
		return
	}
	at := h.now().UTC()
	for id := range h.pending {
		cur, in := h.fold.Entry(id)
		if c, ok := h.view.diff(id, cur, in); ok {
			h.view.apply(c, at)
		}
	}
	h.pending, h.pendingPeak = make(map[string]uint64), 0
}

// servingLocked reports whether this process answers for the rotation:
// it holds the lease and has published on it (the pages and the snapshot
// are its published view).
func (h *Health) servingLocked() bool {
	return h.caughtUp && h.holder && !h.feedReset && h.view.version > 0
}

// heartbeat sends, if this process serves and sent nothing on the feed
// since the last heartbeat's turn, a message that repeats the version: a
// consumer that lost the last message learns so within a third of the
// lease's TTL.
func (h *Health) heartbeat() {
	h.mu.Lock()
	if !h.servingLocked() || h.feedSent {
		h.feedSent = false
		h.mu.Unlock()
		return
	}
	body := appendFeed(nil, h.view.version, h.view.version, h.view.Len(), nil, h.view.at)
	h.feed.heartbeats++
	h.mu.Unlock()
	if err := h.nc.Publish(h.subj.RotationChanges(), body); err != nil {
		h.mu.Lock()
		h.feed.errors++
		h.mu.Unlock()
		h.log.Warn("publishing the rotation's heartbeat", "subject", h.subj.RotationChanges(), "err", err)
	}
}
