package health

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
)

// Handler serves:
//
//	GET /rotation  the current snapshot (messages.Rotation JSON); 503 until caught up
//	GET /healthz   200 "ok" once caught up and publishing; 503 and the reason if not
//	GET /metrics   Prometheus text format
//	GET /probe     the probe target: ?nonce=N answers N (see ProbeHandler)
//
// /rotation is this process's own fold; on a standby it is what it would
// publish, and its version is the last one it knows to be published.
// The header X-Proxyfleet-Lease says "holder" or "standby".
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rotation", h.serveRotation)
	mux.HandleFunc("GET /healthz", h.serveHealthz)
	mux.HandleFunc("GET /metrics", h.serveMetrics)
	mux.Handle("GET "+ProbePath, ProbeHandler())
	return mux
}

func (h *Health) role() string {
	if h.Holder() {
		return "holder"
	}
	return "standby"
}

func (h *Health) serveRotation(w http.ResponseWriter, _ *http.Request) {
	snap, ok := h.Rotation()
	if !ok {
		// A partial picture would look like proxies leaving.
		http.Error(w, "catching up", http.StatusServiceUnavailable)
		return
	}
	body, err := json.Marshal(snap)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Proxyfleet-Lease", h.role())
	w.Write(append(body, '\n'))
}

func (h *Health) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	if err := h.Ready(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Proxyfleet-Lease", h.role())
	io.WriteString(w, "ok\n")
}

func (h *Health) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	m := h.Metrics()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(w, m)
}

// writeMetrics writes m in the Prometheus text exposition format.
func writeMetrics(w io.Writer, m Metrics) {
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	for _, x := range []struct {
		name, typ, help string
		value           any
	}{
		{"proxyfleet_rotation_size", "gauge", "Proxies in the rotation.", m.RotationSize},
		{"proxyfleet_rotation_in_grace", "gauge", "Proxies in the rotation kept on grace after reporting provisioning.", m.InGrace},
		{"proxyfleet_rotation_version", "gauge", "Version of the last rotation snapshot known to be published.", m.RotationVersion},
		{"proxyfleet_rotation_changes_total", "counter", "Changes of the rotation folded from events, probes and grace expiries.", m.Changes},
		{"proxyfleet_rotation_entries_total", "counter", "Proxies that entered the rotation (those loaded at start included).", m.Entries},
		{"proxyfleet_rotation_exits_total", "counter", "Proxies that left the rotation.", m.Exits},
		{"proxyfleet_events_total", "counter", "State events received.", m.Events},
		{"proxyfleet_events_ignored_total", "counter", "State events ignored: stale, duplicate or not understood.", m.Ignored},
		{"proxyfleet_rotation_published_total", "counter", "Snapshots this process published.", m.Published},
		{"proxyfleet_rotation_publish_errors_total", "counter", "Failed attempts to publish the rotation.", m.PublishErrors},
		{"proxyfleet_health_caught_up", "gauge", "1 once the initial events are folded.", b2i(m.CaughtUp)},
		{"proxyfleet_health_lease_holder", "gauge", "1 while this process holds the lease and publishes.", b2i(m.Holder)},
		{"proxyfleet_health_lease_takeovers_total", "counter", "Times this process took the lease.", m.Takeovers},
		{"proxyfleet_health_consumer_repairs_total", "counter", "Consumers of PROXY_EVENTS made anew: the last one was deleted, lost events, or its stream was created anew.", m.ConsumerRepairs},
		{"proxyfleet_health_topology_missing", "gauge", "Streams and buckets this process needs that were gone at its last look.", m.Missing},
		{"proxyfleet_health_probing", "gauge", "1 if proxies are probed, 0 if the rotation follows events only.", b2i(m.Probing)},
		{"proxyfleet_probe_targets", "gauge", "Proxies being probed.", m.Targets},
		{"proxyfleet_probe_results_ignored_total", "counter", "Probe results that came too late to count (address changed, proxy deleted).", m.ProbesIgnored},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", x.name, x.help, x.name, x.typ, x.name, x.value)
	}
	fmt.Fprintf(w, "# HELP proxyfleet_probes_total Probes by result.\n# TYPE proxyfleet_probes_total counter\n")
	results := make([]string, 0, len(m.Probes))
	for k := range m.Probes {
		results = append(results, k)
	}
	sort.Strings(results)
	for _, k := range results {
		fmt.Fprintf(w, "proxyfleet_probes_total{result=%q} %d\n", k, m.Probes[k])
	}
	const hist = "proxyfleet_probe_duration_seconds"
	fmt.Fprintf(w, "# HELP %s Probe durations.\n# TYPE %s histogram\n", hist, hist)
	if len(m.ProbeLatency) == len(ProbeBuckets)+1 {
		for i, b := range ProbeBuckets {
			fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", hist, strconv.FormatFloat(b.Seconds(), 'g', -1, 64), m.ProbeLatency[i])
		}
		fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", hist, m.ProbeLatency[len(ProbeBuckets)])
	}
	fmt.Fprintf(w, "%s_sum %s\n%s_count %d\n", hist, strconv.FormatFloat(m.ProbeLatencySum.Seconds(), 'g', -1, 64), hist, m.ProbeLatencyCount)
}
