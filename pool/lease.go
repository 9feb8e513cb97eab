package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// The active controller holds a lease in PROXY_LEASES (key "pools"), as
// health's publisher holds "health": it renews it with compare-and-set
// every third of its TTL; a standby takes it over when its revision has
// not moved for the TTL by the standby's own clock (so clocks need not
// agree); a controller that stops releases it. The holder acts only
// while its last renewal is younger than the TTL less a margin, so its
// last pass ends before a standby can take over. The pool records'
// compare-and-set is the second fence: two controllers acting at once
// still never both add a member (see pass.go).

// leaseValue is the lease's value.
type leaseValue struct {
	Holder string    `json:"holder"`
	TTL    string    `json:"ttl"`
	At     time.Time `json:"at"`
}

// lease is one controller's side of the lease, used by one goroutine.
type lease struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	now func() time.Time
	op  time.Duration // bound of each request

	holding    bool
	rev        uint64
	validUntil time.Time

	seenRev uint64
	seenAt  time.Time
}

func (l *lease) value() []byte {
	b, _ := json.Marshal(leaseValue{Holder: l.id, TTL: l.ttl.String(), At: l.now().UTC()})
	return b
}

// valid reports whether the holder may act now.
func (l *lease) valid() bool { return l.holding && l.now().Before(l.validUntil) }

func (l *lease) take(rev uint64, sent time.Time) {
	l.holding, l.rev, l.validUntil = true, rev, sent.Add(l.ttl-l.ttl/10)
	l.seenRev, l.seenAt = 0, time.Time{}
}

func (l *lease) lose() {
	l.holding, l.validUntil = false, time.Time{}
	l.seenRev, l.seenAt = 0, time.Time{}
}

// tick renews the lease if held, or else takes it if it is free or its
// holder stopped renewing it. It reports whether it just took it.
func (l *lease) tick(ctx context.Context) (took bool, err error) {
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	sent := l.now()
	key := topology.PoolsLeaseKey
	if l.holding {
		rev, err := l.kv.Update(octx, key, l.value(), l.rev)
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyExists) {
				l.lose()
			}
			return false, fmt.Errorf("renew the lease in %s: %w", messages.BucketLeases, err)
		}
		l.rev, l.validUntil = rev, sent.Add(l.ttl-l.ttl/10)
		return false, nil
	}
	e, err := l.kv.Get(octx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		rev, err := l.kv.Create(octx, key, l.value())
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				return false, nil // another was quicker
			}
			return false, fmt.Errorf("take the lease in %s: %w", messages.BucketLeases, err)
		}
		l.take(rev, sent)
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read the lease in %s: %w", messages.BucketLeases, err)
	}
	var v leaseValue
	_ = json.Unmarshal(e.Value(), &v)
	ttl := l.ttl
	if d, err := time.ParseDuration(v.TTL); err == nil && d > 0 {
		ttl = d // the holder says how long its renewals last
	}
	if e.Revision() != l.seenRev {
		l.seenRev, l.seenAt = e.Revision(), sent
		if v.Holder != l.id {
			return false, nil
		}
		// Our own lease (a renewal whose answer we lost): take it back.
	} else if sent.Sub(l.seenAt) < ttl {
		return false, nil
	}
	rev, err := l.kv.Update(octx, key, l.value(), e.Revision())
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, nil
		}
		return false, fmt.Errorf("take over the lease in %s: %w", messages.BucketLeases, err)
	}
	l.take(rev, sent)
	return true, nil
}

// release gives the lease up, if held, so a standby takes over at its
// next look rather than after the TTL.
func (l *lease) release(ctx context.Context) error {
	if !l.holding {
		return nil
	}
	l.holding = false
	octx, cancel := context.WithTimeout(ctx, l.op)
	defer cancel()
	if err := l.kv.Delete(octx, topology.PoolsLeaseKey, jetstream.LastRevision(l.rev)); err != nil {
		return fmt.Errorf("release the lease in %s: %w", messages.BucketLeases, err)
	}
	return nil
}
