package health

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"proxyfleet/messages"
)

// loop owns the lease, publishing and the grace timer.
func (h *Health) loop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-h.boundCh: // the keeper (or Run's start) bound the buckets
	}
	defer h.releaseLease()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	renew := time.NewTicker(h.cfg.LeaseTTL / 3)
	defer renew.Stop()
	leaseDue := true
	var retry <-chan time.Time
	for {
		h.mu.Lock()
		if h.fold.Tick(h.now()) {
			h.changedLocked()
			h.log.Info("grace over: proxies demoted", "size", h.fold.Len())
		}
		deadline, graceRunning := h.fold.NextDeadline()
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
	h.mirrorLeaseLocked(took)
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
	h.mirrorLeaseLocked(false)
	h.mu.Unlock()
}

// mirrorLeaseLocked copies the loop's lease for the others: the holder
// flag, and for the checks writer until when it may write and an epoch
// that moves on every takeover and loss (a new holder reconciles
// PROXY_CHECKS from a fresh read).
func (h *Health) mirrorLeaseLocked(took bool) {
	holding := h.lease != nil && h.lease.holding
	if took || holding != h.holder {
		h.leaseEpoch++
	}
	h.holder = holding
	h.leaseUntil = time.Time{}
	if holding {
		h.leaseUntil, _ = h.lease.valid()
	}
	h.signalChecks()
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
	gen, ready, done := h.gen, h.caughtUp, h.pubGen
	var snap messages.Rotation
	if ready && gen != done && h.lease.holding {
		snap = h.snapLocked()
	}
	h.mu.Unlock()
	if !ready || gen == done || !h.lease.holding {
		return nil
	}
	rev, err := h.lease.write(ctx)
	h.mu.Lock()
	h.mirrorLeaseLocked(false)
	h.mu.Unlock()
	if err != nil {
		if !h.lease.holding {
			h.bucket = nil
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
	if err := h.writeBucket(snap, opCtx); err != nil {
		return err
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

// bucketWriters bounds the puts and deletes of PROXY_ROTATION in flight
// while publishing: each is a request the server stores (and, with
// sync_always, fsyncs) before it answers, so one at a time costs a round
// trip and a disk write per changed proxy.
const bucketWriters = 32

// writeBucket puts the entries of snap that the bucket lacks or holds at
// another address and deletes the keys of proxies not in snap, at most
// bucketWriters at a time, and records in h.bucket what was written. Keys
// are independent: no key is both put and deleted, so their order does not
// matter; the snapshot is published on the subject only after all of them.
func (h *Health) writeBucket(snap messages.Rotation, opCtx func() (context.Context, context.CancelFunc)) error {
	want := make(map[string]string, len(snap.Proxies))
	for _, e := range snap.Proxies {
		want[e.ID] = e.Addr
	}
	var puts []messages.RotationEntry
	var dels []string
	for _, e := range snap.Proxies {
		if addr, ok := h.bucket[e.ID]; !ok || addr != e.Addr {
			puts = append(puts, e)
		}
	}
	for key := range h.bucket {
		if _, ok := want[key]; !ok {
			dels = append(dels, key)
		}
	}
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(bucketWriters)
	for _, e := range puts {
		g.Go(func() error {
			octx, cancel := opCtx()
			_, err := h.kv.PutString(octx, e.ID, e.Addr)
			cancel()
			if err != nil {
				return fmt.Errorf("put %s in %s: %w", e.ID, messages.BucketRotation, err)
			}
			mu.Lock()
			h.bucket[e.ID] = e.Addr
			mu.Unlock()
			return nil
		})
	}
	for _, key := range dels {
		g.Go(func() error {
			octx, cancel := opCtx()
			err := h.kv.Delete(octx, key)
			cancel()
			if err != nil {
				return fmt.Errorf("delete %s from %s: %w", key, messages.BucketRotation, err)
			}
			mu.Lock()
			delete(h.bucket, key)
			mu.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// readBucket returns every key and value of PROXY_ROTATION.
func (h *Health) readBucket(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string)
	err := h.readKV(ctx, h.kv, messages.BucketRotation, func(key string, value []byte) { out[key] = string(value) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readKV calls put with every key and value of the bucket kv (named name).
func (h *Health) readKV(ctx context.Context, kv jetstream.KeyValue, name string, put func(key string, value []byte)) error {
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
	defer cancel()
	w, err := kv.WatchAll(octx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	defer w.Stop()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil
			}
			put(e.Key(), e.Value())
		case <-octx.Done():
			return fmt.Errorf("read %s: %w", name, octx.Err())
		}
	}
}
