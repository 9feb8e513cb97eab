package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// The gateway, with its default timeouts, in front of two real proxies
// (Debian guests running squid), with kept-alive connections open to
// both on both of its HTTP paths: a session's proxy's domain destroyed
// out of band costs no request that starts after it, and none takes
// more than 10 s (the gateway sees the dead proxy's silence within
// first_byte_timeout, or fails its connect within connect_timeout, and
// goes to the other); the session moves to the survivor.
func TestGatewayFailoverOnDestroyedProxy(t *testing.T) {
	t.Parallel()
	// The gateway's timeouts are its defaults.
	ids := []string{"fo-a", "fo-b"}
	_, _, gwAddr, gwHTTP := gatewayRig(t, "th-failover", nil, ids...)
	targetURL, token := target(t, rootIP())

	// Clients that keep their connections to the gateway alive (so the
	// gateway keeps its own to the proxies alive), as alice with a
	// session and without. A padded head (over 8 KiB) takes net/http's
	// path in the gateway, with its own pool of connections to proxies.
	// The client's timeout is only a hang bound.
	newClient := func(user string) *http.Client {
		pu := &url.URL{Scheme: "http", Host: gwAddr, User: url.UserPassword(user, "alice-gateway-secret")}
		tr := &http.Transport{Proxy: http.ProxyURL(pu), MaxIdleConnsPerHost: 16}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 60 * time.Second}
	}
	session, plain := newClient("alice-session-s1"), newClient("alice")
	type result struct {
		proxy string
		took  time.Duration
		err   error
	}
	get := func(c *http.Client, padded bool) result {
		start := time.Now()
		req, err := http.NewRequest(http.MethodGet, targetURL, nil)
		if err != nil {
			return result{err: err}
		}
		if padded {
			req.Header.Set("X-Pad", strings.Repeat("p", 9<<10))
		}
		resp, err := c.Do(req)
		if err != nil {
			return result{took: time.Since(start), err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		r := result{proxy: resp.Header.Get("X-Proxyfleet-Proxy"), took: time.Since(start), err: err}
		if err == nil && (resp.StatusCode != http.StatusOK || string(b) != token) {
			r.err = fmt.Errorf("%d %q via %q", resp.StatusCode, b, r.proxy)
		}
		return r
	}
	// burst sends n requests at once on each client and path, and
	// returns their results.
	burst := func(n int) []result {
		var mu sync.Mutex
		var out []result
		var wg sync.WaitGroup
		for _, c := range []*http.Client{session, plain} {
			for _, padded := range []bool{false, true} {
				for range n {
					wg.Go(func() {
						r := get(c, padded)
						mu.Lock()
						out = append(out, r)
						mu.Unlock()
					})
				}
			}
		}
		wg.Wait()
		return out
	}
	waitUntil(t, "the gateway to use both proxies", time.Minute, func() bool {
		seen := map[string]bool{}
		for _, r := range burst(2) {
			if r.err == nil {
				seen[r.proxy] = true
			}
		}
		return seen[ids[0]] && seen[ids[1]]
	})
	// Kept-alive connections to both proxies, on both paths, and the
	// session's proxy.
	var victim string
	for _, r := range burst(8) {
		if r.err != nil {
			t.Fatalf("before the destroy: %v", r.err)
		}
	}
	if r := get(session, false); r.err != nil {
		t.Fatal(r.err)
	} else {
		victim = r.proxy
	}
	survivor := ids[0]
	if survivor == victim {
		survivor = ids[1]
	}

	virsh(t, "destroy", "pf-"+victim)
	killed := time.Now()
	var failures []string
	var slowest time.Duration
	for round := range 3 {
		for _, r := range burst(8) {
			slowest = max(slowest, r.took)
			switch {
			case r.err != nil:
				failures = append(failures, fmt.Sprintf("round %d (%s after the destroy): failed after %s: %v", round, time.Since(killed).Round(time.Millisecond), r.took.Round(time.Millisecond), r.err))
			case r.took > 10*time.Second:
				failures = append(failures, fmt.Sprintf("round %d: took %s (via %s)", round, r.took.Round(time.Millisecond), r.proxy))
			}
		}
	}
	if len(failures) > 0 {
		t.Fatalf("requests started after %s's domain was destroyed:\n%s", victim, strings.Join(failures, "\n"))
	}
	if r := get(session, false); r.err != nil || r.proxy != survivor {
		t.Fatalf("session s1 after its proxy died: %q %v, want moved to %s", r.proxy, r.err, survivor)
	}
	mfs := scrape(t, gwHTTP)
	if n := value(mfs, "proxyfleet_gateway_failovers_total"); n < 1 {
		t.Errorf("proxyfleet_gateway_failovers_total = %v, want the requests that left %s", n, victim)
	}
	t.Logf("slowest request after the destroy: %s; failovers: silent %v, left %v, refused %v, timeout %v", slowest.Round(time.Millisecond), value(mfs, "proxyfleet_gateway_failovers_total", "cause", "silent"),
		value(mfs, "proxyfleet_gateway_failovers_total", "cause", "left"), value(mfs, "proxyfleet_gateway_failovers_total", "cause", "refused"),
		value(mfs, "proxyfleet_gateway_failovers_total", "cause", "timeout"))
}
