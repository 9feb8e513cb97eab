package worker_test

import (
	"fmt"
	"testing"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// A new proxy's "provisioning" is published while its create runs, and is
// still stored before its "running": the running event waits for it. Were
// it not awaited, a create faster than the publish (a sim host with no
// delay) would report "running" first, and the late "provisioning" would
// be the proxy's last word while it runs.
func TestProvisioningIsStoredBeforeRunning(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) {
		d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")}) // no call delay
		if err != nil {
			t.Fatal(err)
		}
		c.Providers = map[string]worker.Provider{"h1": d}
	})
	const n = 40
	for i := range n {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		r.waitOutcome(fmt.Sprintf("c%d", i), messages.OutcomeDone)
		ev, ok := r.lastEvent(id)
		if !ok || ev.State != messages.StateRunning {
			t.Errorf("%s is done, its last event %q (seq %d), want running", id, ev.State, ev.Seq)
			continue
		}
		r.mu.Lock()
		seen := r.events[id]
		r.mu.Unlock()
		var prov []uint64
		for _, e := range seen {
			if e.State == messages.StateProvisioning {
				prov = append(prov, e.Seq)
			}
		}
		if len(prov) == 0 || prov[len(prov)-1] >= ev.Seq {
			t.Errorf("%s: provisioning at seqs %v, running at %d: want one, below", id, prov, ev.Seq)
		}
	}
}
