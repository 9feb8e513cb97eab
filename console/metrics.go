package console

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the console's own: requests by page and status class,
// logins by outcome, sessions held, actions by kind and outcome.
type metrics struct {
	requests *prometheus.CounterVec
	logins   *prometheus.CounterVec
	actions  *prometheus.CounterVec
	streams  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, sessions func() int) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxyfleet_console_requests_total", Help: "Requests the console answered, by page and status class (2xx, 3xx, 4xx, 5xx)."}, []string{"page", "code"}),
		logins:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxyfleet_console_logins_total", Help: "Logins to the console by outcome (ok, refused, throttled: refused unchecked after too many failures from its source)."}, []string{"outcome"}),
		actions:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxyfleet_console_actions_total", Help: "Actions asked of the console by kind and outcome (sent, failed, forbidden, bad_csrf, invalid)."}, []string{"action", "outcome"}),
		streams:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxyfleet_console_live_streams", Help: "Live streams (server-sent events) the console serves now."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.logins, m.actions, m.streams,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "proxyfleet_console_sessions", Help: "Console sessions held now (logged in, not expired)."},
			func() float64 { return float64(sessions()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("console: register metrics: %w", err)
		}
	}
	return m, nil
}
