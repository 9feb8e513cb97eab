package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Request kinds (the kind label).
const (
	kindConnect = "connect"
	kindHTTP    = "http"
	kindSocks   = "socks"
)

// Request outcomes (the outcome label of proxyfleet_gateway_requests_total).
const (
	outcomeOK             = "ok"              // a proxy carried it (whatever the target answered)
	outcomeAuth           = "auth"            // no or wrong credentials
	outcomeLimit          = "limit"           // the user's max_conns were all taken
	outcomeEmpty          = "empty"           // no proxy matched
	outcomeUpstreamFailed = "upstream_failed" // every proxy tried failed
	outcomeClientGone     = "client_gone"     // the client left before its answer
	outcomeError          = "error"           // a bad request
)

// Causes of an upstream failure (proxyfleet_gateway_upstream_failures_total).
const (
	causeRefused = "refused"
	causeTimeout = "timeout"
	causeStatus  = "status"
	causeReset   = "reset"
	causeOther   = "other"
)

// metrics are the gateway's. No label carries a proxy id or a user name.
type metrics struct {
	requests     *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	retries      *prometheus.CounterVec
	upstreamFail *prometheus.CounterVec
	reports      *prometheus.CounterVec
	inFlight     *prometheus.GaugeVec
	bytes        *prometheus.CounterVec
	connectDur   prometheus.Histogram
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_requests_total",
			Help: "Requests the gateway answered: CONNECT tunnels (connect), plain requests (http), SOCKS5 connections (socks), by outcome.",
		}, []string{"kind", "outcome"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_auth_failures_total",
			Help: "Requests refused for their credentials: missing or wrong (unknown user or wrong password).",
		}, []string{"kind", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_retries_total",
			Help: "Attempts on another proxy after one failed a request.",
		}, []string{"kind"}),
		upstreamFail: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_upstream_failures_total",
			Help: "Attempts whose proxy failed them, by cause (refused, timeout, status, reset, other).",
		}, []string{"cause"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_reports_total",
			Help: "Failed proxies reported to the rotation, by result (ok, error).",
		}, []string{"result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxyfleet_gateway_in_flight",
			Help: "Requests and tunnels being carried now, by kind.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_bytes_total",
			Help: "Bytes carried: up (client to proxy) and down (proxy to client). A tunnel's count is added when it ends.",
		}, []string{"direction"}),
		connectDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxyfleet_gateway_upstream_connect_duration_seconds",
			Help:    "Time to connect to a proxy (and, for a tunnel, its answer to CONNECT), successful attempts and failed ones alike.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.authFailures, m.retries, m.upstreamFail, m.reports, m.inFlight, m.bytes, m.connectDur} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	// Known series exist from the start (at 0), so rates and alerts see them.
	for _, k := range []string{kindConnect, kindHTTP, kindSocks} {
		for _, o := range []string{outcomeOK, outcomeAuth, outcomeLimit, outcomeEmpty, outcomeUpstreamFailed, outcomeClientGone, outcomeError} {
			m.requests.WithLabelValues(k, o)
		}
		m.retries.WithLabelValues(k)
		m.inFlight.WithLabelValues(k)
		m.authFailures.WithLabelValues(k, authMissing)
		m.authFailures.WithLabelValues(k, authWrong)
	}
	for _, c := range []string{causeRefused, causeTimeout, causeStatus, causeReset, causeOther} {
		m.upstreamFail.WithLabelValues(c)
	}
	m.reports.WithLabelValues("ok")
	m.reports.WithLabelValues("error")
	m.bytes.WithLabelValues("up")
	m.bytes.WithLabelValues("down")
	return m, nil
}
