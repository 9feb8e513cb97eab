package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"golang.org/x/net/proxy"

	"proxyfleet/gateway/defaults"
	"proxyfleet/internal/poll"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fleet is n working upstreams and a picker over them.
func fleet(t *testing.T, n int) ([]*upstream, *fakePicker) {
	var ups []*upstream
	var ps []Proxy
	for i := range n {
		id := "p" + string(rune('1'+i))
		u := newUpstream(t, id, "")
		ups = append(ups, u)
		ps = append(ps, Proxy{ID: id, Addr: u.addr()})
	}
	return ups, newPicker(ps...)
}

func requests(g *testGateway, kind, outcome string) float64 {
	return testutil.ToFloat64(g.m.requests.WithLabelValues(kind, outcome))
}

func TestAuthHTTP(t *testing.T) {
	_, pk := fleet(t, 1)
	// More wrong credentials than the default throttle allows: this is
	// about each answer (TestAuthThrottle about the throttle).
	g := startGateway(t, pk, func(c *Config) { c.AuthFailures = 100 })
	tg := newTarget(t, false)

	for _, c := range []struct {
		name, user, pw string
		want           int
	}{
		{"none", "", "", http.StatusProxyAuthRequired},
		{"wrong password", "alice", "nope", http.StatusProxyAuthRequired},
		{"unknown user", "mallory", alicePass, http.StatusProxyAuthRequired},
		{"another's password", "alice", bobPass, http.StatusProxyAuthRequired},
		{"right", "alice", alicePass, http.StatusOK},
	} {
		t.Run("plain/"+c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, tg.srv.URL, nil)
			resp, err := g.client(t, c.user, c.pw).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
			if c.want == http.StatusProxyAuthRequired && resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxyfleet"` {
				t.Fatalf("Proxy-Authenticate %q", resp.Header.Get("Proxy-Authenticate"))
			}
		})
		t.Run("connect/"+c.name, func(t *testing.T) {
			auth := ""
			if c.user != "" {
				auth = basic(c.user, c.pw)
			}
			resp, _, _ := g.connect(t, tg.srv.Listener.Addr().String(), auth, nil)
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.want)
			}
			if c.want == http.StatusProxyAuthRequired && resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxyfleet"` {
				t.Fatalf("Proxy-Authenticate %q", resp.Header.Get("Proxy-Authenticate"))
			}
		})
	}
	if got := requests(g, kindHTTP, outcomeAuth); got != 4 {
		t.Errorf("plain auth failures counted %v, want 4", got)
	}
	if got := requests(g, kindConnect, outcomeAuth); got != 4 {
		t.Errorf("CONNECT auth failures counted %v, want 4", got)
	}
	if got := testutil.ToFloat64(g.m.authFailures.WithLabelValues(kindConnect, authMissing)); got != 1 {
		t.Errorf("CONNECT missing credentials counted %v, want 1", got)
	}
}

func socksDial(t *testing.T, g *testGateway, auth *proxy.Auth, target string) (net.Conn, error) {
	t.Helper()
	d, err := proxy.SOCKS5("tcp", g.SocksAddr(), auth, &net.Dialer{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d.(proxy.ContextDialer).DialContext(context.Background(), "tcp", target)
}

func TestAuthSocks(t *testing.T) {
	ups, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	addr := tg.srv.Listener.Addr().String()

	for _, c := range []struct {
		name string
		auth *proxy.Auth
	}{
		{"none", nil},
		{"wrong", &proxy.Auth{User: "alice", Password: "nope"}},
		{"unknown", &proxy.Auth{User: "mallory", Password: alicePass}},
	} {
		if conn, err := socksDial(t, g, c.auth, addr); err == nil {
			conn.Close()
			t.Errorf("%s: SOCKS5 connected without the right credentials", c.name)
		}
	}
	if got := requests(g, kindSocks, outcomeAuth); got != 3 {
		t.Errorf("SOCKS5 auth failures counted %v, want 3", got)
	}
	if ups[0].count() != 0 {
		t.Fatalf("the upstream was used by an unauthenticated client")
	}

	// Right: a real HTTP request through the tunnel.
	d, _ := proxy.SOCKS5("tcp", g.SocksAddr(), &proxy.Auth{User: "alice", Password: alicePass}, proxy.Direct)
	tr := &http.Transport{DialContext: d.(proxy.ContextDialer).DialContext}
	defer tr.CloseIdleConnections()
	status, _, body := get(t, &http.Client{Transport: tr}, tg.srv.URL, nil)
	if status != 200 || body != "hello from target" {
		t.Fatalf("through SOCKS5: %d %q", status, body)
	}
	if ups[0].count() != 1 {
		t.Fatalf("upstream carried %d, want 1", ups[0].count())
	}
	// A domain target (ATYP 3) too.
	_, port, _ := net.SplitHostPort(addr)
	status, _, _ = get(t, &http.Client{Transport: tr}, "http://localhost:"+port+"/", nil)
	if status != 200 {
		t.Fatalf("domain target: %d", status)
	}
}

func TestUserLimit(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, func(c *Config) { c.Users[0].MaxConns = 1 })
	tg := newTarget(t, false)
	addr := tg.srv.Listener.Addr().String()

	resp, c, _ := g.connect(t, addr, basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("first tunnel: %d", resp.StatusCode)
	}
	resp2, _, _ := g.connect(t, addr, basic("alice", alicePass), nil)
	if resp2.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second tunnel over the limit: %d, want 429", resp2.StatusCode)
	}
	if status, _, _ := get(t, g.client(t, "alice", alicePass), tg.srv.URL, nil); status != http.StatusTooManyRequests {
		t.Fatalf("plain request over the limit: %d, want 429", status)
	}
	// SOCKS5 likewise: general failure.
	if conn, err := socksDial(t, g, &proxy.Auth{User: "alice", Password: alicePass}, addr); err == nil {
		conn.Close()
		t.Fatal("SOCKS5 over the limit connected")
	}
	// Another user is not limited by alice.
	if status, _, _ := get(t, g.client(t, "bob", bobPass), tg.srv.URL, nil); status != 200 {
		t.Fatalf("bob: %d", status)
	}
	if got := requests(g, kindConnect, outcomeLimit) + requests(g, kindHTTP, outcomeLimit) + requests(g, kindSocks, outcomeLimit); got != 3 {
		t.Fatalf("limit counted %v, want 3", got)
	}
	// Once the tunnel ends, the slot is free again.
	c.Close()
	poll.Until(t, "alice's slot is free after her tunnel closed", 5*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, tg.srv.URL, nil)
		resp, err := g.client(t, "alice", alicePass).Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func TestSpreadAndProxyHeader(t *testing.T) {
	ups, pk := fleet(t, 3)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	tlsTg := newTarget(t, true)
	c := g.client(t, "alice", alicePass)
	seen := map[string]int{}
	for range 30 {
		status, id, body := get(t, c, tg.srv.URL, nil)
		if status != 200 || body != "hello from target" {
			t.Fatalf("%d %q", status, body)
		}
		if id == "" {
			t.Fatal("no X-Proxyfleet-Proxy on a plain response")
		}
		seen[id]++
	}
	for _, u := range ups {
		if seen[u.id] != 10 || u.count() != 10 {
			t.Errorf("%s: %d answers named it, it carried %d; want 10 each", u.id, seen[u.id], u.count())
		}
	}
	// CONNECT to a TLS target: the 200 names the proxy.
	var connectIDs []string
	tr := &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: g.Addr(), User: url.UserPassword("alice", alicePass)}),
		TLSClientConfig: &tls.Config{RootCAs: tlsTg.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			connectIDs = append(connectIDs, resp.Header.Get(HeaderProxy))
			return nil
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	for range 3 {
		status, id, body := get(t, &http.Client{Transport: tr}, tlsTg.srv.URL, nil)
		if status != 200 || body != "hello from target" {
			t.Fatalf("TLS through CONNECT: %d %q", status, body)
		}
		if id != "" {
			t.Fatalf("the target's answer inside the tunnel carries %s: %q", HeaderProxy, id)
		}
	}
	slices.Sort(connectIDs)
	if !slices.Equal(connectIDs, []string{"p1", "p2", "p3"}) {
		t.Fatalf("CONNECT answers named %v, want p1 p2 p3", connectIDs)
	}
}

func TestSession(t *testing.T) {
	ups, pk := fleet(t, 3)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	check := func(name string, c *http.Client, hdr map[string]string) string {
		var first string
		for i := range 50 {
			status, id, _ := get(t, c, tg.srv.URL, hdr)
			if status != 200 {
				t.Fatalf("%s: %d", name, status)
			}
			if i == 0 {
				first = id
			} else if id != first {
				t.Fatalf("%s: request %d went to %s, the session's proxy is %s", name, i, id, first)
			}
		}
		return first
	}
	a := check("user suffix", g.client(t, "alice-session-s1", alicePass), nil)
	b := check("header", g.client(t, "alice", alicePass), map[string]string{HeaderSession: "s2"})
	if a == b {
		// The picker gives a new session the next proxy: two sessions
		// started one after the other land on different ones.
		t.Fatalf("sessions s1 and s2 both on %s", a)
	}
	// CONNECT with a session stays too.
	tgAddr := tg.srv.Listener.Addr().String()
	for range 5 {
		resp, c, _ := g.connect(t, tgAddr, basic("alice-session-s1", alicePass), nil)
		if resp.Header.Get(HeaderProxy) != a {
			t.Fatalf("CONNECT in session s1 went to %s, want %s", resp.Header.Get(HeaderProxy), a)
		}
		c.Close()
	}
	// The session header never reaches the proxy.
	for _, u := range ups {
		u.mu.Lock()
		for _, h := range u.headers {
			if h.Get(HeaderSession) != "" || h.Get(HeaderLabels) != "" {
				t.Errorf("%s saw the gateway's own headers: %v", u.id, h)
			}
		}
		u.mu.Unlock()
	}
}

func TestLabels(t *testing.T) {
	de := newUpstream(t, "de1", "")
	us := newUpstream(t, "us1", "")
	pool := newUpstream(t, "x1", "")
	pk := newPicker(
		Proxy{ID: "de1", Addr: de.addr(), Labels: map[string]string{"country": "de"}},
		Proxy{ID: "us1", Addr: us.addr(), Labels: map[string]string{"country": "us"}},
		Proxy{ID: "x1", Addr: pool.addr(), Labels: map[string]string{"country": "de", "pool": "resi"}},
	)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	for _, c := range []struct {
		name, user string
		hdr        map[string]string
		want       []string
	}{
		{"user label", "alice-label-country-us", nil, []string{"us1"}},
		{"user pool", "alice-pool-resi", nil, []string{"x1"}},
		{"user label and session", "alice-session-k-label-country-de", nil, []string{"de1", "x1"}},
		{"header", "alice", map[string]string{HeaderLabels: "country=de, pool=resi"}, []string{"x1"}},
		{"header country", "alice", map[string]string{HeaderLabels: "country=de"}, []string{"de1", "x1"}},
	} {
		for range 6 {
			status, id, _ := get(t, g.client(t, c.user, alicePass), tg.srv.URL, c.hdr)
			if status != 200 || !slices.Contains(c.want, id) {
				t.Fatalf("%s: %d via %s, want one of %v", c.name, status, id, c.want)
			}
		}
	}
	// A malformed option is a bad request, once the password is right.
	if status, _, _ := get(t, g.client(t, "alice-label-country", alicePass), tg.srv.URL, nil); status != http.StatusBadRequest {
		t.Fatalf("malformed user option: %d, want 400", status)
	}
	if status, _, _ := get(t, g.client(t, "alice-label-country", "wrong"), tg.srv.URL, nil); status != http.StatusProxyAuthRequired {
		t.Fatalf("malformed user option, wrong password: %d, want 407", status)
	}
}

func TestEmpty(t *testing.T) {
	u := newUpstream(t, "de1", "")
	for _, c := range []struct {
		name   string
		pk     *fakePicker
		user   string
		inBody string
	}{
		{"empty rotation", newPicker(), "alice", "no proxy in the rotation"},
		{"no match", newPicker(Proxy{ID: "de1", Addr: u.addr(), Labels: map[string]string{"country": "de"}}), "alice-label-country-fr", "no proxy matches labels country=fr"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := startGateway(t, c.pk, func(c *Config) { c.RetryAfter = 7 * time.Second })
			tg := newTarget(t, false)
			req, _ := http.NewRequest(http.MethodGet, tg.srv.URL, nil)
			resp, err := g.client(t, c.user, alicePass).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "7" || !strings.Contains(string(b), c.inBody) {
				t.Fatalf("plain: %d Retry-After %q body %q; want 503, 7, %q", resp.StatusCode, resp.Header.Get("Retry-After"), b, c.inBody)
			}
			cr, _, br := g.connect(t, tg.srv.Listener.Addr().String(), basic(c.user, alicePass), nil)
			b, _ = io.ReadAll(io.LimitReader(cr.Body, 1<<10))
			_ = br
			if cr.StatusCode != 503 || cr.Header.Get("Retry-After") != "7" || !strings.Contains(string(b), c.inBody) {
				t.Fatalf("CONNECT: %d Retry-After %q body %q", cr.StatusCode, cr.Header.Get("Retry-After"), b)
			}
			if got := requests(g, kindHTTP, outcomeEmpty) + requests(g, kindConnect, outcomeEmpty); got != 2 {
				t.Fatalf("empty counted %v, want 2", got)
			}
			if len(c.pk.gotReports()) != 0 {
				t.Fatalf("reports with nothing failed: %v", c.pk.gotReports())
			}
		})
	}
}

func TestFailover(t *testing.T) {
	for _, c := range []struct {
		name, reason, cause string
		bad                 func(t testing.TB) string
	}{
		{"refused", "connect: connection refused", causeRefused, refusingAddr},
		{"timeout", "connect timeout", causeTimeout, fullBacklogAddr},
		{"no answer", "connect timeout", causeTimeout, silentAddr},
		{"502", "CONNECT answered 502 Bad Gateway", causeStatus, func(t testing.TB) string { return newUpstream(t, "bad", "502").addr() }},
		{"407", "CONNECT answered 407 Proxy Authentication Required", causeStatus, func(t testing.TB) string { return newUpstream(t, "bad", "407").addr() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			good := newUpstream(t, "good", "")
			bad1, bad2 := c.bad(t), c.bad(t)
			pk := newPicker(Proxy{ID: "bad1", Addr: bad1}, Proxy{ID: "bad2", Addr: bad2}, Proxy{ID: "good", Addr: good.addr()})
			g := startGateway(t, pk, func(c *Config) { c.ConnectTimeout, c.ResponseTimeout = 300*time.Millisecond, 300*time.Millisecond })
			tg := newTarget(t, false)

			// CONNECT: bad1, bad2, then good.
			resp, conn, br := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), nil)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderProxy) != "good" {
				t.Fatalf("CONNECT: %d via %q, want 200 via good", resp.StatusCode, resp.Header.Get(HeaderProxy))
			}
			_, _ = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
			b, _ := io.ReadAll(br)
			if !strings.Contains(string(b), "hello from target") {
				t.Fatalf("through the tunnel: %q", b)
			}
			want := []report{{"bad1", c.reason}, {"bad2", c.reason}}
			if got := pk.gotReports(); !slices.Equal(got, want) {
				t.Fatalf("reports %v, want %v", got, want)
			}
			// Plain: the same (the picker goes on round robin: bad1, bad2,
			// good), except that a plain answer of the proxy is the
			// target's, 407 aside: the 502 is passed on.
			status, id, body := get(t, g.client(t, "alice", alicePass), tg.srv.URL, nil)
			switch c.name {
			case "502":
				if status != 502 || id != "bad1" {
					t.Fatalf("plain: %d via %q %q, want the 502 passed on via bad1", status, id, body)
				}
			default:
				if status != 200 || id != "good" || body != "hello from target" {
					t.Fatalf("plain: %d via %q %q", status, id, body)
				}
				plainReason := c.reason
				switch c.name {
				case "407":
					plainReason = "answered 407 Proxy Authentication Required"
				case "no answer":
					// A proxy that takes the request and never answers
					// (dead behind an idle connection): ResponseTimeout.
					plainReason = "no answer within the response timeout"
				}
				want = append(want, report{"bad1", plainReason}, report{"bad2", plainReason})
			}
			if got := pk.gotReports(); !slices.Equal(got, want) {
				t.Fatalf("reports %v, want %v", got, want)
			}
			if got := testutil.ToFloat64(g.m.upstreamFail.WithLabelValues(c.cause)); got != float64(len(want)) {
				t.Fatalf("failures by cause %s: %v, want %d", c.cause, got, len(want))
			}
			if got := testutil.ToFloat64(g.m.retries.WithLabelValues(kindConnect)); got != 2 {
				t.Fatalf("CONNECT retries %v, want 2", got)
			}
		})
	}
}

// TestPlain502IsTheTargets: a plain answer from the proxy is the target's
// (squid's 502 for a target that does not answer), passed on and not
// held against the proxy.
func TestPlain502IsTheTargets(t *testing.T) {
	u := newUpstream(t, "p1", "")
	pk := newPicker(Proxy{ID: "p1", Addr: u.addr()})
	g := startGateway(t, pk, nil)
	dead := refusingAddr(t)
	status, id, _ := get(t, g.client(t, "alice", alicePass), "http://"+dead+"/", nil)
	if status != 502 || id != "p1" {
		t.Fatalf("plain to a dead target: %d via %q, want squid's 502 via p1", status, id)
	}
	// CONNECT to a dead target: squid's 503 with X-Squid-Error, passed on.
	resp, _, _ := g.connect(t, dead, basic("alice", alicePass), nil)
	if resp.StatusCode != 503 || resp.Header.Get("X-Squid-Error") == "" || resp.Header.Get(HeaderProxy) != "p1" {
		t.Fatalf("CONNECT to a dead target: %d %q via %q", resp.StatusCode, resp.Header.Get("X-Squid-Error"), resp.Header.Get(HeaderProxy))
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Fatalf("the proxy was reported for the target's failure: %v", r)
	}
}

func TestAllFail(t *testing.T) {
	pk := newPicker(Proxy{ID: "a", Addr: refusingAddr(t)}, Proxy{ID: "b", Addr: refusingAddr(t)}, Proxy{ID: "c", Addr: refusingAddr(t)}, Proxy{ID: "d", Addr: refusingAddr(t)})
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	status, _, body := get(t, g.client(t, "alice", alicePass), tg.srv.URL, nil)
	if status != 502 || !strings.Contains(body, "a: connect: connection refused") || !strings.Contains(body, "c: connect") {
		t.Fatalf("all failed: %d %q", status, body)
	}
	// Retries = 2: three proxies tried, the fourth not.
	if n := len(pk.gotReports()); n != 3 {
		t.Fatalf("%d reported, want 3 (one try and two retries)", n)
	}
	if got := requests(g, kindHTTP, outcomeUpstreamFailed); got != 1 {
		t.Fatalf("upstream_failed counted %v", got)
	}
}

func TestSessionMovesOnFailover(t *testing.T) {
	good := newUpstream(t, "good", "")
	bad := newUpstream(t, "bad", "")
	pk := newPicker(Proxy{ID: "bad", Addr: bad.addr()}, Proxy{ID: "good", Addr: good.addr()})
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	c := g.client(t, "alice-session-s9", alicePass)
	if _, id, _ := get(t, c, tg.srv.URL, nil); id != "bad" {
		t.Fatalf("the session starts on %q, want bad", id)
	}
	bad.close() // its address now refuses
	for i := range 10 {
		status, id, _ := get(t, c, tg.srv.URL, nil)
		if status != 200 || id != "good" {
			t.Fatalf("request %d after the failure: %d via %q, want good", i, status, id)
		}
	}
	if got := pk.gotReports(); len(got) != 1 || got[0] != (report{"bad", "connect: connection refused"}) {
		t.Fatalf("reports %v", got)
	}
	// The failover picked with the failed one excluded.
	pk.mu.Lock()
	defer pk.mu.Unlock()
	found := false
	for _, s := range pk.sels {
		found = found || slices.Equal(s.Exclude, []string{"bad"})
	}
	if !found {
		t.Fatal("no pick excluded the failed proxy")
	}
}

// TestCredentials: the fleet's credential reaches the proxy, never the
// target; the client's never goes past the gateway.
func TestCredentials(t *testing.T) {
	ups, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	c := g.client(t, "alice", alicePass)
	if status, _, _ := get(t, c, tg.srv.URL, map[string]string{"X-Mine": "1"}); status != 200 {
		t.Fatal(status)
	}
	resp, conn, br := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	_, _ = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
	_, _ = io.ReadAll(br)

	fleetAuth := basic(fleetUser, fleetPass)
	ups[0].mu.Lock()
	auths := slices.Clone(ups[0].auths)
	hdrs := slices.Clone(ups[0].headers)
	ups[0].mu.Unlock()
	if len(auths) != 2 {
		t.Fatalf("upstream saw %d requests, want 2", len(auths))
	}
	for _, a := range auths {
		if a != fleetAuth {
			t.Fatalf("upstream saw Proxy-Authorization %q, want the fleet's", a)
		}
	}
	for _, h := range hdrs {
		for k, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, basic("alice", alicePass)[6:]) || strings.Contains(v, alicePass) {
					t.Fatalf("upstream saw the client's credential in %s", k)
				}
			}
		}
	}
	seen := tg.seen()
	if len(seen) != 2 {
		t.Fatalf("target saw %d requests", len(seen))
	}
	if seen[0].Get("X-Mine") != "1" {
		t.Fatalf("the client's own header did not reach the target: %v", seen[0])
	}
	for _, h := range seen {
		for k, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, fleetAuth[6:]) || strings.Contains(v, fleetPass) || strings.Contains(v, alicePass) || strings.Contains(v, basic("alice", alicePass)[6:]) {
					t.Fatalf("the target saw a credential in %s: %q", k, v)
				}
			}
		}
		if h.Get("Proxy-Authorization") != "" {
			t.Fatalf("the target saw Proxy-Authorization")
		}
	}
}

// TestNoPasswordInLogs runs every path that logs and looks for a password.
func TestNoPasswordInLogs(t *testing.T) {
	good := newUpstream(t, "good", "")
	pk := newPicker(Proxy{ID: "r", Addr: refusingAddr(t)}, Proxy{ID: "s", Addr: newUpstream(t, "s", "407").addr()}, Proxy{ID: "good", Addr: good.addr()})
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	get(t, g.client(t, "alice", alicePass), tg.srv.URL, nil)
	get(t, g.client(t, "alice", "wrong-"+bobPass), tg.srv.URL, nil)
	get(t, g.client(t, "alice-bad-opt", alicePass), tg.srv.URL, nil)
	g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), nil)
	_, _ = socksDial(t, g, &proxy.Auth{User: "alice", Password: "x" + alicePass}, tg.srv.Listener.Addr().String())
	_ = g.run.Stop()
	logs := g.logs.String()
	if !strings.Contains(logs, "proxy failed, reported") {
		t.Fatalf("the logs miss the failures (the test tests nothing): %s", logs)
	}
	for _, pw := range []string{fleetPass, alicePass, bobPass, basic(fleetUser, fleetPass)[6:], basic("alice", alicePass)[6:]} {
		if strings.Contains(logs, pw) {
			t.Fatalf("a password is in the logs:\n%s", logs)
		}
	}
}

func TestDrain(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, func(c *Config) { c.DrainTimeout = 300 * time.Millisecond })
	tg := newTarget(t, false)
	resp, conn, _ := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	sc, err := socksDial(t, g, &proxy.Auth{User: "alice", Password: alicePass}, tg.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	start := time.Now()
	if err := g.run.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("stop took %s with a drain of 300ms", d)
	}
	// The idle tunnels were closed at the drain's end.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("tunnel still open after the drain: %v", err)
	}
	if _, err := net.DialTimeout("tcp", g.Addr(), time.Second); err == nil {
		t.Fatal("still accepting after Run returned")
	}
}

func TestNewRefusesNoUsers(t *testing.T) {
	_, err := New(newPicker(), Config{Listen: "127.0.0.1:0"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "gateway.users" {
		t.Fatalf("no users: %v, want gateway.users", err)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Listen: ":0", Users: []User{{Name: "a", Password: "p"}}}
	for _, c := range []struct {
		mod   func(*Config)
		field string
	}{
		{func(c *Config) { c.Listen = "" }, "gateway.listen"},
		{func(c *Config) { c.Listen = "nope" }, "gateway.listen"},
		{func(c *Config) { c.SocksListen = "nope" }, "gateway.socks_listen"},
		{func(c *Config) { c.Users = nil }, "gateway.users"},
		{func(c *Config) { c.Users = []User{{Name: "al-ice", Password: "p"}} }, "gateway.users[0].name"},
		{func(c *Config) { c.Users = []User{{Name: "a", Password: "p"}, {Name: "a", Password: "q"}} }, "gateway.users[1].name"},
		{func(c *Config) { c.Users = []User{{Name: "a"}} }, "gateway.users[0].password"},
		{func(c *Config) { c.Users = []User{{Name: "a", Password: "p", MaxConns: -1}} }, "gateway.users[0].max_conns"},
		{func(c *Config) { c.Retries = 11 }, "gateway.retries"},
		{func(c *Config) { c.ConnectTimeout = -1 }, "gateway.connect_timeout"},
		{func(c *Config) { c.FirstByteTimeout = 100 * time.Millisecond }, "gateway.first_byte_timeout"},
		{func(c *Config) { c.FirstByteTimeout = time.Minute }, "gateway.first_byte_timeout"},
		{func(c *Config) { c.IdleTimeout = -1 }, "gateway.idle_timeout"},
		{func(c *Config) { c.KeepAliveTimeout = -1 }, "gateway.keepalive_timeout"},
	} {
		cfg := ok
		cfg.Users = slices.Clone(ok.Users)
		c.mod(&cfg)
		err := cfg.WithDefaults().Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("want field %s, got %v", c.field, err)
		}
		if err != nil && strings.Contains(err.Error(), "p\"") {
			t.Errorf("a password in %v", err)
		}
	}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	d := ok.WithDefaults()
	if d.Retries != 2 || d.ConnectTimeout != 5*time.Second || d.RetryAfter != 5*time.Second || d.DrainTimeout != 5*time.Second || d.Users[0].MaxConns != 256 {
		t.Fatalf("defaults: %+v", d)
	}
	if d.FirstByteTimeout != DefaultFirstByteTimeout || d.IdleTimeout != DefaultIdleTimeout || d.KeepAliveTimeout != DefaultKeepAliveTimeout {
		t.Fatalf("defaults: first byte %s, idle %s, keep-alive %s", d.FirstByteTimeout, d.IdleTimeout, d.KeepAliveTimeout)
	}
	// A short response timeout bounds the first byte's default.
	short := ok
	short.ResponseTimeout = 300 * time.Millisecond
	if d := short.WithDefaults(); d.FirstByteTimeout != short.ResponseTimeout || d.Validate() != nil {
		t.Fatalf("first_byte_timeout %s under response_timeout %s: %v", d.FirstByteTimeout, short.ResponseTimeout, d.Validate())
	}
}

// Validate checks every bound of defaults.Bounds, naming the field: a
// value just below the least and one just above the greatest are
// refused; and a negative value of a setting whose 0 turns it off is 0.
func TestValidate_everyBound(t *testing.T) {
	ok := Config{Listen: ":0", Users: []User{{Name: "a", Password: "p"}}}
	d := ok.WithDefaults()
	bound := map[string]bool{defaults.FirstByteTimeoutBound.Path: true}
	for i := range d.bounded() {
		cfg := ok.WithDefaults()
		s := cfg.bounded()[i]
		bound[s.Bound.Path] = true
		below := s.Min - 1
		if below == 0 && !s.Off {
			below = -1
		}
		for _, v := range []int64{below, s.Max + 1} {
			cfg := ok.WithDefaults()
			cfg.Users = slices.Clone(cfg.Users)
			s := cfg.bounded()[i]
			s.Set(v)
			err := cfg.WithDefaults().Validate()
			var fe *FieldError
			if s.Off && v < 0 {
				if err != nil {
					t.Errorf("%s: %d: %v, want it taken as 0", s.Field, v, err)
				}
				continue
			}
			if !errors.As(err, &fe) || fe.Field != s.Field {
				t.Errorf("%s: %d: %v, want field %s", s.Field, v, err, s.Field)
			}
		}
	}
	for _, b := range defaults.Bounds {
		if !bound[b.Path] {
			t.Errorf("%s: not a bound of Config", b.Path)
		}
	}
	if d := (Config{Retries: -1, RetryBodyBytes: -1}).WithDefaults(); d.Retries != 0 || d.RetryBodyBytes != 0 {
		t.Errorf("negative: retries %d, retry_body_bytes %d, want 0", d.Retries, d.RetryBodyBytes)
	}
}

func TestParseUser(t *testing.T) {
	for _, c := range []struct {
		in, user, session string
		labels            map[string]string
		bad               bool
	}{
		{in: "alice", user: "alice"},
		{in: "alice-session-s1", user: "alice", session: "s1"},
		{in: "alice-session-s1-label-country-de", user: "alice", session: "s1", labels: map[string]string{"country": "de"}},
		{in: "alice-label-a-1-label-b-2-pool-resi", user: "alice", labels: map[string]string{"a": "1", "b": "2", "pool": "resi"}},
		{in: "alice-session", bad: true},
		{in: "alice-label-a", bad: true},
		{in: "alice-what-x", bad: true},
		{in: "alice-session--x", bad: true},
		// A pool's name may have '-' in it: it runs to the next option.
		{in: "alice-pool-eu-west", user: "alice", labels: map[string]string{"pool": "eu-west"}},
		{in: "alice-pool-eu-west-2-session-s1", user: "alice", session: "s1", labels: map[string]string{"pool": "eu-west-2"}},
		{in: "alice-session-s1-pool-eu-west-label-a-1", user: "alice", session: "s1", labels: map[string]string{"pool": "eu-west", "a": "1"}},
		{in: "alice-pool", bad: true},
		{in: "alice-pool-eu--x", bad: true},
		{in: "alice-pool-session-s1", bad: true},
	} {
		u, o, err := parseUser(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("%s: no error", c.in)
			}
			continue
		}
		if err != nil || u != c.user || o.session != c.session || len(o.labels) != len(c.labels) {
			t.Errorf("%s: %q %+v %v", c.in, u, o, err)
		}
		for k, v := range c.labels {
			if o.labels[k] != v {
				t.Errorf("%s: label %s=%q, want %q", c.in, k, o.labels[k], v)
			}
		}
	}
}

// TestTunnelBulk: megabytes both ways through a CONNECT tunnel and a
// SOCKS5 one arrive whole and in order, and a half-close passes.
func TestTunnelBulk(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	// An echo target: writes back what it reads, then closes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var echo sync.WaitGroup
	defer echo.Wait()
	defer ln.Close()
	echo.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			echo.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	payload := make([]byte, 8<<20)
	for i := range payload {
		payload[i] = byte(i*7 + i>>9)
	}
	check := func(name string, c, raw net.Conn, r io.Reader) {
		var got []byte
		done := make(chan error, 1)
		go func() {
			var err error
			got, err = io.ReadAll(r)
			done <- err
		}()
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("%s: write: %v", name, err)
		}
		if err := raw.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: read: %v", name, err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("%s: %d bytes back, want the %d sent", name, len(got), len(payload))
		}
	}
	resp, c, br := g.connect(t, ln.Addr().String(), basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	check("CONNECT", c, c, br)
	// The SOCKS5 client's own connection, to half-close it.
	var raw net.Conn
	fwd := dialerFunc(func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		raw = c
		return c, err
	})
	d, err := proxy.SOCKS5("tcp", g.SocksAddr(), &proxy.Auth{User: "alice", Password: alicePass}, fwd)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	check("SOCKS5", sc, raw, sc)
	poll.Until(t, "the tunnels' bytes are counted", 5*time.Second, func() bool {
		return testutil.ToFloat64(g.m.bytes.WithLabelValues("up")) >= float64(2*len(payload)) &&
			testutil.ToFloat64(g.m.bytes.WithLabelValues("down")) >= float64(2*len(payload))
	})
}

type dialerFunc func(network, addr string) (net.Conn, error)

func (f dialerFunc) Dial(network, addr string) (net.Conn, error) { return f(network, addr) }
