package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"proxyfleet/internal/poll"
)

// stubProxy answers every plain request itself (200, X-Upstream: its
// id, X-Body-Length: the body's length) on kept-alive connections; once
// frozen, it reads requests and answers none, as a proxy whose VM died
// behind a kept-alive connection (the socket stays open, nothing comes).
func stubProxy(t *testing.T, id string, frozen *atomic.Bool) *scriptProxy {
	return newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		if frozen.Load() {
			_, _ = io.Copy(io.Discard, c) // until the gateway closes
			return false
		}
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Upstream: "+id+
			"\r\nX-Body-Length: "+strconv.Itoa(len(r.body))+"\r\n\r\nok")
		return err == nil
	})
}

// TestFailoverWhenProxyLeaves: a request in flight on a kept-alive
// connection to a proxy that stopped answering goes to another proxy as
// soon as its proxy leaves the rotation, with a small head and a large one, with a
// body the gateway holds; the session moves with it. ResponseTimeout is
// long: only the leave can end the wait within the test's bound.
func TestFailoverWhenProxyLeaves(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			t.Run(path+"/"+method, func(t *testing.T) {
				var frozen, never atomic.Bool
				a, b := stubProxy(t, "a", &frozen), stubProxy(t, "b", &never)
				pk := newPicker(Proxy{ID: "a", Addr: a.addr()}, Proxy{ID: "b", Addr: b.addr()})
				g := startGateway(t, pk, func(c *Config) { c.ResponseTimeout = 2 * time.Minute })
				c := g.client(t, "alice-session-s1", alicePass)
				c.Timeout = 0 // bounded below, by the context
				do := func(ctx context.Context) (*http.Response, error) {
					var body io.Reader
					if method == http.MethodPost {
						body = strings.NewReader("hello body")
					}
					req, err := http.NewRequestWithContext(ctx, method, "http://t.example/x", body)
					if err != nil {
						return nil, err
					}
					if path == "large head" {
						// A head over the client's reader of 8 KiB.
						req.Header.Set("X-Pad", strings.Repeat("p", 9<<10))
					}
					resp, err := c.Do(req)
					if err != nil {
						return nil, err
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					return resp, nil
				}
				// The session's proxy is a; its connection is kept alive.
				resp, err := do(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := resp.Header.Get(HeaderProxy); got != "a" {
					t.Fatalf("first request carried by %q, want a", got)
				}
				frozen.Store(true)
				seen := func() int { r, _ := a.seen(); return len(r) }
				before := seen()

				// Generous hang bound: far below ResponseTimeout.
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				type result struct {
					resp *http.Response
					err  error
				}
				done := make(chan result, 1)
				go func() {
					r, err := do(ctx)
					done <- result{r, err}
				}()
				poll.Until(t, "a reads the request", 10*time.Second, func() bool { return seen() > before })
				pk.remove("a")
				r := <-done
				if r.err != nil {
					t.Fatalf("request in flight when its proxy left: %v", r.err)
				}
				if got := r.resp.Header.Get(HeaderProxy); got != "b" || r.resp.StatusCode != http.StatusOK {
					t.Fatalf("answer %d from %q, want 200 from b", r.resp.StatusCode, got)
				}
				if method == http.MethodPost && r.resp.Header.Get("X-Body-Length") != "10" {
					t.Fatalf("b got a body of %s bytes, want 10", r.resp.Header.Get("X-Body-Length"))
				}
				if got := testutil.ToFloat64(g.m.failovers.WithLabelValues(causeLeft)); got != 1 {
					t.Errorf("failovers_total{cause=left} = %v, want 1", got)
				}
				for _, rp := range pk.gotReports() {
					t.Errorf("a proxy that left was reported: %v", rp)
				}
				// The session stays on b.
				resp, err = do(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := resp.Header.Get(HeaderProxy); got != "b" {
					t.Fatalf("the session's next request carried by %q, want b", got)
				}
			})
		}
	}
}

// TestTunnelOnProxyThatLeft: a tunnel open on a proxy that leaves the
// rotation goes on while the proxy lives (taken out alive, it carries
// its tunnels to their end), and is closed, both ways, once its
// connection to the proxy shows no sign of life. Loopback always
// acknowledges, so the TCP look is made to say so.
func TestTunnelOnProxyThatLeft(t *testing.T) {
	var dead atomic.Bool
	t.Cleanup(func() { tcpStateOf = tcpState }) // after the gateway's stop
	tcpStateOf = func(c net.Conn) (bool, time.Duration, bool) {
		if dead.Load() {
			return true, time.Hour, true
		}
		return tcpState(c)
	}
	up := newUpstream(t, "a", "")
	pk := newPicker(Proxy{ID: "a", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	target := tg.srv.Listener.Addr().String()
	through := func(c net.Conn, br *bufio.Reader) error {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	resp, c, br := g.connect(t, target, basic("alice", alicePass), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	if err := through(c, br); err != nil {
		t.Fatalf("through the tunnel: %v", err)
	}

	pk.remove("a")
	// The watcher has looked (a tick or two) and the proxy lives: the
	// tunnel goes on.
	time.Sleep(3 * watchEvery)
	if err := through(c, br); err != nil {
		t.Fatalf("through the tunnel of a live proxy that left: %v", err)
	}

	dead.Store(true)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the tunnel of a silent proxy that left: read %v, want its close (EOF)", err)
	}
	if got := testutil.ToFloat64(g.m.failure(causeSilent)); got != 1 {
		t.Errorf("upstream_failures_total{cause=silent} = %v, want 1", got)
	}
}
