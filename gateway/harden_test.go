package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"proxyfleet/internal/poll"
)

// The gateway faces the internet: framing that could smuggle a request,
// a proxy that says more than its answer, credential guessing, heads
// that cost the gateway before anyone is authenticated.

// chunkedWithLength is a POST whose body is framed twice: chunked
// ("abc") and by a length that would end it elsewhere.
func chunkedWithLength(target string, more ...string) string {
	return "POST " + target + " HTTP/1.1\r\nHost: x\r\n" + aliceAuth + strings.Join(more, "") +
		"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
}

// TestLengthWithChunkedCloses: a request with both Content-Length and
// Transfer-Encoding is carried as chunked, answered, and its connection
// closed (RFC 9112 6.1), with a small head and with a large one.
func TestLengthWithChunkedCloses(t *testing.T) {
	t.Run("small head", func(t *testing.T) {
		up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: " + string(rune('0'+len(r.body))) + "\r\n\r\n" + string(r.body)))
			return true
		})
		g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
		rc := dialGateway(t, g)
		rc.send(chunkedWithLength("http://t.example/"))
		resp, body := rc.read("POST")
		if resp.StatusCode != 200 || body != "abc" {
			t.Fatalf("%s %q, want 200 with the chunked body", resp.Status, body)
		}
		if !resp.Close {
			t.Fatal("the answer does not say close")
		}
		if !rc.closed() {
			t.Fatal("the connection stays open")
		}
		reqs, _ := up.seen()
		if len(reqs) != 1 || reqs[0].header.Get("Content-Length") != "" {
			t.Fatalf("the proxy saw %d requests, Content-Length %q", len(reqs), reqs[0].header.Get("Content-Length"))
		}
	})
	t.Run("large head", func(t *testing.T) {
		_, pk := fleet(t, 1)
		g := startGateway(t, pk, nil)
		tg := newTarget(t, false)
		rc := dialGateway(t, g)
		// A head larger than the client's reader, read whole apart.
		rc.send(chunkedWithLength(tg.srv.URL+"/", "Cookie: "+strings.Repeat("k", 12<<10)+"\r\n"))
		resp, body := rc.read("POST")
		if resp.StatusCode != 200 || body != "hello from target" || resp.Header.Get("X-Body") != "abc" {
			t.Fatalf("%s %q body sent %q", resp.Status, body, resp.Header.Get("X-Body"))
		}
		if !resp.Close {
			t.Fatal("the answer does not say close")
		}
		if !rc.closed() {
			t.Fatal("the connection stays open")
		}
	})
}

// TestPoisonedUpstreamNotReused: a proxy that sends more than its
// answer (bytes after its length or its last chunk, a body to HEAD, a
// second answer sent a moment later) does not have that taken for the
// next request's answer, another user's on another connection: the
// connection is not kept, or is found unusable before it is used.
func TestPoisonedUpstreamNotReused(t *testing.T) {
	const bogus = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nbogus!"
	for _, c := range []struct {
		name, method, answer string
		late                 bool // the bogus answer comes in a write of its own, after the real one was read
	}{
		{"after its length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + bogus, false},
		{"after its last chunk", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + bogus, false},
		{"a body to HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		{"length with chunked", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", false},
		{"later", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := make(chan struct{})
			written := make(chan struct{})
			up := newScriptProxy(t, func(conn net.Conn, r *seenRequest) bool {
				if strings.HasSuffix(r.uri, "/next") {
					_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
					return true
				}
				_, _ = io.WriteString(conn, c.answer)
				if c.late {
					<-read
					_, _ = io.WriteString(conn, bogus)
					close(written)
				}
				return true
			})
			g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
			first := dialGateway(t, g)
			first.send(strings.Replace(get1("http://t.example/first"), "GET", c.method, 1))
			if resp, _ := first.read(c.method); resp.StatusCode != 200 {
				t.Fatalf("first: %s", resp.Status)
			}
			// Once the first request has ended (its proxy connection kept or
			// not): the next one would find it in the pool.
			poll.Until(t, "the first request ended", 10*time.Second, func() bool {
				return testutil.ToFloat64(g.m.inFlight.WithLabelValues(kindHTTP)) == 0
			})
			if c.late {
				close(read)
				<-written
			}
			next := dialGateway(t, g)
			next.send("GET http://t.example/next HTTP/1.1\r\nHost: x\r\nProxy-Authorization: " + basic("bob", bobPass) + "\r\n\r\n")
			if resp, body := next.read("GET"); resp.StatusCode != 200 || body != "next" {
				t.Fatalf("the next request got %s %q, want its own answer %q", resp.Status, body, "next")
			}
			if r := g.Gateway.picker.(*fakePicker).gotReports(); len(r) != 0 {
				t.Fatalf("reports %v", r)
			}
		})
	}
}

// TestWrongCredentialCloses: a 407 for a wrong credential closes the
// connection; one for a missing credential keeps it (a browser sends
// its credential on the same connection once asked), for a head that
// fits the client's reader and for one read into a buffer of its own.
func TestWrongCredentialCloses(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	for _, path := range []struct{ name, more string }{
		{"small head", ""},
		{"large head", "Cookie: " + strings.Repeat("k", 12<<10) + "\r\n"},
	} {
		t.Run(path.name, func(t *testing.T) {
			rc := dialGateway(t, g)
			rc.send("GET " + tg.srv.URL + "/ HTTP/1.1\r\nHost: x\r\n" + path.more + "\r\n")
			if resp, _ := rc.read("GET"); resp.StatusCode != http.StatusProxyAuthRequired || resp.Close {
				t.Fatalf("missing: %s close %v, want 407 keeping the connection", resp.Status, resp.Close)
			}
			rc.send(get1(tg.srv.URL+"/", path.more))
			if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "hello from target" {
				t.Fatalf("then right: %s %q", resp.Status, body)
			}
			rc.send("GET " + tg.srv.URL + "/ HTTP/1.1\r\nHost: x\r\n" + path.more + "Proxy-Authorization: " + basic("alice", "nope") + "\r\n\r\n")
			if resp, _ := rc.read("GET"); resp.StatusCode != http.StatusProxyAuthRequired || !resp.Close {
				t.Fatalf("wrong: %s close %v, want 407 saying close", resp.Status, resp.Close)
			}
			if !rc.closed() {
				t.Fatal("the connection stays open after a wrong credential")
			}
		})
	}
}

// clock is a Config.Now that can be moved forward.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }
func (g *testGateway) socksAuthStatus(t *testing.T, user, pw string) byte {
	t.Helper()
	c := dialSocks(t, g)
	msg := []byte{5, 1, 2, 1, byte(len(user))}
	msg = append(msg, user...)
	msg = append(msg, byte(len(pw)))
	msg = append(msg, pw...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatal(err)
	}
	if b[0] != 5 || b[1] != 2 || b[2] != 1 {
		t.Fatalf("SOCKS5 answers % x", b)
	}
	return b[3]
}

// TestAuthThrottle: after AuthFailures failed credentials from one
// address within a minute, its attempts are refused without the
// password being checked (the right one too): 429 with Retry-After on
// both HTTP paths (the connection closed), RFC 1929 failure on SOCKS5,
// counted as throttled; once the minute has passed, the right password
// works again.
func TestAuthThrottle(t *testing.T) {
	_, pk := fleet(t, 1)
	var clk clock
	g := startGateway(t, pk, func(c *Config) { c.AuthFailures = 3; c.Now = clk.now })
	tg := newTarget(t, false)
	big := "Cookie: " + strings.Repeat("k", 12<<10) + "\r\n"
	wrong := func(more string) {
		t.Helper()
		rc := dialGateway(t, g)
		rc.send("GET " + tg.srv.URL + "/ HTTP/1.1\r\nHost: x\r\n" + more + "Proxy-Authorization: " + basic("alice", "guess") + "\r\n\r\n")
		if resp, _ := rc.read("GET"); resp.StatusCode != http.StatusProxyAuthRequired {
			t.Fatalf("a wrong guess: %s, want 407", resp.Status)
		}
	}
	wrong("")
	wrong(big)
	if s := g.socksAuthStatus(t, "alice", "guess"); s == 0 {
		t.Fatal("SOCKS5 took a wrong password")
	}
	// Three failures: now even the right password is not checked.
	for _, more := range []string{"", big} {
		rc := dialGateway(t, g)
		rc.send(get1(tg.srv.URL+"/", more))
		resp, _ := rc.read("GET")
		if resp.StatusCode != http.StatusTooManyRequests || !resp.Close {
			t.Fatalf("throttled (big head %v): %s close %v, want 429 saying close", more != "", resp.Status, resp.Close)
		}
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
			t.Fatalf("Retry-After %q, want 1 to 60 seconds", resp.Header.Get("Retry-After"))
		}
		if !rc.closed() {
			t.Fatal("a throttled connection stays open")
		}
	}
	if s := g.socksAuthStatus(t, "alice", alicePass); s == 0 {
		t.Fatal("SOCKS5 checked a throttled source's password")
	}
	// Another address is not throttled.
	if v6 := dialFrom(t, g.Addr(), "127.0.0.2"); v6 != nil {
		v6.send(get1(tg.srv.URL + "/"))
		if resp, _ := v6.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("from another address: %s", resp.Status)
		}
	}
	got := requests(g, kindHTTP, outcomeThrottled) + requests(g, kindSocks, outcomeThrottled)
	if got != 3 {
		t.Fatalf("throttled counted %v, want 3", got)
	}
	clk.advance(61 * time.Second)
	rc := dialGateway(t, g)
	rc.send(get1(tg.srv.URL + "/"))
	if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "hello from target" {
		t.Fatalf("after the minute: %s %q", resp.Status, body)
	}
	if s := g.socksAuthStatus(t, "alice", alicePass); s != 0 {
		t.Fatalf("SOCKS5 after the minute: status %d", s)
	}
}

// dialFrom connects to addr from the local address from (nil when the
// machine does not have it).
func dialFrom(t *testing.T, addr, from string) *rawClient {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Logf("no connection from %s: %v", from, err)
		return nil
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// TestThrottleTableBounded: the table of sources holds at most its
// max; a new source evicts the one whose window began first.
func TestThrottleTableBounded(t *testing.T) {
	th := newThrottle(2, time.Minute, 3)
	now := time.Unix(1_000_000, 0)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}) }
	for i := range 10 {
		th.fail(addr(i), now.Add(time.Duration(i)*time.Second))
		th.fail(addr(i), now.Add(time.Duration(i)*time.Second))
		if th.len() > 3 {
			t.Fatalf("%d sources held, want at most 3", th.len())
		}
	}
	at := now.Add(10 * time.Second)
	for i := range 7 {
		if _, blocked := th.blocked(addr(i), at); blocked {
			t.Fatalf("source %d, evicted, is still blocked", i)
		}
	}
	for i := 7; i < 10; i++ {
		if wait, blocked := th.blocked(addr(i), at); !blocked || wait <= 0 || wait > time.Minute {
			t.Fatalf("source %d: blocked %v for %s", i, blocked, wait)
		}
	}
	if _, blocked := th.blocked(addr(9), now.Add(70*time.Second)); blocked {
		t.Fatal("blocked after its window")
	}
}

// manyFields is n header field lines.
func manyFields(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-F%d: v\r\n", i)
	}
	return b.String()
}

// TestHeadLimits: a head over MaxHeaderBytes or with more than
// MaxHeaderFields fields is answered 431 before its credential is
// looked at (none is sent), and the connection closes, whether the head
// fits the client's reader or not; a head within both is carried.
func TestHeadLimits(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, func(c *Config) { c.MaxHeaderFields = 20 })
	tg := newTarget(t, false)
	u := tg.srv.URL + "/"
	big := "Cookie: " + strings.Repeat("k", 12<<10) + "\r\n" // over the client's reader
	for _, c := range []struct {
		name, head string
		want       int
	}{
		{"fields", "GET " + u + " HTTP/1.1\r\nHost: x\r\n" + manyFields(20) + "\r\n", 431},
		{"large head fields", "GET " + u + " HTTP/1.1\r\nHost: x\r\n" + big + manyFields(20) + "\r\n", 431},
		{"bytes", "GET " + u + " HTTP/1.1\r\nHost: x\r\nCookie: " + strings.Repeat("k", 65<<10) + "\r\n\r\n", 431},
		{"CONNECT fields", "CONNECT t.example:443 HTTP/1.1\r\nHost: t.example:443\r\n" + manyFields(20) + "\r\n", 431},
		{"within", get1(u, big, manyFields(15)), 200},
		{"within bytes", get1(u, "Cookie: "+strings.Repeat("k", 62<<10)+"\r\n"), 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := dialGateway(t, g)
			rc.send(c.head)
			resp, err := http.ReadResponse(rc.br, &http.Request{Method: http.MethodGet})
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != c.want {
				t.Fatalf("%s, want %d", resp.Status, c.want)
			}
			if c.want == 431 && !rc.closed() {
				t.Fatal("the connection stays open after 431")
			}
		})
	}
	if got := testutil.ToFloat64(g.m.authFailures.WithLabelValues(kindHTTP, authMissing)); got != 0 {
		t.Fatalf("%v credentials looked at for refused heads", got)
	}
}

// TestHeaderTimeout: a connection that sends no head, or only part of
// one, within HeaderTimeout of its accept is closed, whether it fits
// the client's reader or not; on a kept-alive connection a
// next head is due HeaderTimeout after its first byte.
func TestHeaderTimeout(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), func(c *Config) {
		c.HeaderTimeout = 300 * time.Millisecond // KeepAliveTimeout stays 90s
	})
	for _, c := range []struct{ name, sent string }{
		{"nothing", ""},
		{"part of a head", "GET http://t.example/ HTTP/1.1\r\nHost: x\r\n"},
		{"part of a large head", "GET http://t.example/ HTTP/1.1\r\nCookie: " + strings.Repeat("k", 12<<10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := dialGateway(t, g)
			if c.sent != "" {
				rc.send(c.sent)
			}
			if !rc.closed() {
				t.Fatal("the connection stays open")
			}
		})
	}
	t.Run("kept alive", func(t *testing.T) {
		rc := dialGateway(t, g)
		rc.send(get1("http://t.example/"))
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("%s %q", resp.Status, body)
		}
		rc.send("GET http://t.example/ HTTP/1.1\r\n")
		if !rc.closed() {
			t.Fatal("the connection stays open with part of a next head")
		}
	})
}

// TestMaxUnauthenticated: at most MaxUnauthenticated connections open at
// once without a valid credential yet; over it, new ones (HTTP or
// SOCKS5) are closed at once and counted; one that authenticates, or
// ends, gives its place back.
func TestMaxUnauthenticated(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, func(c *Config) { c.MaxUnauthenticated = 2 })
	tg := newTarget(t, false)
	unauth := func() float64 { return gathered(t, g, "proxyfleet_gateway_unauthenticated_connections") }
	a := dialGateway(t, g)
	b := dialGateway(t, g)
	poll.Until(t, "two connections held", 10*time.Second, func() bool { return unauth() == 2 })
	over := dialGateway(t, g)
	if !over.closed() {
		t.Fatal("a third unauthenticated connection stays open")
	}
	sc, err := net.Dial("tcp", g.SocksAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_ = sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = sc.Write([]byte{5, 1, 2})
	// Closed unanswered: EOF, or a reset (the greeting arrived unread).
	if n, err := sc.Read(make([]byte, 2)); n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a SOCKS5 connection over the limit: read %d, %v; want it closed", n, err)
	}
	if got := gathered(t, g, "proxyfleet_gateway_unauthenticated_refused_total"); got != 2 {
		t.Fatalf("refused counted %v, want 2", got)
	}
	// a authenticates (and stays open): its place is free again.
	a.send(get1(tg.srv.URL + "/"))
	if resp, _ := a.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("a: %s", resp.Status)
	}
	poll.Until(t, "a's place given back", 10*time.Second, func() bool { return unauth() == 1 })
	c := dialGateway(t, g)
	c.send(get1(tg.srv.URL + "/"))
	if resp, _ := c.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("c: %s", resp.Status)
	}
	// b ends: its place too; and one with a large head gives it back on
	// authenticating (its body, still awaited, holds the connection
	// open).
	b.c.Close()
	poll.Until(t, "b's place given back", 10*time.Second, func() bool { return unauth() == 0 })
	d := dialGateway(t, g)
	poll.Until(t, "d holds a place", 10*time.Second, func() bool { return unauth() == 1 })
	d.send("POST " + tg.srv.URL + "/ HTTP/1.1\r\nHost: x\r\n" + aliceAuth + largePad + "Content-Length: 6\r\n\r\nabc") // a large head
	poll.Until(t, "d's place given back", 10*time.Second, func() bool { return unauth() == 0 })
	d.send("def")
	if resp, _ := d.read("POST"); resp.StatusCode != 200 {
		t.Fatalf("d: %s", resp.Status)
	}
}

// gathered is the value of the gateway's metric name (without labels),
// -1 if it has none.
func gathered(t *testing.T, g *testGateway, name string) float64 {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	return -1
}

// TestEarlyAnswerNotReused: a proxy that answers before it has the
// request's whole body may take what follows for another request: its
// connection is not kept, and the next request goes on a new one.
func TestEarlyAnswerNotReused(t *testing.T) {
	answered := make(chan struct{})
	up := newRawProxy(t, func(c net.Conn, br *bufio.Reader, n int) bool {
		r, err := http.ReadRequest(br)
		if err != nil {
			return false
		}
		if n == 0 {
			// Answers at the head, then reads the body.
			_, _ = io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n")
			close(answered)
		} else {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
		}
		_, err = io.Copy(io.Discard, r.Body)
		return err == nil
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	rc := dialGateway(t, g)
	rc.send("POST http://t.example/ HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "Content-Length: 10\r\n\r\nhalf.")
	<-answered
	// The answer is relayed while the body is still being sent.
	if resp, _ := rc.read("POST"); resp.StatusCode != 413 {
		t.Fatalf("%s, want the proxy's 413", resp.Status)
	}
	rc.send("rest.")
	poll.Until(t, "the first request ended", 10*time.Second, func() bool {
		return testutil.ToFloat64(g.m.inFlight.WithLabelValues(kindHTTP)) == 0
	})
	next := dialGateway(t, g)
	next.send(get1("http://t.example/next"))
	if resp, body := next.read("GET"); resp.StatusCode != 200 || body != "next" {
		t.Fatalf("next: %s %q", resp.Status, body)
	}
	if n := up.conns(); n != 2 {
		t.Fatalf("the proxy saw %d connections, want 2 (the early answer's not kept)", n)
	}
}

// rawProxy is a fake proxy that serves each connection with serve
// (its n-th request, counted over all connections) until it says stop.
type rawProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	n     int
	count int
	live  map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newRawProxy(t *testing.T, serve func(c net.Conn, br *bufio.Reader, n int) bool) *rawProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawProxy{ln: ln, live: map[net.Conn]struct{}{}}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.count++
			p.live[c] = struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					p.mu.Lock()
					n := p.n
					p.n++
					p.mu.Unlock()
					if !serve(c, br, n) {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.live {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *rawProxy) addr() string { return p.ln.Addr().String() }

func (p *rawProxy) conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// TestThrottleKeysIPv6ByPrefix: the throttle counts an IPv6 source by
// its /64 (a host holding one does not get a fresh budget for each of
// its addresses), an IPv4 one by its address (IPv4-mapped ones alike).
func TestThrottleKeysIPv6ByPrefix(t *testing.T) {
	key := func(s string) netip.Addr {
		return sourceOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)))
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"[2001:db8:1:2::1]:1000", "[2001:db8:1:2:ffff:ffff:ffff:fffe]:2000", true},
		{"[2001:db8:1:2::1]:1000", "[2001:db8:1:3::1]:1000", false},
		{"[2001:db8:1:2::1%eth0]:1000", "[2001:db8:1:2::2]:1000", true},
		{"198.18.0.1:1000", "198.18.0.2:1000", false},
		{"198.18.0.1:1000", "[::ffff:198.18.0.1]:2000", true},
		{"198.18.0.1:1000", "198.18.0.1:2000", true},
	} {
		if got := key(c.a) == key(c.b); got != c.same {
			t.Errorf("%s and %s: one source %v, want %v", c.a, c.b, got, c.same)
		}
		if got := sourceOfString(c.a) == key(c.a); !got {
			t.Errorf("%s: net/http's RemoteAddr gives another key (%s, %s)", c.a, sourceOfString(c.a), key(c.a))
		}
	}

	// Failures from many addresses of one /64 block all of it, not the
	// next /64.
	th := newThrottle(5, time.Minute, maxAuthSources)
	now := time.Unix(1_000_000, 0)
	for i := range 5 {
		th.fail(key(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1)), now)
	}
	if _, blocked := th.blocked(key("[2001:db8:1:2:abcd::1]:4000"), now); !blocked {
		t.Fatal("a fresh address of the same /64 is not throttled")
	}
	if _, blocked := th.blocked(key("[2001:db8:1:3::1]:4000"), now); blocked {
		t.Fatal("another /64 is throttled")
	}
	if th.len() != 1 {
		t.Fatalf("%d sources held for one /64, want 1", th.len())
	}
}
