package health

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Running to in the rotation: how long a proxy waits between the running
// event that gives it an address and its admission to the rotation (at
// once for a sim proxy or without probing; after Rise passing probes
// otherwise), as proxyfleet_rotation_admission_seconds.
//
// The fold marks a proxy when a running event makes it a candidate at an
// address (proxyState.runningAt, the event's time, never later than the
// fold's clock) and tells Admitted the wait when that candidate enters,
// once: a proxy that leaves and comes back at the same address (Fall
// failing probes, then Rise passing ones), one loaded from PROXY_ROTATION
// (Seed) and one adopted on a takeover (Adopt) are not admissions of a
// running event, and are not told.
//
// Every health process folds every event, but only the one that publishes
// (the lease holder) observes, once it has caught up: a standby's
// admissions are nobody's, and those of a catch-up are of events from
// before the process started. The publish itself follows the admission by
// the publisher's own pace (publish.go).

// AdmissionBuckets are the upper bounds, in seconds, of
// proxyfleet_rotation_admission_seconds: as the worker's latency
// histograms (worker.LatencyBuckets), from 10ms to 10 minutes.
var AdmissionBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600}

// admitted tells Admitted how long p waited since its running event, if it
// has not been told for that event yet.
func (f *Fold) admitted(p *proxyState) {
	if p.runningAt.IsZero() {
		return
	}
	wait := f.now().Sub(p.runningAt)
	p.runningAt = time.Time{}
	if f.Admitted != nil {
		f.Admitted(max(wait, 0))
	}
}

// initLatency makes and registers the admission histogram and has the
// fold tell it.
func (h *Health) initLatency() error {
	h.admission = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "proxyfleet_rotation_admission_seconds",
		Help:    "Proxies from their running event (its time) to their admission to the rotation by the publishing health process, once each per running event; not counted while catching up.",
		Buckets: AdmissionBuckets,
	})
	h.fold.Admitted = h.admittedLocked
	return h.registry.Register(h.admission)
}

// admittedLocked observes an admission (the fold is called under mu).
func (h *Health) admittedLocked(wait time.Duration) {
	if h.holder && h.caughtUp {
		h.admission.Observe(wait.Seconds())
	}
}
