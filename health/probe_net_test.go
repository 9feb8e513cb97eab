package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"proxyfleet/health"
)

// The HTTP prober goes through a real forward proxy to a real target and
// checks the nonce it sent comes back.
func TestHTTPProberThroughAProxy(t *testing.T) {
	target := httptest.NewServer(health.ProbeHandler())
	defer target.Close()
	proxy := startProxy(t)
	p, err := health.NewHTTPProber(target.URL+health.ProbePath, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	probe := func(addr string) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return p.Probe(ctx, addr)
	}
	if err := probe(proxy.addr); err != nil {
		t.Fatalf("probe through a working proxy: %v", err)
	}
	if proxy.requests.Load() != 1 {
		t.Fatalf("the proxy forwarded %d requests, want 1", proxy.requests.Load())
	}

	// A proxy answering its own page (a captive portal) fails: the body
	// lacks the nonce.
	proxy.captive = "welcome to the hotel wifi"
	var pe *health.ProbeError
	if err := probe(proxy.addr); !errors.As(err, &pe) || pe.Result != health.ResultBody {
		t.Fatalf("probe through a captive proxy: %v, want a body error", err)
	}
	proxy.captive = ""

	// A proxy whose target answers something else fails on the status.
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	p404, _ := health.NewHTTPProber(notFound.URL+"/probe", "")
	if err := p404.Probe(ctx, proxy.addr); !errors.As(err, &pe) || pe.Result != health.ResultStatus {
		t.Fatalf("probe of a 404 target: %v, want a status error", err)
	}

	// A proxy that is down fails.
	proxy.stop()
	if err := probe(proxy.addr); err == nil {
		t.Fatal("probe through a stopped proxy passed")
	}

	// A proxy that accepts and never answers fails by the probe's deadline,
	// not a bare TCP connect: a listener that accepts is not a proxy.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = p.Probe(sctx, ln.Addr().String())
	cancel()
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("probe of a silent listener: %v after %v", err, time.Since(start))
	}

	// An expected value instead of the nonce.
	pe2, _ := health.NewHTTPProber(target.URL+health.ProbePath, "not-there")
	proxy.restart()
	if err := pe2.Probe(ctx, proxy.addr); !errors.As(err, &pe) || pe.Result != health.ResultBody {
		t.Fatalf("probe expecting another value: %v", err)
	}
}

func TestNewHTTPProberChecksTheTarget(t *testing.T) {
	for _, bad := range []string{"", "ftp://x/", "http://", "not a url", "198.18.0.1:80"} {
		if _, err := health.NewHTTPProber(bad, ""); err == nil {
			t.Errorf("NewHTTPProber(%q) accepted", bad)
		}
	}
}

// /probe answers the nonce alone on its first line, then one line of JSON
// that reports the request: the address it came from and its headers
// (credentials redacted), bounded.
func TestProbeHandler(t *testing.T) {
	s := httptest.NewServer(health.ProbeHandler())
	defer s.Close()
	for q, want := range map[string]int{"?nonce=abc-_1": 200, "": 400, "?nonce=" + strings.Repeat("a", 129): 400, "?nonce=a%20b": 400} {
		code, body := get(t, s.URL+health.ProbePath+q)
		if code != want {
			t.Errorf("GET /probe%s = %d %q", q, code, body)
		}
		if code != 200 {
			continue
		}
		first, rest, _ := strings.Cut(body, "\n")
		if first != "abc-_1" || !strings.HasPrefix(rest, `{"v":1,"egress":"127.0.0.1","headers":[`) || !strings.HasSuffix(rest, "]}\n") ||
			strings.Count(rest, "\n") != 1 {
			t.Errorf("GET /probe%s = %q", q, body)
		}
	}

	req, _ := http.NewRequest(http.MethodGet, s.URL+health.ProbePath+"?nonce=n1", nil)
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0OnNlY3JldA==")
	req.Header.Set("X-Forwarded-For", "192.0.2.1")
	for i := range 100 {
		req.Header.Add(fmt.Sprintf("X-Pad-%03d", i), strings.Repeat("x", 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, line, _ := strings.Cut(string(b), "\n")
	var rep struct {
		V         int        `json:"v"`
		Egress    string     `json:"egress"`
		Headers   [][]string `json:"headers"`
		Truncated bool       `json:"truncated"`
	}
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("report %q: %v", line, err)
	}
	if len(rep.Headers) != 64 || !rep.Truncated || strings.Contains(string(b), "c2VjcmV0") {
		t.Fatalf("report of %d headers, truncated %v: %s", len(rep.Headers), rep.Truncated, b)
	}
	var sawAuth bool
	for _, h := range rep.Headers {
		if h[0] == "Proxy-Authorization" {
			sawAuth = h[1] == "redacted"
		}
	}
	if !sawAuth {
		t.Fatalf("no redacted Proxy-Authorization in %v", rep.Headers)
	}
}

// The request a probe sends through the proxy is a forward-proxy GET of
// the target with its own query kept, a fresh nonce in place of any the
// target had, and the headers that keep caches out of it.
func TestHTTPProberRequest(t *testing.T) {
	got := make(chan *http.Request, 2)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		health.ProbeHandler().ServeHTTP(w, r)
	}))
	defer target.Close()
	proxy := startProxy(t)
	p, err := health.NewHTTPProber(target.URL+health.ProbePath+"?zone=a%20b&nonce=stale", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		if err := p.Probe(ctx, proxy.addr); err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	r1, r2 := <-got, <-got
	for _, r := range []*http.Request{r1, r2} {
		q := r.URL.Query()
		if r.Method != http.MethodGet || r.URL.Path != health.ProbePath || q.Get("zone") != "a b" || len(q[health.NonceParam]) != 1 ||
			len(q.Get(health.NonceParam)) != 32 || r.Header.Get("Cache-Control") != "no-cache" || r.Header.Get("User-Agent") != "proxyfleet-health" {
			t.Fatalf("the target got %s %s %v", r.Method, r.URL, r.Header)
		}
	}
	if r1.URL.Query().Get(health.NonceParam) == r2.URL.Query().Get(health.NonceParam) {
		t.Fatal("two probes sent the same nonce")
	}
}
