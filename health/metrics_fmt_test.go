package health

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The collector exports the counters and the probe histogram in the text
// format Prometheus parses.
func TestMetricsFormat(t *testing.T) {
	h := &Health{fold: NewFold(0, time.Now), probeStats: newProbeStats(), probeLatency: newProbeLatency(), holder: true, view: newView()}
	h.cfg.Prober = ProberFunc(nil)
	h.prober = h.cfg.Prober
	for _, p := range []struct {
		r string
		d time.Duration
	}{{ResultOK, 3 * time.Millisecond}, {ResultTimeout, 2 * time.Second}} {
		h.probeStats.add(p.r)
		h.probeLatency.Observe(p.d.Seconds())
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(collector{h}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	out := b.String()
	for _, line := range []string{
		"proxyfleet_rotation_size 0",
		"proxyfleet_health_lease_holder 1",
		"proxyfleet_health_probing 1",
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
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(out)); err != nil {
		t.Fatalf("parse: %v", err)
	}
}
