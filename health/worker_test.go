package health_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// startWorker runs a real worker on sim hosts, on its own connection, so
// the events health folds are the ones the worker really publishes.
func (r *rig) startWorker(hosts ...string) {
	r.t.Helper()
	_, js := r.srv.Connect(r.t)
	dir := r.t.TempDir()
	provs := map[string]worker.Provider{}
	for _, h := range hosts {
		d, err := sim.New(sim.Config{Host: h, Dir: filepath.Join(dir, h), Delay: time.Millisecond})
		if err != nil {
			r.t.Fatal(err)
		}
		provs[h] = d
	}
	w, err := worker.New(js, worker.Config{
		Subjects:     subj,
		Catalog:      worker.Catalog{Hosts: hosts, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128},
		Providers:    provs,
		AckWait:      5 * time.Second,
		ReadyTimeout: 10 * time.Second, PollInterval: 20 * time.Millisecond,
		PinnedTTL: 2 * time.Second, DrainTimeout: 5 * time.Second,
		Backoff: worker.ExpBackoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	runtest.Start(r.t, w.Run, w.Started(), 10*time.Second)
}

func (r *rig) command(subject string, cmd any) {
	r.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		r.t.Fatal(err)
	}
	r.publishRaw(subject, b)
}

// The worker's own events drive the rotation: create, then delete.
func TestWithARealWorker(t *testing.T) {
	r := newRig(t)
	r.startWorker("h1")
	h := r.start(health.Config{})

	r.command(subj.Create("p1"), messages.CreateCommand{V: 1, ID: "p1"})
	r.command(subj.Create("p2"), messages.CreateCommand{V: 1, ID: "p2"})
	want := map[string]string{"p1": sim.SimIP("p1") + ":3128", "p2": sim.SimIP("p2") + ":3128"}
	r.waitBucket(want)
	r.waitSnapshot(want)
	for _, e := range getRotation(t, h).Proxies {
		if e.Host != "h1" || e.Since.IsZero() {
			t.Fatalf("entry %+v, want host h1 and a since", e)
		}
	}

	r.command(subj.Delete("p1"), messages.DeleteCommand{V: 1, ID: "p1"})
	delete(want, "p1")
	r.waitBucket(want)
	r.waitSnapshot(want)
	checkVersionsIncrease(t, r.snapshots())

	// A health process started now sees the same (it stands by: the
	// first one holds the lease and publishes).
	h2 := r.start(health.Config{})
	if got := addrs(getRotation(t, h2).Proxies); len(got) != 1 || got["p2"] != want["p2"] {
		t.Fatalf("late process rotation = %v, want %v", got, want)
	}
}
