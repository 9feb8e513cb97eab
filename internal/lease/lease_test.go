package lease

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
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

func bucket(t *testing.T) (context.Context, jetstream.KeyValue) {
	t.Helper()
	_, js := natstest.Start(t).Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "LEASES_TEST", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, kv
}

// One process holds the lease; a standby takes it over only once its
// revision has not moved for the TTL by the standby's own clock, or at
// once once it is released. A holder whose renewal finds the lease taken
// stops holding it.
func TestTakeoverAndRelease(t *testing.T) {
	ctx, kv := bucket(t)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := New(kv, "k", "a", 10*time.Second, 5*time.Second, clock.Now)
	b := New(kv, "k", "b", 10*time.Second, 5*time.Second, clock.Now)
	if took, err := a.Tick(ctx); err != nil || !took || !a.Valid() {
		t.Fatalf("a takes the free lease: %v %v %v", took, err, a.Valid())
	}
	if took, err := b.Tick(ctx); err != nil || took || b.Valid() {
		t.Fatalf("b took a held lease: %v %v", took, err)
	}
	// a renews; b's clock runs 9s: not yet.
	clock.add(9 * time.Second)
	if _, err := a.Tick(ctx); err != nil || !a.Valid() {
		t.Fatalf("a renews: %v", err)
	}
	if took, _ := b.Tick(ctx); took {
		t.Fatal("b took a lease renewed since it last looked")
	}
	// a stops renewing: after the TTL, b takes over, and a is no longer
	// valid by its own clock either (its margin ends it first).
	clock.add(10 * time.Second)
	if a.Valid() {
		t.Fatal("a still valid a TTL after its last renewal")
	}
	if took, err := b.Tick(ctx); err != nil || !took || !b.Valid() {
		t.Fatalf("b takes over a lease not renewed for the TTL: %v %v", took, err)
	}
	if _, err := a.Tick(ctx); err == nil || a.Holding() {
		t.Fatalf("a's late renewal: %v, holding %v; want refused", err, a.Holding())
	}
	// b releases: a takes it at its next look.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if took, err := a.Tick(ctx); err != nil || !took {
		t.Fatalf("a takes the released lease: %v %v", took, err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || e.Operation() != jetstream.KeyValuePut {
		t.Fatalf("the lease key: %v", err)
	}
}

// A standby waits for the TTL the holder wrote, not its own; the version
// a holder wrote is learnt by a standby that reads the key.
func TestStandbyHonoursTheHoldersTTLAndVersion(t *testing.T) {
	ctx, kv := bucket(t)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := New(kv, "k", "a", 30*time.Second, 5*time.Second, clock.Now)
	a.Version = 41
	if took, err := a.Tick(ctx); err != nil || !took {
		t.Fatalf("a takes the free lease: %v %v", took, err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var v Value
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.Holder != "a" || v.TTL != "30s" || v.Version != 41 {
		t.Fatalf("the lease's value %s: %+v %v", e.Value(), v, err)
	}
	b := New(kv, "k", "b", 10*time.Second, 5*time.Second, clock.Now)
	if took, _ := b.Tick(ctx); took || b.Version != 41 {
		t.Fatalf("b's first look: took %v, version %d; want not taken, 41", took, b.Version)
	}
	clock.add(20 * time.Second) // past b's TTL, within a's
	if took, _ := b.Tick(ctx); took {
		t.Fatal("b took the lease before the holder's TTL ran out")
	}
	clock.add(11 * time.Second)
	if took, err := b.Tick(ctx); err != nil || !took {
		t.Fatalf("b takes over after the holder's TTL: %v %v", took, err)
	}
}
