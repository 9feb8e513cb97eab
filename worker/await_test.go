package worker_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// bootingGets is a provider that counts the reads that found its proxy
// still booting.
type bootingGets struct {
	worker.Provider
	booting atomic.Int64
}

func (p *bootingGets) Get(ctx context.Context, id string) (fleet.Instance, error) {
	in, err := p.Provider.Get(ctx, id)
	if err == nil && in.State == messages.StateProvisioning {
		p.booting.Add(1)
	}
	return in, err
}

// TestAddressSeenLongBeforeThePollInterval: PollInterval is the longest
// pause between the reads of a booting proxy, not the pause after the first
// one. An address that shows a moment after the create is reported in
// about that moment again, not a whole interval (here an hour) later.
func TestAddressSeenLongBeforeThePollInterval(t *testing.T) {
	r := newRig(t, "h1")
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	var prov *bootingGets
	r.startWorker(func(c *worker.Config) {
		c.PollInterval, c.ReadyTimeout = time.Hour, 2*time.Hour
		s, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1"), Delay: time.Millisecond, BootDelay: time.Minute, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		prov = &bootingGets{Provider: s}
		c.Providers["h1"] = prov
	})
	r.create("p1", "c1", "")
	// The worker has read the proxy booting: from now on it waits.
	r.waitFor("a read of the booting proxy", 10*time.Second, func() bool { return prov.booting.Load() > 0 })
	mu.Lock()
	now = now.Add(2 * time.Minute) // booted: it has its address
	mu.Unlock()
	r.waitFor("the create done", 20*time.Second, func() bool { return hasOutcome(r.resultsFor("c1"), messages.OutcomeDone) })
}

// TestABurstOfCreatesBootsAtOnce: a booting proxy holds its work slot
// until it runs, so with the default concurrency a burst of creates as
// large as a KVM host's default room (20) must all be started before any
// of them has booted: none waits for another's boot to begin its own.
func TestABurstOfCreatesBootsAtOnce(t *testing.T) {
	const n = 20
	r := newRig(t, "h1")
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	var prov *bootingIDs
	r.startWorker(func(c *worker.Config) {
		c.Concurrency = 0 // the default
		c.Catalog.MaxProxies = map[string]int{"h1": n}
		c.PollInterval, c.ReadyTimeout = 100*time.Millisecond, time.Hour
		s, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1"), Delay: time.Millisecond, BootDelay: time.Minute, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		prov = &bootingIDs{Provider: s, ids: map[string]bool{}}
		c.Providers["h1"] = prov
	})
	for i := range n {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	r.waitFor(fmt.Sprintf("all %d proxies booting at once", n), 20*time.Second, func() bool { return prov.count() == n })
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	r.waitFor("every create done", 20*time.Second, func() bool {
		for i := range n {
			if !hasOutcome(r.resultsFor(fmt.Sprintf("c%d", i)), messages.OutcomeDone) {
				return false
			}
		}
		return true
	})
}

// bootingIDs is a provider that records which proxies it has read booting.
type bootingIDs struct {
	worker.Provider
	mu  sync.Mutex
	ids map[string]bool
}

func (p *bootingIDs) Get(ctx context.Context, id string) (fleet.Instance, error) {
	in, err := p.Provider.Get(ctx, id)
	if err == nil && in.State == messages.StateProvisioning {
		p.mu.Lock()
		p.ids[id] = true
		p.mu.Unlock()
	}
	return in, err
}

func (p *bootingIDs) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}
