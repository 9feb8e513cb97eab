package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// reporting is a sim host whose creates report progress, as the kvm
// provider does while it uploads a base image.
type reporting struct{ *sim.Driver }

func (r reporting) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	for i := 1; i <= 3; i++ {
		fleet.ReportProgress(ctx, "uploading image img: step "+string(rune('0'+i)))
		time.Sleep(60 * time.Millisecond)
	}
	return r.Driver.Create(ctx, spec)
}

func TestCreateProgressBecomesProvisioningEvents(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) {
		c.ProgressEvery = 40 * time.Millisecond
		d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
		if err != nil {
			t.Fatal(err)
		}
		c.Providers["h1"] = reporting{d}
	})
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events["p1"] {
		if ev.State == messages.StateProvisioning && strings.HasPrefix(ev.Reason, "uploading image img") {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no progress event among %+v", r.events["p1"])
	}
	last := r.events["p1"][len(r.events["p1"])-1]
	if last.State != messages.StateRunning {
		t.Fatalf("last event %+v, want running after the progress", last)
	}
}
