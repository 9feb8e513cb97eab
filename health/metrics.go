package health

import "time"

// Metrics are the health process's counters.
type Metrics struct {
	RotationSize    int
	InGrace         int // of which kept on grace
	RotationVersion uint64
	Changes         uint64 // changes of the rotation, catch-up included
	Entries         uint64 // proxies that entered the rotation (seeded at start included)
	Exits           uint64 // proxies that left it
	Events          uint64 // state events received
	Ignored         uint64 // of which stale, duplicate or not understood
	Published       uint64 // snapshots this process published
	PublishErrors   uint64
	CaughtUp        bool
	Holder          bool   // this process holds the lease and publishes
	Takeovers       uint64 // times this process took the lease
	// ConsumerRepairs counts the consumers of PROXY_EVENTS made anew
	// because the last one was deleted, lost events or its stream was
	// created anew.
	ConsumerRepairs uint64
	Missing         int // streams and buckets found gone at the last look
	Probing         bool
	Targets         int               // proxies being probed
	Probes          map[string]uint64 // probe outcomes by result (ResultOK, ...)
	ProbesIgnored   uint64            // results that came too late to count
	// ProbeLatency is a histogram of probe durations: cumulative counts
	// for each bound of ProbeBuckets, then +Inf.
	ProbeLatency      []uint64
	ProbeLatencySum   time.Duration
	ProbeLatencyCount uint64
}

// ProbeBuckets are the upper bounds of the probe latency histogram.
var ProbeBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// probeStats counts probe outcomes and latencies.
type probeStats struct {
	results map[string]uint64
	buckets []uint64 // not cumulative; len(ProbeBuckets)+1
	sum     time.Duration
	count   uint64
}

func newProbeStats() probeStats {
	r := make(map[string]uint64, len(probeResults))
	for _, k := range probeResults {
		r[k] = 0
	}
	return probeStats{results: r, buckets: make([]uint64, len(ProbeBuckets)+1)}
}

func (s *probeStats) add(result string, d time.Duration) {
	s.results[result]++
	i := 0
	for i < len(ProbeBuckets) && d > ProbeBuckets[i] {
		i++
	}
	s.buckets[i]++
	s.sum += d
	s.count++
}

// Metrics returns the counters.
func (h *Health) Metrics() Metrics {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.fold.Stats()
	m := Metrics{
		RotationSize:      h.fold.Len(),
		InGrace:           h.fold.GraceLen(),
		RotationVersion:   h.version,
		Changes:           st.Changes,
		Entries:           st.Entries,
		Exits:             st.Exits,
		Events:            st.Events + h.undecodable,
		Ignored:           st.Ignored + h.undecodable,
		Published:         h.publishCount,
		PublishErrors:     h.publishErrors,
		CaughtUp:          h.caughtUp,
		Holder:            h.holder,
		Takeovers:         h.takeovers,
		ConsumerRepairs:   h.repairs,
		Missing:           len(h.missing),
		Probing:           h.prober != nil,
		Targets:           len(h.fold.Targets()),
		Probes:            make(map[string]uint64, len(h.probeStats.results)),
		ProbesIgnored:     st.ProbesIgnored,
		ProbeLatency:      make([]uint64, len(h.probeStats.buckets)),
		ProbeLatencySum:   h.probeStats.sum,
		ProbeLatencyCount: h.probeStats.count,
	}
	for k, v := range h.probeStats.results {
		m.Probes[k] = v
	}
	var cum uint64
	for i, n := range h.probeStats.buckets {
		cum += n
		m.ProbeLatency[i] = cum
	}
	return m
}
