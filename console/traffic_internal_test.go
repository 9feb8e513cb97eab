package console

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gatewayLike is a registry with the gateway's requests counter (its
// name, labels and help) and another series, as a gateway's /metrics.
func gatewayLike(t *testing.T) (*prometheus.Registry, *prometheus.CounterVec) {
	t.Helper()
	reg := prometheus.NewRegistry()
	req := prometheus.NewCounterVec(prometheus.CounterOpts{Name: requestsMetric, Help: "Requests the gateway answered."}, []string{"kind", "outcome"})
	other := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxyfleet_gateway_retries_total", Help: "x"}, []string{"kind"})
	reg.MustRegister(req, other)
	req.WithLabelValues("http", "ok").Add(5)
	req.WithLabelValues("connect", "ok").Add(2)
	req.WithLabelValues("socks", "auth").Add(3)
	req.WithLabelValues("http", "denied")
	other.WithLabelValues("http").Add(100)
	return reg, req
}

func TestParseRequestsSumsTheKinds(t *testing.T) {
	reg, _ := gatewayLike(t)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	by, err := parseRequests(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(by) != 3 || by["ok"] != 7 || by["auth"] != 3 || by["denied"] != 0 {
		t.Fatalf("by outcome: %v, want ok 7, auth 3, denied 0", by)
	}
}

func TestParseRequestsRefuses(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"# HELP x y\nx 1\n", "no " + requestsMetric},
		{requestsMetric + `{kind="http",outcome="ok"} many` + "\n", "invalid syntax"},
		{requestsMetric + `{kind="http"} 1` + "\n", "no outcome label"},
		{requestsMetric + `{kind="http",outcome="ok" 1` + "\n", "no end of its labels"},
	} {
		_, err := parseRequests(strings.NewReader(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.body, err, tc.want)
		}
	}
	_, err := parseRequests(strings.NewReader(""))
	if !errors.Is(err, errNoRequests) {
		t.Errorf("an empty body: %v", err)
	}
	// A timestamp after the value is allowed.
	by, err := parseRequests(strings.NewReader(requestsMetric + `{kind="http",outcome="ok"} 4 1700000000000` + "\n"))
	if err != nil || by["ok"] != 4 {
		t.Errorf("with a timestamp: %v %v", by, err)
	}
}

func TestRateCountsARestartAsItsNewCount(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	s := func(sec int, n float64) trafficSample {
		return trafficSample{at: t0.Add(time.Duration(sec) * time.Second), by: map[string]float64{"ok": n}}
	}
	if _, ok := rate([]trafficSample{s(0, 1)}, time.Minute); ok {
		t.Fatal("a rate from one sample")
	}
	// 0..300s every 60s: 0, 60, 120, then a restart to 30, then 90.
	samples := []trafficSample{s(0, 0), s(60, 60), s(120, 120), s(180, 30), s(240, 90), s(300, 150)}
	if r, ok := rate(samples, time.Minute); !ok || r != 1 {
		t.Errorf("over a minute: %v %v, want 1/s", r, ok)
	}
	// 60 + 60 + 30 (the restart's new count) + 60 + 60 over 300s.
	if r, ok := rate(samples, 5*time.Minute); !ok || r != 0.9 {
		t.Errorf("over five minutes: %v %v, want 0.9/s", r, ok)
	}
}

// A round reads every gateway: one answers, one refuses the connection,
// one is not a gateway; the picture shows each one's counts or error,
// their sum, and the failed reads are counted.
func TestTrafficRound(t *testing.T) {
	reg, req := gatewayLike(t)
	gw := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer gw.Close()
	notGW := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("# nothing\n")) }))
	defer notGW.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	clk := &fakeClock{t: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	creg := prometheus.NewRegistry()
	tr, err := newTraffic([]string{gw.URL + "/", closed, notGW.URL}, time.Second, quietLogger(), clk.now, creg)
	if err != nil {
		t.Fatal(err)
	}
	p, changed := tr.current()
	if len(p.Rows) != 3 || p.Sum.Total != 0 {
		t.Fatalf("before a read: %+v", p)
	}
	tr.round(context.Background())
	select {
	case <-changed:
	default:
		t.Fatal("a round told no stream")
	}
	clk.t = clk.t.Add(30 * time.Second)
	req.WithLabelValues("http", "ok").Add(30)
	tr.round(context.Background())
	p, _ = tr.current()
	if strings.Join(p.Outcomes, ",") != "ok,auth,denied" {
		t.Fatalf("outcomes %v", p.Outcomes)
	}
	ok := p.Rows[0]
	if ok.Gateway != gw.URL || ok.Error != "" || ok.Counts[0] != 37 || ok.Counts[1] != 3 || ok.Total != 40 || ok.Rate1m != "1.00/s" {
		t.Errorf("the gateway's row: %+v", ok)
	}
	if p.Rows[1].Error == "" || p.Rows[1].Total != 0 || p.Rows[1].Rate1m != "-" {
		t.Errorf("the closed port's row: %+v", p.Rows[1])
	}
	if !strings.Contains(p.Rows[2].Error, "no "+requestsMetric) {
		t.Errorf("the non-gateway's row: %+v", p.Rows[2])
	}
	if p.Sum.Total != 40 || p.Sum.Counts[0] != 37 || p.Sum.Rate1m != "1.00/s" {
		t.Errorf("the sum: %+v", p.Sum)
	}
	if n := testutil.ToFloat64(tr.scrapes.WithLabelValues(closed, "failed")); n != 2 {
		t.Errorf("failed reads of the closed port: %v, want 2", n)
	}
	if n := testutil.ToFloat64(tr.scrapes.WithLabelValues(gw.URL, "ok")); n != 2 {
		t.Errorf("good reads of the gateway: %v, want 2", n)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
