package worker_test

import (
	"context"
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
