package health

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/messages"
)

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
	// ProbeKinds counts probes by kind (KindHTTP, KindConnect, KindTCP);
	// a plain Prober's are not counted.
	ProbeKinds map[string]uint64
	// OpenChecks counts open checks by result (OpenRefused, ...).
	OpenChecks map[string]uint64
	// Refused is how many candidates are refused now, by verdict
	// (messages.VerdictOpen, VerdictLeaky); Refusals how many times a
	// candidate's verdict became one.
	Refused  map[string]int
	Refusals map[string]uint64
	// Checks is how many check records this process has (what it
	// writes to PROXY_CHECKS when it holds the lease); CheckWrites how
	// many puts and deletes of PROXY_CHECKS it made.
	Checks      int
	CheckWrites uint64
	// Reports counts the reports of proxies received, by outcome
	// (ReportProbed, ...).
	Reports map[string]uint64
}

// ProbeBuckets are the upper bounds of the probe latency histogram
// (proxyfleet_probe_duration_seconds).
var ProbeBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// probeStats counts probe outcomes by result, probes by kind and open
// checks by result.
type probeStats struct {
	results map[string]uint64
	kinds   map[string]uint64
	open    map[string]uint64
}

func newProbeStats() probeStats {
	zero := func(keys []string) map[string]uint64 {
		m := make(map[string]uint64, len(keys))
		for _, k := range keys {
			m[k] = 0
		}
		return m
	}
	return probeStats{results: zero(probeResults), kinds: zero(probeKinds), open: zero(openResults)}
}

func (s *probeStats) add(result string) { s.results[result]++ }

// newProbeLatency is the histogram of probe durations.
func newProbeLatency() prometheus.Histogram {
	b := make([]float64, len(ProbeBuckets))
	for i, d := range ProbeBuckets {
		b[i] = d.Seconds()
	}
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "proxyfleet_probe_duration_seconds", Help: "Probe durations.", Buckets: b,
	})
}

// Metrics returns the counters.
func (h *Health) Metrics() Metrics {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.fold.Stats()
	open, leaky := h.fold.Refused()
	m := Metrics{
		RotationSize:    h.fold.Len(),
		InGrace:         h.fold.GraceLen(),
		RotationVersion: h.version,
		Changes:         st.Changes,
		Entries:         st.Entries,
		Exits:           st.Exits,
		Events:          st.Events + h.undecodable,
		Ignored:         st.Ignored + h.undecodable,
		Published:       h.publishCount,
		PublishErrors:   h.publishErrors,
		CaughtUp:        h.caughtUp,
		Holder:          h.holder,
		Takeovers:       h.takeovers,
		ConsumerRepairs: h.repairs,
		Missing:         len(h.missing),
		Probing:         h.prober != nil && !h.tcpOnly,
		Targets:         h.fold.TargetsLen(),
		Probes:          make(map[string]uint64, len(h.probeStats.results)),
		ProbesIgnored:   st.ProbesIgnored,
		ProbeKinds:      maps.Clone(h.probeStats.kinds),
		OpenChecks:      maps.Clone(h.probeStats.open),
		Refused:         map[string]int{messages.VerdictOpen: open, messages.VerdictLeaky: leaky},
		Refusals:        map[string]uint64{messages.VerdictOpen: st.RefusedOpen, messages.VerdictLeaky: st.RefusedLeaky},
		Checks:          len(h.fold.Checks()),
		CheckWrites:     h.checksWrites,
		Reports:         maps.Clone(h.reports.outcomes),
	}
	for k, v := range h.probeStats.results {
		m.Probes[k] = v
	}
	return m
}

// collector exports Metrics when scraped, and the probe histogram. One
// Health registers one on its registry (Config.Registry).
type collector struct{ h *Health }

type metricDesc struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(Metrics) float64
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	healthDescs = []metricDesc{
		{prometheus.NewDesc("proxyfleet_rotation_size", "Proxies in the rotation.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.RotationSize) }},
		{prometheus.NewDesc("proxyfleet_rotation_in_grace", "Proxies in the rotation kept on grace after reporting provisioning.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.InGrace) }},
		{prometheus.NewDesc("proxyfleet_rotation_version", "Version of the last rotation snapshot known to be published.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.RotationVersion) }},
		{prometheus.NewDesc("proxyfleet_rotation_changes_total", "Changes of the rotation folded from events, probes and grace expiries.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Changes) }},
		{prometheus.NewDesc("proxyfleet_rotation_entries_total", "Proxies that entered the rotation (those loaded at start included).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Entries) }},
		{prometheus.NewDesc("proxyfleet_rotation_exits_total", "Proxies that left the rotation.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Exits) }},
		{prometheus.NewDesc("proxyfleet_events_total", "State events received.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Events) }},
		{prometheus.NewDesc("proxyfleet_events_ignored_total", "State events ignored: stale, duplicate or not understood.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Ignored) }},
		{prometheus.NewDesc("proxyfleet_rotation_published_total", "Snapshots this process published.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Published) }},
		{prometheus.NewDesc("proxyfleet_rotation_publish_errors_total", "Failed attempts to publish the rotation.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.PublishErrors) }},
		{prometheus.NewDesc("proxyfleet_health_caught_up", "1 once the initial events are folded.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return b2f(m.CaughtUp) }},
		{prometheus.NewDesc("proxyfleet_health_lease_holder", "1 while this process holds the lease and publishes.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return b2f(m.Holder) }},
		{prometheus.NewDesc("proxyfleet_health_lease_takeovers_total", "Times this process took the lease.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Takeovers) }},
		{prometheus.NewDesc("proxyfleet_health_consumer_repairs_total", "Consumers of PROXY_EVENTS made anew: the last one was deleted, lost events, or its stream was created anew.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.ConsumerRepairs) }},
		{prometheus.NewDesc("proxyfleet_health_topology_missing", "Streams and buckets this process needs that were gone at its last look.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.Missing) }},
		{prometheus.NewDesc("proxyfleet_health_probing", "1 if proxies are probed through them to a target, 0 if by a TCP connect only (no target configured).", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return b2f(m.Probing) }},
		{prometheus.NewDesc("proxyfleet_probe_targets", "Proxies being probed.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.Targets) }},
		{prometheus.NewDesc("proxyfleet_probe_results_ignored_total", "Probe results that came too late to count (address changed, proxy deleted).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.ProbesIgnored) }},
	}
	descProbes     = prometheus.NewDesc("proxyfleet_probes_total", "Probes by result.", []string{"result"}, nil)
	descProbeKinds = prometheus.NewDesc("proxyfleet_probes_by_kind_total", "Probes by kind: http (a GET through the proxy), connect (CONNECT, TLS, GET), tcp (a TCP connect only).", []string{"kind"}, nil)
	descOpenChecks = prometheus.NewDesc("proxyfleet_open_checks_total", "Open checks (a probe's request sent again without credentials) by result: refused, open, inconclusive.", []string{"result"}, nil)
	descRefused    = prometheus.NewDesc("proxyfleet_health_refused", "Candidates kept out of the rotation by their checks, by verdict (open, leaky).", []string{"verdict"}, nil)
	descRefusals   = prometheus.NewDesc("proxyfleet_health_refusals_total", "Times a candidate's verdict became open or leaky.", []string{"verdict"}, nil)
	descReports    = prometheus.NewDesc("proxyfleet_health_reports_total", "Reports of proxies by consumers of the rotation, by outcome: probed (at once), limited (dropped by the per-proxy interval or the rate), stale (an old address), unknown (no such proxy being probed), invalid.", []string{"outcome"}, nil)
	descReady      = prometheus.NewDesc("proxyfleet_health_ready", "1 while the health process is ready (as /readyz): caught up, publishing or standing by, its streams and buckets there.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range healthDescs {
		ch <- d.desc
	}
	ch <- descProbes
	ch <- descProbeKinds
	ch <- descOpenChecks
	ch <- descRefused
	ch <- descRefusals
	ch <- descReports
	ch <- descReady
	c.h.probeLatency.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.h.Metrics()
	for _, d := range healthDescs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.typ, d.value(m))
	}
	for r, n := range m.Probes {
		ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(n), r)
	}
	// Every label value, zero or not, so that rate() and alerts see the
	// series from the start.
	for _, k := range probeKinds {
		ch <- prometheus.MustNewConstMetric(descProbeKinds, prometheus.CounterValue, float64(m.ProbeKinds[k]), k)
	}
	for _, r := range openResults {
		ch <- prometheus.MustNewConstMetric(descOpenChecks, prometheus.CounterValue, float64(m.OpenChecks[r]), r)
	}
	for _, v := range verdicts {
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.GaugeValue, float64(m.Refused[v]), v)
		ch <- prometheus.MustNewConstMetric(descRefusals, prometheus.CounterValue, float64(m.Refusals[v]), v)
	}
	for _, o := range reportOutcomes {
		ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(m.Reports[o]), o)
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(c.h.Ready() == nil))
	c.h.probeLatency.Collect(ch)
}
