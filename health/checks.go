package health

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"proxyfleet/messages"
)

// PROXY_CHECKS holds a messages.CheckRecord per candidate that has been
// checked, written by the lease holder. Its keeper and writer are
// goroutines of their own, apart from the rotation's: the records are a
// report, and a bucket that is missing, slow or refused to this process
// (permissions) must not hold up the rotation. See the package doc,
// "Checks".

// keepChecks binds PROXY_CHECKS and looks every CheckInterval whether it
// is still there (noting it missing, as the other buckets, and back).
func (h *Health) keepChecks(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	var logged time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		octx, cancel := context.WithTimeout(ctx, h.cfg.OpTimeout)
		kv, err := h.js.KeyValue(octx, messages.BucketChecks)
		cancel()
		switch {
		case err == nil:
			h.noteBack("bucket", messages.BucketChecks)
			h.mu.Lock()
			first := h.checksKV == nil
			if first {
				h.checksKV = kv
			}
			h.mu.Unlock()
			if first {
				h.log.Info("bound bucket " + messages.BucketChecks)
				h.signalChecks()
			}
		case isGone(err):
			h.noteMissing("bucket", messages.BucketChecks, err)
		case ctx.Err() != nil:
			return
		case time.Since(logged) >= staleRepeat:
			logged = time.Now()
			h.log.Warn("looking at bucket "+messages.BucketChecks+" (its check records are not written meanwhile)", "err", err)
		}
		t.Reset(h.cfg.CheckInterval)
	}
}

// writeChecksLoop brings PROXY_CHECKS to the fold's check records while
// this process holds the lease, when they change (and after a failure,
// every RetryInterval).
func (h *Health) writeChecksLoop(ctx context.Context) {
	w := &checksWriter{h: h}
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.checksWake:
		case <-retry:
		}
		retry = nil
		err := w.write(ctx)
		if err != nil && ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		h.checksErr = err
		h.mu.Unlock()
		if err != nil {
			w.bucket = nil // read it again: what it holds is no longer known
			h.log.Warn("writing check records", "bucket", messages.BucketChecks, "err", err)
			retry = time.After(h.cfg.RetryInterval)
		}
	}
}

// checksWriter is the state of the checks writer (one goroutine).
type checksWriter struct {
	h *Health
	// bucket is what PROXY_CHECKS is believed to hold (nil: read it
	// first), as of lease epoch epoch.
	bucket map[string]messages.CheckRecord
	epoch  uint64
}

// checkState is one candidate's record as the fold has it now.
type checkState struct {
	id   string
	rec  messages.CheckRecord
	cand bool // a candidate (rec.Verdict "" while nothing is recorded yet)
}

// sameRecord reports whether the bucket's record b says what a does: the
// time alone is no reason to write.
func sameRecord(a, b messages.CheckRecord) bool {
	return a.V == b.V && a.ID == b.ID && a.Addr == b.Addr && a.Egress == b.Egress && a.Verdict == b.Verdict && a.Reason == b.Reason
}

// write puts the records that differ from what the bucket holds and
// deletes the keys of proxies that are no longer candidates (or are
// candidates at another address than their record's, with nothing checked
// at the new one yet), at most bucketWriters at a time. A candidate not
// yet checked keeps a record of its address: a process that just started
// or took over does not delete what it has not looked at yet. Writes are
// made only by the lease holder, caught up, each request ending before
// the lease's validity; the first write of a lease epoch (or after a
// failure) reads the whole bucket and reconciles it with every candidate,
// the others look only at the ids whose record the fold marked
// (TakeChecksDirty): O(changes), not O(fleet).
func (w *checksWriter) write(ctx context.Context) error {
	h := w.h
	h.mu.Lock()
	kv, holder, until, epoch, caughtUp := h.checksKV, h.holder, h.leaseUntil, h.leaseEpoch, h.caughtUp
	_, missing := h.missing["bucket "+messages.BucketChecks]
	if !caughtUp || !holder || kv == nil || missing {
		h.mu.Unlock()
		w.bucket = nil
		return nil
	}
	if epoch != w.epoch {
		w.epoch, w.bucket = epoch, nil
	}
	full := w.bucket == nil
	if !full && h.fold.ChecksDirty() == 0 {
		h.mu.Unlock()
		return nil
	}
	var states []checkState
	if full {
		// The whole bucket is read and reconciled below: what was
		// marked is in it.
		h.fold.TakeChecksDirty(func(string) {})
		for _, r := range h.fold.candidateChecks() {
			states = append(states, checkState{id: r.ID, rec: r, cand: true})
		}
	} else {
		h.fold.TakeChecksDirty(func(id string) {
			rec, cand := h.fold.CheckState(id)
			states = append(states, checkState{id: id, rec: rec, cand: cand})
		})
	}
	h.mu.Unlock()

	if !h.now().Before(until) {
		return nil // the renewal, which wakes this writer, comes first
	}
	opCtx := func() (context.Context, context.CancelFunc) {
		d := h.now().Add(h.cfg.OpTimeout)
		if until.Before(d) {
			d = until
		}
		return context.WithDeadline(ctx, d)
	}
	if w.bucket == nil {
		b := make(map[string]messages.CheckRecord)
		octx, cancel := opCtx()
		err := h.readKV(octx, kv, messages.BucketChecks, func(key string, value []byte) {
			var r messages.CheckRecord
			if json.Unmarshal(value, &r) != nil {
				r = messages.CheckRecord{} // differs from any record: rewritten or deleted
			}
			b[key] = r
		})
		cancel()
		if err != nil {
			return err
		}
		w.bucket = b
	}

	var puts []messages.CheckRecord
	var dels []string
	for _, st := range states {
		old, ok := w.bucket[st.id]
		switch {
		case st.cand && st.rec.Verdict != "":
			if !ok || !sameRecord(old, st.rec) {
				puts = append(puts, st.rec)
			}
		case ok && (!st.cand || old.Addr != st.rec.Addr):
			// Gone, or a record of another address that no put
			// replaces.
			dels = append(dels, st.id)
		}
	}
	if full {
		cand := make(map[string]bool, len(states))
		for _, st := range states {
			cand[st.id] = true
		}
		for key := range w.bucket {
			if !cand[key] {
				dels = append(dels, key)
			}
		}
	}

	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(bucketWriters)
	for _, r := range puts {
		g.Go(func() error {
			body, err := json.Marshal(r)
			if err != nil {
				return err
			}
			octx, cancel := opCtx()
			_, err = kv.Put(octx, r.ID, body)
			cancel()
			if err != nil {
				return fmt.Errorf("put %s in %s: %w", r.ID, messages.BucketChecks, err)
			}
			mu.Lock()
			w.bucket[r.ID] = r
			mu.Unlock()
			return nil
		})
	}
	for _, key := range dels {
		g.Go(func() error {
			octx, cancel := opCtx()
			err := kv.Delete(octx, key)
			cancel()
			if err != nil {
				return fmt.Errorf("delete %s from %s: %w", key, messages.BucketChecks, err)
			}
			mu.Lock()
			delete(w.bucket, key)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	h.mu.Lock()
	h.checksWrites += uint64(len(puts) + len(dels))
	h.mu.Unlock()
	if len(puts)+len(dels) > 0 {
		h.log.Debug("check records written", "puts", len(puts), "deletes", len(dels))
	}
	return nil
}
