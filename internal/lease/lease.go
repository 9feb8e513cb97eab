// Package lease is one process's side of a lease on a key of
// PROXY_LEASES: the one process among its replicas that may act (health's
// publisher, the active pool controller).
//
// The holder renews the key with a compare-and-set on the revision of its
// last write; a standby takes the key over when its revision has not
// moved for the holder's TTL by the standby's own clock (so clocks need
// not agree), or at once when it is free (never taken, released, or aged
// out of the bucket). The holder acts only while its last renewal is
// younger than the TTL less a margin of a tenth, so a request it sent
// just before the end is answered before a standby can take over. A
// Lease is used by one goroutine.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Value is a lease's value. Expiry is not the bucket's TTL: a standby
// reads the key and counts the time its revision has not moved.
type Value struct {
	Holder string `json:"holder"`
	// TTL is how long the holder's lease lasts after each write;
	// standbys wait this long without a new revision before taking over.
	TTL string `json:"ttl"`
	// Version is the last version the holder published (health's
	// snapshots); absent for a lease that publishes none.
	Version uint64    `json:"version,omitempty"`
	At      time.Time `json:"at"` // when it was written, for people
}

// Lease is one process's side of the lease on one key.
type Lease struct {
	kv  jetstream.KeyValue
	key string
	id  string
	ttl time.Duration
	op  time.Duration // bound of each request
	now func() time.Time

	holding    bool
	rev        uint64    // revision of our last write, while holding
	validUntil time.Time // while holding: we may act until then

	seenRev uint64    // as a standby: the revision last read
	seenAt  time.Time // and when it was first read

	// Version is written with every renewal, and raised to the highest
	// a holder wrote whenever the key is read.
	Version uint64
}

// New is id's side of the lease on key in kv, ttl long from each write,
// each request bounded by op, times read from now (nil: time.Now).
func New(kv jetstream.KeyValue, key, id string, ttl, op time.Duration, now func() time.Time) *Lease {
	if now == nil {
		now = time.Now
	}
	return &Lease{kv: kv, key: key, id: id, ttl: ttl, op: op, now: now}
}

// Holding reports whether this process holds the lease (it may have
// expired by the clock: see Valid).
func (l *Lease) Holding() bool { return l.holding }

// Rev is the revision of the holder's last write.
func (l *Lease) Rev() uint64 { return l.rev }

// Valid reports whether the holder may still act.
func (l *Lease) Valid() bool { return l.holding && l.now().Before(l.validUntil) }

// Until is when the holder's last write stops letting it act (zero when
// it does not hold the lease).
func (l *Lease) Until() time.Time { return l.validUntil }

func (l *Lease) value() []byte {
	b, _ := json.Marshal(Value{Holder: l.id, TTL: l.ttl.String(), Version: l.Version, At: l.now().UTC()})
	return b
}

func (l *Lease) margin() time.Duration { return l.ttl / 10 }

// Renew writes the lease with a compare-and-set on our last revision and
// returns the new revision. A conflict loses the lease.
func (l *Lease) Renew(ctx context.Context) (uint64, error) {
	sent := l.now()
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	rev, err := l.kv.Update(octx, l.key, l.value(), l.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyExists) {
			l.lose()
		}
		return 0, fmt.Errorf("renew the lease in %s: %w", messages.BucketLeases, err)
	}
	l.rev, l.validUntil = rev, sent.Add(l.ttl-l.margin())
	return rev, nil
}

func (l *Lease) lose() {
	l.holding, l.validUntil = false, time.Time{}
	l.seenRev, l.seenAt = 0, time.Time{}
}

// Tick renews the lease if held, or else reads it and takes it if it is
// free or its holder stopped renewing it. It reports whether it just took
// it.
func (l *Lease) Tick(ctx context.Context) (took bool, err error) {
	if l.holding {
		_, err := l.Renew(ctx)
		return false, err
	}
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	now := l.now()
	e, err := l.kv.Get(octx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := l.kv.Create(octx, l.key, l.value())
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				return false, nil // another was quicker
			}
			return false, fmt.Errorf("take the lease in %s: %w", messages.BucketLeases, err)
		}
		l.take(rev, now)
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read the lease in %s: %w", messages.BucketLeases, err)
	}
	var v Value
	_ = json.Unmarshal(e.Value(), &v) // a value we cannot read is a holder we wait out
	l.Version = max(l.Version, v.Version)
	ttl := l.ttl
	if d, err := time.ParseDuration(v.TTL); err == nil && d > 0 {
		ttl = d // the holder says how long its writes last
	}
	if e.Revision() != l.seenRev {
		l.seenRev, l.seenAt = e.Revision(), now
		if v.Holder != l.id {
			return false, nil
		}
		// Our own lease (a write whose answer we lost): take it back.
	} else if now.Sub(l.seenAt) < ttl {
		return false, nil
	}
	rev, err := l.kv.Update(octx, l.key, l.value(), e.Revision())
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, nil // renewed or taken meanwhile
		}
		return false, fmt.Errorf("take over the lease in %s: %w", messages.BucketLeases, err)
	}
	l.take(rev, now)
	return true, nil
}

func (l *Lease) take(rev uint64, sent time.Time) {
	l.holding, l.rev, l.validUntil = true, rev, sent.Add(l.ttl-l.margin())
	l.seenRev, l.seenAt = 0, time.Time{}
}

// Release gives the lease up, if held, so a standby takes over at its next
// look rather than after the TTL.
func (l *Lease) Release(ctx context.Context) error {
	if !l.holding {
		return nil
	}
	l.holding = false
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	if err := l.kv.Delete(octx, l.key, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("release the lease in %s: %w", messages.BucketLeases, err)
	}
	return nil
}
