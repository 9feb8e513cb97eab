package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// LeaseKey is the key of the publisher's lease in PROXY_LEASES.
const LeaseKey = "health"

// leaseValue is the lease's value. Expiry is not the bucket's TTL: a
// standby reads the key, and if its revision has not changed for TTL (by
// the standby's own clock, so clocks need not agree) the holder is gone.
type leaseValue struct {
	Holder string `json:"holder"`
	// TTL is how long the holder's lease lasts after each write; standbys
	// wait this long without a new revision before taking over.
	TTL string `json:"ttl"`
	// Version is the last snapshot version the holder published.
	Version uint64    `json:"version"`
	At      time.Time `json:"at"` // when it was written, for people
}

// lease is one process's side of the publisher's lease. It is used by one
// goroutine (the loop).
type lease struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	now func() time.Time
	op  time.Duration // bound of each request

	holding    bool
	rev        uint64    // revision of our last write, while holding
	validUntil time.Time // while holding: we may publish until then

	seenRev    uint64    // as a standby: the revision last read
	seenAt     time.Time // and when it was first read
	seenHolder string
	version    uint64 // the last published version known
}

func (l *lease) value() []byte {
	b, _ := json.Marshal(leaseValue{Holder: l.id, TTL: l.ttl.String(), Version: l.version, At: l.now().UTC()})
	return b
}

// margin is taken off the lease's validity so that a request sent just
// before it ends is answered before a standby can take over.
func (l *lease) margin() time.Duration { return l.ttl / 10 }

// valid reports whether the holder may still publish, and until when.
func (l *lease) valid() (time.Time, bool) {
	return l.validUntil, l.holding && l.now().Before(l.validUntil)
}

// write renews the lease with compare-and-set on our last revision, and
// returns the new revision. A conflict loses the lease.
func (l *lease) write(ctx context.Context) (uint64, error) {
	sent := l.now()
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	rev, err := l.kv.Update(octx, LeaseKey, l.value(), l.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyExists) {
			l.lose()
		}
		return 0, fmt.Errorf("renew the lease in %s: %w", messages.BucketLeases, err)
	}
	l.rev, l.validUntil = rev, sent.Add(l.ttl-l.margin())
	return rev, nil
}

func (l *lease) lose() {
	l.holding, l.validUntil = false, time.Time{}
	l.seenRev, l.seenAt = 0, time.Time{}
}

// tick renews the lease if we hold it, or else reads it and takes it if it
// is free or expired. It reports whether we hold it now and whether we
// just took it.
func (l *lease) tick(ctx context.Context) (took bool, err error) {
	if l.holding {
		_, err := l.write(ctx)
		return false, err
	}
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	now := l.now()
	e, err := l.kv.Get(octx, LeaseKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Free: never taken, released, or aged out of the bucket.
		rev, err := l.kv.Create(octx, LeaseKey, l.value())
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				return false, nil // someone was quicker
			}
			return false, fmt.Errorf("take the lease in %s: %w", messages.BucketLeases, err)
		}
		l.take(rev, now)
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read the lease in %s: %w", messages.BucketLeases, err)
	}
	var v leaseValue
	_ = json.Unmarshal(e.Value(), &v)
	l.version = max(l.version, v.Version)
	ttl := l.ttl
	if d, err := time.ParseDuration(v.TTL); err == nil && d > 0 {
		ttl = d // the holder says how long its writes last
	}
	if e.Revision() != l.seenRev {
		l.seenRev, l.seenAt, l.seenHolder = e.Revision(), now, v.Holder
		if v.Holder != l.id {
			return false, nil
		}
		// Our own lease (a write whose answer we lost): take it back.
	} else if now.Sub(l.seenAt) < ttl {
		return false, nil
	}
	rev, err := l.kv.Update(octx, LeaseKey, l.value(), e.Revision())
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, nil // renewed or taken meanwhile
		}
		return false, fmt.Errorf("take over the lease in %s: %w", messages.BucketLeases, err)
	}
	l.take(rev, now)
	return true, nil
}

func (l *lease) take(rev uint64, sent time.Time) {
	l.holding, l.rev, l.validUntil = true, rev, sent.Add(l.ttl-l.margin())
	l.seenRev, l.seenAt, l.seenHolder = 0, time.Time{}, l.id
}

// release gives the lease up, if we hold it, so a standby takes over at
// its next look rather than after the TTL.
func (l *lease) release(ctx context.Context) error {
	if !l.holding {
		return nil
	}
	l.holding = false
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	if err := l.kv.Delete(octx, LeaseKey, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("release the lease in %s: %w", messages.BucketLeases, err)
	}
	return nil
}
