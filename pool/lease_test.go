package pool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// fakeClock is a clock a test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) add(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// One controller holds the lease; a standby takes it over only once its
// revision has not moved for the TTL by the standby's own clock, or at once
// once it is released. A holder whose renewal finds the lease taken stops
// holding it.
func TestLeaseTakeoverAndRelease(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := (topology.Topology{Subjects: messages.NewSubjects("")}).Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, messages.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	newLease := func(id string) *lease {
		return &lease{kv: kv, id: id, ttl: 10 * time.Second, now: clock.Now, op: 5 * time.Second}
	}
	a, b := newLease("a"), newLease("b")
	if took, err := a.tick(ctx); err != nil || !took || !a.valid() {
		t.Fatalf("a takes the free lease: %v %v %v", took, err, a.valid())
	}
	if took, err := b.tick(ctx); err != nil || took || b.valid() {
		t.Fatalf("b took a held lease: %v %v", took, err)
	}
	// a renews; b's clock runs 9s: not yet.
	clock.add(9 * time.Second)
	if _, err := a.tick(ctx); err != nil || !a.valid() {
		t.Fatalf("a renews: %v", err)
	}
	if took, _ := b.tick(ctx); took {
		t.Fatal("b took a lease renewed since it last looked")
	}
	// a stops renewing: after the TTL, b takes over, and a is no longer
	// valid by its own clock either (its margin ends it first).
	clock.add(10 * time.Second)
	if a.valid() {
		t.Fatal("a still valid a TTL after its last renewal")
	}
	if took, err := b.tick(ctx); err != nil || !took || !b.valid() {
		t.Fatalf("b takes over a lease not renewed for the TTL: %v %v", took, err)
	}
	if _, err := a.tick(ctx); err == nil || a.holding {
		t.Fatalf("a's late renewal: %v, holding %v; want refused", err, a.holding)
	}
	// b releases: a takes it at its next look.
	if err := b.release(ctx); err != nil {
		t.Fatal(err)
	}
	if took, err := a.tick(ctx); err != nil || !took {
		t.Fatalf("a takes the released lease: %v %v", took, err)
	}
	if e, err := kv.Get(ctx, topology.PoolsLeaseKey); err != nil || e.Operation() != jetstream.KeyValuePut {
		t.Fatalf("the lease key: %v", err)
	}
}
