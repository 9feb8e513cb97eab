package health

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/bans"
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
	// ProbeFamilies counts probes by the family of the egress address
	// their request named: "ipv4", "ipv6", or "none" (no address named:
	// the proxy has no plan, none of a family with a target, or the
	// prober cannot name one).
	ProbeFamilies map[string]uint64
	// EgressTargets says, by family ("ipv4", "ipv6"), whether probes
	// name that family's egress addresses (it has a probe target): a
	// family without one is never checked address by address.
	EgressTargets map[string]bool
	// EgressMismatches counts passing probes whose target saw the
	// request come from another address than the one it named, or from
	// one not of the proxy's plan.
	EgressMismatches uint64
	// OpenChecks counts open checks by result (OpenRefused, ...).
	OpenChecks map[string]uint64
	// Refused is how many candidates are refused now, by verdict
	// (messages.VerdictOpen, VerdictLeaky, VerdictMismatch); Refusals how many times a
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

	// The feed (<prefix>.rotation.changes): messages with changes (and
	// resets, which follow no version), the changes and bytes they
	// carried, heartbeats, and messages that could not be sent.
	FeedMessages, FeedChanges, FeedBytes, FeedResets, FeedHeartbeats, FeedErrors uint64
	// Pages counts the page requests (<prefix>.rotation.get) by outcome
	// (PageServed, ...).
	Pages map[string]uint64
	// Snapshots counts the snapshots published on <prefix>.rotation
	// (whole or notices), SnapshotsTooLarge the notices sent instead of
	// a snapshot too large for a message; SnapshotTooLarge is whether
	// the last one was such a notice; SnapshotBytes the size of the
	// whole snapshot (tracked as entries change, also while it does not
	// fit).
	Snapshots, SnapshotsTooLarge uint64
	SnapshotTooLarge             bool
	SnapshotBytes                int
	// HTTP counts GET /rotation by answer (HTTPSnapshot, ...).
	HTTP map[string]uint64
	// BanRequests counts the requests on <prefix>.ban by result
	// (BanAdded, ...); Bans the bans stored, by source (bans.Sources).
	BanRequests, Bans map[string]uint64
}

// feedStats counts the feed's messages.
type feedStats struct {
	messages   uint64 // messages with changes (or resets)
	changes    uint64
	bytes      uint64
	resets     uint64 // messages that follow no version (prev 0)
	heartbeats uint64
	errors     uint64 // messages that could not be sent
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
	results  map[string]uint64
	kinds    map[string]uint64
	open     map[string]uint64
	families map[string]uint64 // by the family of the address named (FamilyName)
}

func newProbeStats() probeStats {
	zero := func(keys []string) map[string]uint64 {
		m := make(map[string]uint64, len(keys))
		for _, k := range keys {
			m[k] = 0
		}
		return m
	}
	return probeStats{results: zero(probeResults), kinds: zero(probeKinds), open: zero(openResults), families: zero(familyNames)}
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
	c := h.fold.Counts()
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
		Targets:         c.Targets,
		Probes:          make(map[string]uint64, len(h.probeStats.results)),
		ProbesIgnored:   st.ProbesIgnored,
		ProbeKinds:      maps.Clone(h.probeStats.kinds),
		OpenChecks:      maps.Clone(h.probeStats.open),
		ProbeFamilies:   maps.Clone(h.probeStats.families),
		EgressTargets: map[string]bool{familyIPv4: h.fold.EgressFamilies&FamilyIPv4 != 0,
			familyIPv6: h.fold.EgressFamilies&FamilyIPv6 != 0},
		EgressMismatches: st.EgressMismatches,
		Refused:          map[string]int{messages.VerdictOpen: c.Open, messages.VerdictLeaky: c.Leaky, messages.VerdictMismatch: c.Mismatch},
		Refusals:         map[string]uint64{messages.VerdictOpen: st.RefusedOpen, messages.VerdictLeaky: st.RefusedLeaky, messages.VerdictMismatch: st.RefusedMismatch},
		Checks:           c.Checks,
		CheckWrites:      h.checksWrites,
		Reports:          maps.Clone(h.reports.outcomes),

		FeedMessages: h.feed.messages, FeedChanges: h.feed.changes, FeedBytes: h.feed.bytes,
		FeedResets: h.feed.resets, FeedHeartbeats: h.feed.heartbeats, FeedErrors: h.feed.errors,
		Pages:             maps.Clone(h.pages),
		Snapshots:         h.snap.count,
		SnapshotsTooLarge: h.snap.truncated,
		SnapshotTooLarge:  h.snap.tooLarge,
		SnapshotBytes:     h.view.snapshotSize(),
		HTTP:              maps.Clone(h.httpAnswers),
	}
	m.BanRequests, m.Bans = h.banMetrics()
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
		{prometheus.NewDesc("proxyfleet_rotation_published_total", "Versions of the rotation this process published (feed messages with changes, and resets).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Published) }},
		{prometheus.NewDesc("proxyfleet_rotation_feed_changes_total", "Changes of proxies sent on the rotation's feed.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.FeedChanges) }},
		{prometheus.NewDesc("proxyfleet_rotation_feed_bytes_total", "Bytes of the messages sent on the rotation's feed (heartbeats aside).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.FeedBytes) }},
		{prometheus.NewDesc("proxyfleet_rotation_feed_resets_total", "Messages of the rotation's feed that follow no version (a new lease, or after a failure): every consumer reads the pages again.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.FeedResets) }},
		{prometheus.NewDesc("proxyfleet_rotation_feed_heartbeats_total", "Heartbeats sent on the rotation's feed (nothing else to say for a third of the lease's TTL).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.FeedHeartbeats) }},
		{prometheus.NewDesc("proxyfleet_rotation_feed_errors_total", "Messages of the rotation's feed that could not be sent.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.FeedErrors) }},
		{prometheus.NewDesc("proxyfleet_rotation_snapshots_total", "Snapshots published on the v1 rotation subject (whole, or notices that it is too large).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.Snapshots) }},
		{prometheus.NewDesc("proxyfleet_rotation_snapshot_too_large_total", "Notices published on the v1 rotation subject instead of a snapshot too large for one message.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.SnapshotsTooLarge) }},
		{prometheus.NewDesc("proxyfleet_rotation_snapshot_too_large", "1 while the rotation does not fit in one snapshot: the v1 rotation subject carries a notice instead of the proxies.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return b2f(m.SnapshotTooLarge) }},
		{prometheus.NewDesc("proxyfleet_rotation_snapshot_bytes", "Size of the rotation's whole snapshot, in bytes.", nil, nil), prometheus.GaugeValue,
			func(m Metrics) float64 { return float64(m.SnapshotBytes) }},
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
		{prometheus.NewDesc("proxyfleet_health_egress_mismatches_total", "Passing probes whose target saw the request come from another address than the one it named, or from one not of the proxy's plan.", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.EgressMismatches) }},
		{prometheus.NewDesc("proxyfleet_probe_results_ignored_total", "Probe results that came too late to count (address changed, proxy deleted).", nil, nil), prometheus.CounterValue,
			func(m Metrics) float64 { return float64(m.ProbesIgnored) }},
	}
	descProbes     = prometheus.NewDesc("proxyfleet_probes_total", "Probes by result.", []string{"result"}, nil)
	descProbeKinds = prometheus.NewDesc("proxyfleet_probes_by_kind_total", "Probes by kind: http (a GET through the proxy), connect (CONNECT, TLS, GET), tcp (a TCP connect only).", []string{"kind"}, nil)
	descFamilies   = prometheus.NewDesc("proxyfleet_probes_by_family_total", "Probes by the family of the proxy's egress address their request named: ipv4, ipv6, none (no address named).", []string{"family"}, nil)
	descEgressTgt  = prometheus.NewDesc("proxyfleet_health_egress_target", "1 if probes name the proxies' egress addresses of the family (it has a probe target: health.target or health.probe_listen for ipv4, health.target_ipv6 or health.probe_listen_ipv6 for ipv6), 0 if that family's addresses are never checked one by one.", []string{"family"}, nil)
	descOpenChecks = prometheus.NewDesc("proxyfleet_open_checks_total", "Open checks (a probe's request sent again without credentials) by result: refused, open, inconclusive.", []string{"result"}, nil)
	descRefused    = prometheus.NewDesc("proxyfleet_health_refused", "Candidates kept out of the rotation by their checks, by verdict (open, leaky).", []string{"verdict"}, nil)
	descRefusals   = prometheus.NewDesc("proxyfleet_health_refusals_total", "Times a candidate's verdict became open or leaky.", []string{"verdict"}, nil)
	descReports    = prometheus.NewDesc("proxyfleet_health_reports_total", "Reports of proxies by consumers of the rotation, by outcome: probed (at once), limited (dropped by the per-proxy interval or the rate), stale (an old address), unknown (no such proxy being probed), invalid.", []string{"outcome"}, nil)
	descPages      = prometheus.NewDesc("proxyfleet_rotation_pages_total", "Requests for a page of the rotation, by result: served, invalid (the request refused), standby (asked of a process that no longer publishes).", []string{"result"}, nil)
	descHTTP       = prometheus.NewDesc("proxyfleet_rotation_http_total", "GET /rotation by answer: snapshot (the whole rotation; also for ?since=V when the changes since V are no longer kept), changes, not_modified.", []string{"answer"}, nil)
	descBanReqs    = prometheus.NewDesc("proxyfleet_ban_requests_total", "Requests on <prefix>.ban by result: added, removed, invalid (the request refused), failed (the bucket could not be written).", []string{"result"}, nil)
	descBans       = prometheus.NewDesc("proxyfleet_bans_total", "Bans stored, by source: rule (a gateway's rule), cli, header (a gateway's client), library.", []string{"source"}, nil)
	descReady      = prometheus.NewDesc("proxyfleet_health_ready", "1 while the health process is ready (as /readyz): caught up, publishing or standing by, its streams and buckets there.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range healthDescs {
		ch <- d.desc
	}
	ch <- descProbes
	ch <- descProbeKinds
	ch <- descFamilies
	ch <- descEgressTgt
	ch <- descOpenChecks
	ch <- descRefused
	ch <- descRefusals
	ch <- descReports
	ch <- descPages
	ch <- descHTTP
	ch <- descReady
	ch <- descBanReqs
	ch <- descBans
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
	for _, f := range familyNames {
		ch <- prometheus.MustNewConstMetric(descFamilies, prometheus.CounterValue, float64(m.ProbeFamilies[f]), f)
	}
	for _, f := range []string{familyIPv4, familyIPv6} {
		ch <- prometheus.MustNewConstMetric(descEgressTgt, prometheus.GaugeValue, b2f(m.EgressTargets[f]), f)
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
	for _, r := range pageResults {
		ch <- prometheus.MustNewConstMetric(descPages, prometheus.CounterValue, float64(m.Pages[r]), r)
	}
	for _, r := range banResults {
		ch <- prometheus.MustNewConstMetric(descBanReqs, prometheus.CounterValue, float64(m.BanRequests[r]), r)
	}
	for _, src := range bans.Sources {
		ch <- prometheus.MustNewConstMetric(descBans, prometheus.CounterValue, float64(m.Bans[src]), src)
	}
	for _, a := range httpAnswers {
		ch <- prometheus.MustNewConstMetric(descHTTP, prometheus.CounterValue, float64(m.HTTP[a]), a)
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(c.h.Ready() == nil))
	c.h.probeLatency.Collect(ch)
}
