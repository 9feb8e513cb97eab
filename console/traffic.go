package console

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the gateways' scrapes (Config.GatewayInterval).
const (
	// DefaultGatewayInterval is how often each gateway's /metrics is
	// read.
	DefaultGatewayInterval = 5 * time.Second
	// gatewayTimeout bounds one read of a gateway's /metrics.
	gatewayTimeout = 3 * time.Second
	// trafficWindow is how far back the samples go: the longest rate.
	trafficWindow = 5 * time.Minute
	// maxMetricsBody bounds a gateway's /metrics read.
	maxMetricsBody = 8 << 20
)

// requestsMetric is the gateway's counter of requests by kind and
// outcome (gateway/metrics.go), the one series the console reads.
const requestsMetric = "proxyfleet_gateway_requests_total"

// outcomeOrder is the order of the gateway's outcomes on the page; an
// outcome it does not know comes after them, by name.
var outcomeOrder = []string{"ok", "auth", "throttled", "limit", "empty", "upstream_failed", "client_gone", "error", "denied", "banned"}

// trafficSample is one read of a gateway's requests by outcome (summed
// over the kinds).
type trafficSample struct {
	at time.Time
	by map[string]float64
}

// gatewayState is what the console knows of one gateway.
type gatewayState struct {
	url     string
	err     string    // of the last read; "" if it succeeded
	read    time.Time // of the last read that succeeded
	samples []trafficSample
}

// traffic reads each gateway's /metrics (Config.Gateways: their ops
// listeners) every interval, on the console's side, never the browser's,
// and keeps the samples of the last trafficWindow for the rates. Every
// round's picture is told to the live streams (changed).
type traffic struct {
	hc       *http.Client
	log      *slog.Logger
	now      func() time.Time
	interval time.Duration
	scrapes  *prometheus.CounterVec

	mu      sync.Mutex
	gws     []*gatewayState
	picture trafficPicture
	changed chan struct{}
}

func newTraffic(urls []string, interval time.Duration, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) (*traffic, error) {
	t := &traffic{
		hc:  &http.Client{Timeout: gatewayTimeout},
		log: log, now: now, interval: interval, changed: make(chan struct{}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_console_gateway_scrapes_total",
			Help: "Reads of a gateway's /metrics (console.gateways) by gateway and outcome (ok, failed: unreachable, timed out, not 200, or no proxyfleet_gateway_requests_total).",
		}, []string{"gateway", "outcome"}),
	}
	for _, u := range urls {
		t.gws = append(t.gws, &gatewayState{url: strings.TrimSuffix(u, "/")})
		t.scrapes.WithLabelValues(strings.TrimSuffix(u, "/"), "ok")
		t.scrapes.WithLabelValues(strings.TrimSuffix(u, "/"), "failed")
	}
	if reg != nil {
		if err := reg.Register(t.scrapes); err != nil {
			return nil, fmt.Errorf("console: register metrics: %w", err)
		}
	}
	t.picture = t.draw(now())
	return t, nil
}

// run reads the gateways every interval until ctx ends; with none
// configured it returns at once.
func (t *traffic) run(ctx context.Context) error {
	if len(t.gws) == 0 {
		return nil
	}
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		t.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// round reads every gateway at once and waits for them all.
func (t *traffic) round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range t.gws {
		wg.Go(func() {
			by, err := t.scrape(ctx, g.url)
			if ctx.Err() != nil {
				return
			}
			at := t.now()
			t.mu.Lock()
			defer t.mu.Unlock()
			if err != nil {
				t.scrapes.WithLabelValues(g.url, "failed").Inc()
				if g.err == "" {
					t.log.Warn("console: read a gateway's metrics", "gateway", g.url, "err", err)
				}
				g.err = err.Error()
				return
			}
			t.scrapes.WithLabelValues(g.url, "ok").Inc()
			g.err, g.read = "", at
			g.samples = append(g.samples, trafficSample{at: at, by: by})
			i := 0
			// Keep one sample at or before the window's start: the base
			// of the longest rate.
			for i+1 < len(g.samples) && !g.samples[i+1].at.After(at.Add(-trafficWindow)) {
				i++
			}
			g.samples = slices.Delete(g.samples, 0, i)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	t.picture = t.draw(t.now())
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

func (t *traffic) scrape(ctx context.Context, base string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, gatewayTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := t.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get %s/metrics: %s", base, resp.Status)
	}
	by, err := parseRequests(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", base, err)
	}
	return by, nil
}

var errNoRequests = errors.New("no " + requestsMetric + ": not a gateway's metrics")

// parseRequests reads Prometheus' text format and returns the gateway's
// requests by outcome, summed over the kinds. The other series are
// skipped; a body without the requests' series is errNoRequests.
func parseRequests(r io.Reader) (map[string]float64, error) {
	by := map[string]float64{}
	found := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, requestsMetric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "}")
		if !ok {
			return nil, fmt.Errorf("%q: no end of its labels", line)
		}
		outcome, ok := labelValue(labels, "outcome")
		if !ok {
			return nil, fmt.Errorf("%q: no outcome label", line)
		}
		fields := strings.Fields(value) // the value, then maybe a timestamp
		if len(fields) == 0 {
			return nil, fmt.Errorf("%q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		by[outcome] += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, errNoRequests
	}
	return by, nil
}

// labelValue is the value of label name in a series' labels
// (`a="x",b="y"`); the gateway's label values hold no quote or comma.
func labelValue(labels, name string) (string, bool) {
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && k == name {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}

// trafficRow is one gateway's line of the traffic page (or the sum's):
// its requests by outcome since it started, in all, and per second over
// the last minute and the last five ("-" while unknown).
type trafficRow struct {
	Gateway string   `json:"gateway"`
	Error   string   `json:"error,omitempty"`
	Read    string   `json:"read"` // the age of its last good read
	Counts  []uint64 `json:"counts"`
	Total   uint64   `json:"total"`
	Rate1m  string   `json:"rate_1m"`
	Rate5m  string   `json:"rate_5m"`
}

// trafficPicture is the traffic page's table; its JSON is the live
// stream's "traffic" event.
type trafficPicture struct {
	Outcomes []string     `json:"outcomes"`
	Rows     []trafficRow `json:"rows"`
	Sum      trafficRow   `json:"sum"`
	None     bool         `json:"none"` // no gateway is configured
}

// draw makes the picture of the samples at now; with t.mu held.
func (t *traffic) draw(now time.Time) trafficPicture {
	p := trafficPicture{None: len(t.gws) == 0}
	seen := map[string]bool{}
	for _, g := range t.gws {
		if n := len(g.samples); n > 0 {
			for o := range g.samples[n-1].by {
				seen[o] = true
			}
		}
	}
	for _, o := range outcomeOrder {
		if seen[o] {
			p.Outcomes = append(p.Outcomes, o)
			delete(seen, o)
		}
	}
	var rest []string
	for o := range seen {
		rest = append(rest, o)
	}
	slices.Sort(rest)
	p.Outcomes = append(p.Outcomes, rest...)

	p.Sum = trafficRow{Gateway: "all", Counts: make([]uint64, len(p.Outcomes))}
	var sum1, sum5 float64
	known1, known5 := false, false
	for _, g := range t.gws {
		row := trafficRow{Gateway: g.url, Error: g.err, Read: "-", Counts: make([]uint64, len(p.Outcomes)), Rate1m: "-", Rate5m: "-"}
		if n := len(g.samples); n > 0 {
			last := g.samples[n-1]
			row.Read = ageOf(now, g.read)
			for i, o := range p.Outcomes {
				row.Counts[i] = uint64(last.by[o])
				row.Total += row.Counts[i]
				p.Sum.Counts[i] += row.Counts[i]
			}
			p.Sum.Total += row.Total
			if r, ok := rate(g.samples, time.Minute); ok {
				row.Rate1m, sum1, known1 = formatRate(r), sum1+r, true
			}
			if r, ok := rate(g.samples, trafficWindow); ok {
				row.Rate5m, sum5, known5 = formatRate(r), sum5+r, true
			}
		}
		p.Rows = append(p.Rows, row)
	}
	p.Sum.Rate1m, p.Sum.Rate5m, p.Sum.Read = "-", "-", ""
	if known1 {
		p.Sum.Rate1m = formatRate(sum1)
	}
	if known5 {
		p.Sum.Rate5m = formatRate(sum5)
	}
	return p
}

// rate is the requests per second (all outcomes) over the last window of
// samples, up to the newest: the sum of the increases between
// consecutive samples (a decrease is a restarted gateway: its new count
// is the increase) over the time they span. It needs two samples.
func rate(samples []trafficSample, window time.Duration) (float64, bool) {
	n := len(samples)
	if n < 2 {
		return 0, false
	}
	end := samples[n-1].at
	i := n - 1
	for i > 0 && end.Sub(samples[i-1].at) <= window {
		i--
	}
	if i == n-1 { // the one before the newest is already older than window
		i = n - 2
	}
	var inc float64
	for k := i + 1; k < n; k++ {
		d := total(samples[k].by) - total(samples[k-1].by)
		if d < 0 {
			d = total(samples[k].by)
		}
		inc += d
	}
	secs := end.Sub(samples[i].at).Seconds()
	if secs <= 0 {
		return 0, false
	}
	return inc / secs, true
}

func total(by map[string]float64) float64 {
	var s float64
	for _, v := range by {
		s += v
	}
	return s
}

func formatRate(r float64) string { return strconv.FormatFloat(r, 'f', 2, 64) + "/s" }

// ageOf is how long ago t was, to the second.
func ageOf(now, t time.Time) string { return now.Sub(t).Truncate(time.Second).String() + " ago" }

// current is the picture now and a channel closed at the next one.
func (t *traffic) current() (trafficPicture, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.picture, t.changed
}
