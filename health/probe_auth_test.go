package health_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"proxyfleet/health"
)

func check(t *testing.T, p *health.HTTPProber, addr string, open bool) health.Findings {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.Check(ctx, addr, open)
}

func wantStatus(t *testing.T, what string, err error, code string) {
	t.Helper()
	var pe *health.ProbeError
	if !errors.As(err, &pe) || pe.Result != health.ResultStatus || !strings.Contains(err.Error(), code) {
		t.Fatalf("%s: %v, want a status error %s", what, err, code)
	}
}

// Through a proxy that requires Basic credentials: a probe without them,
// or with wrong ones, fails on the 407; with them it passes, the target's
// report gives the egress and no leak, and the open check (the same
// request without credentials) is refused. An open proxy answers the open
// check; one that adds X-Forwarded-For with its client's address, or
// forwards the credentials, is leaky.
func TestHTTPProberCredentials(t *testing.T) {
	target := httptest.NewServer(health.ProbeHandler())
	defer target.Close()
	url := target.URL + health.ProbePath
	px := startAuthProxy(t)

	bare, _ := health.NewHTTPProber(url, "")
	wantStatus(t, "no credentials", check(t, bare, px.addr(), false).Err, "407")
	wrong, _ := health.NewHTTPProber(url, "", health.WithCredentials(fleetUser, "wrong"))
	wantStatus(t, "wrong credentials", check(t, wrong, px.addr(), false).Err, "407")
	if bare.ChecksOpen() || !wrong.ChecksOpen() {
		t.Fatal("ChecksOpen does not follow the credentials")
	}

	p, err := health.NewHTTPProber(url, "", health.WithCredentials(fleetUser, fleetPassword))
	if err != nil {
		t.Fatal(err)
	}
	f := check(t, p, px.addr(), true)
	if f.Err != nil || f.Kind != health.KindHTTP || f.Egress != "127.0.0.1" || !f.Reported || f.Leak != "" || f.Open != health.OpenRefused {
		t.Fatalf("through the authenticating proxy: %+v", f)
	}
	if !strings.Contains(f.OpenErr.Error(), "407") {
		t.Fatalf("open check refused with %v, want the 407", f.OpenErr)
	}
	methods, auths := px.seen()
	if n := len(auths); n < 2 || auths[n-2] != "Basic "+fleetToken || auths[n-1] != "" || methods[n-1] != http.MethodGet {
		t.Fatalf("the proxy saw %v %v: want the probe with the credentials, then the open check without", methods, auths)
	}
	// Without checkOpen, one request only.
	n := px.requests.Load()
	if f := check(t, p, px.addr(), false); f.Err != nil || f.Open != "" || px.requests.Load() != n+1 {
		t.Fatalf("probe without an open check: %+v, %d requests", f, px.requests.Load()-n)
	}

	px.open.Store(true)
	if f := check(t, p, px.addr(), true); f.Err != nil || f.Open != health.OpenAnswered {
		t.Fatalf("through an open proxy: %+v", f)
	}
	px.open.Store(false)

	px.xff.Store(true)
	if f := check(t, p, px.addr(), false); f.Err != nil || f.Leak != "leaky: X-Forwarded-For carries the client's address" {
		t.Fatalf("through a proxy adding X-Forwarded-For: %+v", f)
	}
	px.xff.Store(false)

	px.forwardAuth.Store(true)
	if f := check(t, p, px.addr(), false); f.Err != nil || !strings.Contains(f.Leak, "Proxy-Authorization") || strings.Contains(f.Leak, fleetToken) {
		t.Fatalf("through a proxy forwarding the credentials: %+v", f)
	}
	px.forwardAuth.Store(false)

	// A target that answers the nonce alone (an external page, an
	// earlier health) passes, reporting nothing: no egress, no leak
	// verdict, even through a leaky proxy.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Query().Get(health.NonceParam)+"\n")
	}))
	defer plain.Close()
	pp, _ := health.NewHTTPProber(plain.URL+"/", "", health.WithCredentials(fleetUser, fleetPassword))
	px.xff.Store(true)
	if f := check(t, pp, px.addr(), true); f.Err != nil || f.Reported || f.Egress != "" || f.Leak != "" || f.Open != health.OpenRefused {
		t.Fatalf("a target that reports nothing: %+v", f)
	}
}

// An open check that gets no answer either way is inconclusive: the
// proxy holds the request without credentials until the probe's time runs
// out. One whose proxy closes the connection is refused.
func TestHTTPProberOpenCheckInconclusive(t *testing.T) {
	target := httptest.NewServer(health.ProbeHandler())
	defer target.Close()
	var hang atomic.Bool
	hang.Store(true)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") == "" {
			if hang.Load() {
				<-r.Context().Done()
				return
			}
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		forward(w, r, http.DefaultTransport, "Proxy-Authorization")
	}))
	defer proxy.Close()
	p, _ := health.NewHTTPProber(target.URL+health.ProbePath, "", health.WithCredentials(fleetUser, fleetPassword))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	f := p.Check(ctx, proxy.Listener.Addr().String(), true)
	cancel()
	if f.Err != nil || f.Open != health.OpenInconclusive {
		t.Fatalf("a proxy that holds the request: %+v", f)
	}
	hang.Store(false)
	if f := check(t, p, proxy.Listener.Addr().String(), true); f.Err != nil || f.Open != health.OpenRefused {
		t.Fatalf("a proxy that closes the connection: %+v", f)
	}
}

// An https target is reached with CONNECT, and the credentials go on the
// CONNECT (not inside the tunnel). Health's /probe behind TLS still
// reports the egress. The open check is a CONNECT without them.
func TestHTTPProberConnectCredentials(t *testing.T) {
	target := httptest.NewTLSServer(health.ProbeHandler())
	defer target.Close()
	roots := target.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	px := startAuthProxy(t)
	opts := []health.ProberOption{health.WithTLSConfig(&tls.Config{RootCAs: roots})}
	bare, _ := health.NewHTTPProber(target.URL+health.ProbePath, "", opts...)
	wantStatus(t, "CONNECT without credentials", check(t, bare, px.addr(), false).Err, "407")

	p, err := health.NewHTTPProber(target.URL+health.ProbePath, "", append(opts, health.WithCredentials(fleetUser, fleetPassword))...)
	if err != nil {
		t.Fatal(err)
	}
	f := check(t, p, px.addr(), true)
	if f.Err != nil || f.Kind != health.KindConnect || f.Egress != "127.0.0.1" || !f.Reported || f.Leak != "" || f.Open != health.OpenRefused {
		t.Fatalf("CONNECT through the authenticating proxy: %+v", f)
	}
	methods, auths := px.seen()
	if n := len(methods); methods[n-2] != http.MethodConnect || auths[n-2] != "Basic "+fleetToken || methods[n-1] != http.MethodConnect || auths[n-1] != "" {
		t.Fatalf("the proxy saw %v %v", methods, auths)
	}
	px.open.Store(true)
	if f := check(t, p, px.addr(), true); f.Err != nil || f.Open != health.OpenAnswered {
		t.Fatalf("CONNECT through an open proxy: %+v", f)
	}
	// A target whose certificate does not verify fails the probe.
	untrusted, _ := health.NewHTTPProber(target.URL+health.ProbePath, "", health.WithCredentials(fleetUser, fleetPassword))
	if f := check(t, untrusted, px.addr(), false); f.Err == nil {
		t.Fatal("a target with an unknown certificate passed")
	}
}

// Whatever a proxy sends back, the credentials never appear in an error:
// here one echoes the request's header lines as a malformed answer.
func TestHTTPProberErrorsHoldNoCredentials(t *testing.T) {
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
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				br.ReadString('\n') // the request line
				io.WriteString(c, "HTTP/1.1 200 OK\r\n")
				for {
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						return
					}
					// The credentials' line as "Proxy-Authorization Basic
					// ...": a malformed header line, which net/http quotes
					// in its error.
					if strings.HasPrefix(line, "Proxy-Authorization: ") {
						line = strings.Replace(line, ": ", " ", 1)
					}
					io.WriteString(c, line)
				}
			}()
		}
	}()
	for _, target := range []string{"http://198.51.100.1/probe", "https://198.51.100.1/probe"} {
		p, _ := health.NewHTTPProber(target, "", health.WithCredentials(fleetUser, fleetPassword))
		f := check(t, p, ln.Addr().String(), true)
		if f.Err == nil {
			t.Fatalf("%s: an echo passed", target)
		}
		msg := f.Err.Error()
		if strings.Contains(msg, fleetToken) || strings.Contains(msg, fleetPassword) {
			t.Fatalf("%s: the error holds the credentials: %s", target, msg)
		}
		if target[:5] == "http:" && !strings.Contains(msg, "[redacted]") {
			t.Fatalf("%s: the echo did not reach the error, so this test shows nothing: %s", target, msg)
		}
	}
	if _, err := health.NewHTTPProber("http://198.51.100.1/", "", health.WithCredentials("a:b", "c")); err == nil || strings.Contains(err.Error(), "a:b") {
		t.Fatalf("a user with a colon: %v", err)
	}
}
