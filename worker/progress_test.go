package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// reporting is a sim host whose creates report progress, as the kvm
// provider does while it uploads a base image, and go on only once the
// test releases them.
type reporting struct {
	*sim.Driver
	release <-chan struct{}
}

func (r reporting) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	fleet.ReportProgress(ctx, "uploading image img: step 1")
	select {
	case <-r.release:
	case <-ctx.Done():
		return fleet.Instance{}, fmt.Errorf("upload image img: %w", ctx.Err())
	}
	return r.Driver.Create(ctx, spec)
}

func TestCreateProgressBecomesProvisioningEvents(t *testing.T) {
	r := newRig(t, "h1")
	release := make(chan struct{})
	r.startWorker(func(c *worker.Config) {
		c.ProgressEvery = 40 * time.Millisecond
		d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
		if err != nil {
			t.Fatal(err)
		}
		c.Providers["h1"] = reporting{d, release}
	})
	var once sync.Once
	releaseCreate := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseCreate) // before the worker stops, should the test fail first
	r.create("p1", "c1", "")
	// The create's progress is reported while it is still under way.
	r.waitFor("a progress event", 10*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, ev := range r.events["p1"] {
			if ev.State == messages.StateProvisioning && strings.HasPrefix(ev.Reason, "uploading image img") {
				return true
			}
		}
		return false
	})
	releaseCreate()
	r.waitOutcome("c1", messages.OutcomeDone)
	r.mu.Lock()
	defer r.mu.Unlock()
	last := r.events["p1"][len(r.events["p1"])-1]
	if last.State != messages.StateRunning {
		t.Fatalf("last event %+v, want running after the progress", last)
	}
}
