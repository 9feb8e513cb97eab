package health

import (
	"strings"
	"testing"
	"time"
)

func TestWriteMetricsFormat(t *testing.T) {
	s := newProbeStats()
	s.add(ResultOK, 3*time.Millisecond)
	s.add(ResultTimeout, 2*time.Second)
	m := Metrics{RotationSize: 2, Holder: true, Probing: true, Probes: s.results, ProbeLatency: make([]uint64, len(s.buckets)), ProbeLatencySum: s.sum, ProbeLatencyCount: s.count}
	var cum uint64
	for i, n := range s.buckets {
		cum += n
		m.ProbeLatency[i] = cum
	}
	var b strings.Builder
	writeMetrics(&b, m)
	out := b.String()
	for _, line := range []string{
		"proxyfleet_rotation_size 2",
		"proxyfleet_health_lease_holder 1",
		`proxyfleet_probes_total{result="ok"} 1`,
		`proxyfleet_probes_total{result="timeout"} 1`,
		`proxyfleet_probes_total{result="panic"} 0`,
		`proxyfleet_probe_duration_seconds_bucket{le="0.005"} 1`,
		`proxyfleet_probe_duration_seconds_bucket{le="2.5"} 2`,
		`proxyfleet_probe_duration_seconds_bucket{le="+Inf"} 2`,
		"proxyfleet_probe_duration_seconds_sum 2.003",
		"proxyfleet_probe_duration_seconds_count 2",
		"# TYPE proxyfleet_probe_duration_seconds histogram",
	} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, out)
		}
	}
}
