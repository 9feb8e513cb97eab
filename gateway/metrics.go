package gateway

import (
	"strconv"

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
	outcomeThrottled      = "throttled"       // refused unchecked: too many failed credentials from its address
	outcomeLimit          = "limit"           // the user's max_conns were all taken
	outcomeEmpty          = "empty"           // no proxy matched
	outcomeUpstreamFailed = "upstream_failed" // every proxy tried failed
	outcomeClientGone     = "client_gone"     // the client left before its answer
	outcomeError          = "error"           // a bad request
	outcomeDenied         = "denied"          // the target is a destination Config.Deny refuses
	outcomeBanned         = "banned"          // every address that could carry it is banned for its site
)

// Causes of an upstream failure (proxyfleet_gateway_upstream_failures_total).
const (
	causeRefused = "refused"
	causeTimeout = "timeout"
	causeStatus  = "status"
	causeReset   = "reset"
	causeOther   = "other"
	causeLeft    = "left"   // the proxy left the rotation while the request was in flight
	causeSilent  = "silent" // the proxy's connection showed no sign of life (FirstByteTimeout)
	causeRule    = "rule"   // a rule refused the answer and asked for a retry (failovers only)
)

// metrics are the gateway's. No label carries a proxy id or a user name.
type metrics struct {
	requests     *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	retries      *prometheus.CounterVec
	failovers    *prometheus.CounterVec
	upstreamFail *prometheus.CounterVec
	reports      *prometheus.CounterVec
	inFlight     *prometheus.GaugeVec
	bytes        *prometheus.CounterVec
	connectDur   prometheus.Histogram
	idleClosed   *prometheus.CounterVec
	// refusedUnauth counts connections closed at accept: MaxUnauthenticated
	// were open already.
	refusedUnauth prometheus.Counter
	unauthGauge   prometheus.GaugeFunc
	// bans counts the bans the gateway made, by rule (its index in
	// gateway.rules; "none" for the ban header) and source.
	bans *prometheus.CounterVec
	// bannedRefused counts requests refused: every address that could
	// carry them is banned for their site.
	bannedRefused prometheus.Counter

	// The children of the vectors above, bound once: a request counts
	// without a label lookup (hashing and a lock each).
	req                  [len(kinds)][len(outcomes)]prometheus.Counter
	inFlightOf           [len(kinds)]prometheus.Gauge
	retryOf              [len(kinds)]prometheus.Counter
	bytesUp, bytesDown   prometheus.Counter
	failOf               [len(causes)]prometheus.Counter
	failoverOf           [len(causes)]prometheus.Counter
	reportOK, reportFail prometheus.Counter
	idleTunnel, idleBody prometheus.Counter
}

var (
	kinds    = [...]string{kindConnect, kindHTTP, kindSocks}
	outcomes = [...]string{outcomeOK, outcomeAuth, outcomeThrottled, outcomeLimit, outcomeEmpty, outcomeUpstreamFailed, outcomeClientGone, outcomeError, outcomeDenied, outcomeBanned}
	causes   = [...]string{causeRefused, causeTimeout, causeStatus, causeReset, causeOther, causeLeft, causeSilent, causeRule}
)

func index[T ~string](names []T, s T) int {
	for i, n := range names {
		if n == s {
			return i
		}
	}
	panic("gateway: unknown metric label " + string(s))
}

// request is the requests counter of kind and outcome.
func (m *metrics) request(kind, outcome string) prometheus.Counter {
	return m.req[index(kinds[:], kind)][index(outcomes[:], outcome)]
}

// flight is the in-flight gauge of kind.
func (m *metrics) flight(kind string) prometheus.Gauge { return m.inFlightOf[index(kinds[:], kind)] }

// retry is the retries counter of kind.
func (m *metrics) retry(kind string) prometheus.Counter {
	return m.retryOf[index(kinds[:], kind)]
}

// failover is the counter of retries after a failure of cause.
func (m *metrics) failover(cause string) prometheus.Counter {
	return m.failoverOf[index(causes[:], cause)]
}

// ruleRetry is the counter of retries a rule asked for.
func (m *metrics) ruleRetry() prometheus.Counter { return m.failover(causeRule) }

// ban is the counter of bans by rule (-1: none, a client's header) and
// source.
func (m *metrics) ban(rule int, source string) prometheus.Counter {
	r := "none"
	if rule >= 0 {
		r = strconv.Itoa(rule)
	}
	return m.bans.WithLabelValues(r, source)
}

// failure is the upstream failures counter of cause.
func (m *metrics) failure(cause string) prometheus.Counter { return m.failOf[index(causes[:], cause)] }

// newMetrics registers the gateway's metrics in r; unauth reads how
// many connections are open and not yet authenticated.
func newMetrics(r prometheus.Registerer, unauth func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_requests_total",
			Help: "Requests the gateway answered: CONNECT tunnels (connect), plain requests (http), SOCKS5 connections (socks), by outcome.",
		}, []string{"kind", "outcome"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_auth_failures_total",
			Help: "Requests refused for their credentials: missing, wrong (unknown user or wrong password), or throttled (not checked: too many failed from their source address within a minute).",
		}, []string{"kind", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_retries_total",
			Help: "Attempts on another proxy after one failed a request.",
		}, []string{"kind"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_failovers_total",
			Help: "Attempts on another proxy after one failed a request, by the cause of that failure (refused, timeout, status, reset, other, left: the proxy left the rotation, silent: no sign of life within first_byte_timeout, rule: a gateway rule refused the answer and asked for a retry).",
		}, []string{"cause"}),
		upstreamFail: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_upstream_failures_total",
			Help: "Attempts whose proxy failed them, by cause (refused, timeout, status, reset, other, left, silent).",
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
		idleClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_idle_closed_total",
			Help: "What was closed for carrying no byte for idle_timeout: a tunnel (CONNECT or SOCKS5), or a request's body being received (body).",
		}, []string{"what"}),
		refusedUnauth: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_unauthenticated_refused_total",
			Help: "Connections (HTTP and SOCKS5) closed as they were accepted: max_unauthenticated connections without a valid credential yet were open.",
		}),
		unauthGauge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "proxyfleet_gateway_unauthenticated_connections",
			Help: "Connections (HTTP and SOCKS5) open that have not yet presented a valid credential.",
		}, unauth),
		bans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_bans_total",
			Help: "Bans the gateway made: by rule (its index in gateway.rules; none: a client's X-Proxyfleet-Ban header) and source (rule, header).",
		}, []string{"rule", "source"}),
		bannedRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_gateway_ban_refused_total",
			Help: "Requests refused (503; SOCKS5 reply 2) because every address that could carry them is banned for their site.",
		}),
	}
	for _, c := range []prometheus.Collector{m.bans, m.bannedRefused, m.requests, m.authFailures, m.retries, m.failovers, m.upstreamFail, m.reports, m.inFlight, m.bytes, m.connectDur, m.idleClosed, m.refusedUnauth, m.unauthGauge} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	// Known series exist from the start (at 0), so rates and alerts see
	// them; bound once here.
	for i, k := range kinds {
		for j, o := range outcomes {
			m.req[i][j] = m.requests.WithLabelValues(k, o)
		}
		m.retryOf[i] = m.retries.WithLabelValues(k)
		m.inFlightOf[i] = m.inFlight.WithLabelValues(k)
		m.authFailures.WithLabelValues(k, authMissing)
		m.authFailures.WithLabelValues(k, authWrong)
		m.authFailures.WithLabelValues(k, authThrottled)
	}
	for i, c := range causes {
		m.failOf[i] = m.upstreamFail.WithLabelValues(c)
		m.failoverOf[i] = m.failovers.WithLabelValues(c)
	}
	m.reportOK = m.reports.WithLabelValues("ok")
	m.reportFail = m.reports.WithLabelValues("error")
	m.idleTunnel = m.idleClosed.WithLabelValues("tunnel")
	m.idleBody = m.idleClosed.WithLabelValues("body")
	m.bytesUp = m.bytes.WithLabelValues("up")
	m.bytesDown = m.bytes.WithLabelValues("down")
	return m, nil
}
