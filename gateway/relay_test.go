package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"proxyfleet/internal/poll"
)

// The HTTP/1.1 relay, against a scripted proxy that answers with raw
// bytes: framing, interim answers, hop-by-hop fields, bodies both ways,
// pipelining, keep-alive, a proxy that breaks off, a client that
// leaves, one parser for every head.

// seenRequest is what a scripted proxy received.
type seenRequest struct {
	method, uri, host, proto string
	header                   http.Header
	body                     []byte
}

// scriptProxy reads requests with net/http's parser and answers each with
// what answer writes on the connection (false: close it).
type scriptProxy struct {
	ln     net.Listener
	answer func(c net.Conn, r *seenRequest) bool

	mu    sync.Mutex
	reqs  []seenRequest
	conns int
	live  map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newScriptProxy(t testing.TB, answer func(c net.Conn, r *seenRequest) bool) *scriptProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptProxy{ln: ln, answer: answer, live: map[net.Conn]struct{}{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			s.live[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.live {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *scriptProxy) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.live, c)
		s.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		sr := seenRequest{method: r.Method, uri: r.RequestURI, host: r.Host, proto: r.Proto, header: r.Header, body: body}
		s.mu.Lock()
		s.reqs = append(s.reqs, sr)
		s.mu.Unlock()
		if !s.answer(c, &sr) {
			return
		}
	}
}

func (s *scriptProxy) addr() string { return s.ln.Addr().String() }

func (s *scriptProxy) seen() ([]seenRequest, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.reqs...), s.conns
}

// rawClient is a client connection to the gateway's HTTP proxy.
type rawClient struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

func dialGateway(t testing.TB, g *testGateway) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawClient) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads an answer to a request of method, with its whole body.
func (rc *rawClient) read(method string) (*http.Response, string) {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("body of %s: %v (%q so far)", resp.Status, err, b)
	}
	return resp, string(b)
}

// largePad is a field that makes a head larger than the client's
// reader: such a head is read whole into a buffer of its own.
var largePad = "X-Pad: " + strings.Repeat("p", clientReadSize) + "\r\n"

// withLargeHead sends req (a request head without its credential and
// blank line) as alice, padded over the client's reader, and returns
// its answer.
func withLargeHead(t testing.TB, g *testGateway, req string) (*http.Response, string) {
	t.Helper()
	rc := dialGateway(t, g)
	method := http.MethodGet
	if strings.HasPrefix(req, "CONNECT ") {
		method = http.MethodConnect
	}
	rc.send(req + aliceAuth + largePad + "\r\n")
	return rc.read(method)
}

// dialSocks connects to the gateway's SOCKS5 listener, closed when the
// test ends, with a deadline that bounds a hang.
func dialSocks(t testing.TB, g *testGateway) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", g.SocksAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// closed says whether the gateway closed the connection (EOF next).
func (rc *rawClient) closed() bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := rc.br.ReadByte()
	return err == io.EOF
}

var aliceAuth = "Proxy-Authorization: " + basic("alice", alicePass) + "\r\n"

func get1(target string, more ...string) string {
	return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" + aliceAuth + strings.Join(more, "") + "\r\n"
}

func TestLeanAnswerFraming(t *testing.T) {
	answers := map[string]string{
		"/length":  "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
		"/chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-B: 2\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n",
		"/204":     "HTTP/1.1 204 No Content\r\nX-C: 3\r\n\r\n",
		"/304":     "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nEtag: \"e\"\r\n\r\n",
		"/head":    "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
		"/1xx":     "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"/hop":     "HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nX-Proxyfleet-Proxy: fake\r\nProxy-Authenticate: Basic\r\nContent-Length: 2\r\n\r\nok",
		"/close":   "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close",
		"/reason":  "HTTP/1.1 599 Odd Reason Here\r\nContent-Length: 0\r\n\r\n",
		// Taken as http.Transport takes them: LF line ends, obs-fold,
		// chunked with a length (chunked wins).
		"/lf":   "HTTP/1.1 200 OK\nX-L: 1\nContent-Length: 2\n\nok",
		"/fold": "HTTP/1.1 200 OK\r\nX-F: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
		"/both": "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	}
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		path := strings.TrimPrefix(r.uri, "http://t.example")
		_, _ = io.WriteString(c, answers[path])
		return path != "/close"
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	rc := dialGateway(t, g)
	check := func(method, path string, want int, wantBody string) *http.Response {
		t.Helper()
		rc.send(strings.Replace(get1("http://t.example"+path), "GET", method, 1))
		resp, body := rc.read(method)
		if resp.StatusCode != want || body != wantBody || resp.Header.Get(HeaderProxy) != "p1" {
			t.Fatalf("%s %s: %d %q via %q; want %d %q via p1", method, path, resp.StatusCode, body, resp.Header.Get(HeaderProxy), want, wantBody)
		}
		if resp.Close {
			t.Fatalf("%s %s: the gateway closes the client's connection", method, path)
		}
		return resp
	}
	if r := check("GET", "/length", 200, "hello"); r.Header.Get("X-A") != "1" || r.ContentLength != 5 {
		t.Fatalf("/length: %v", r.Header)
	}
	if r := check("GET", "/chunked", 200, "hello world"); r.Header.Get("X-B") != "2" || len(r.TransferEncoding) != 1 {
		t.Fatalf("/chunked: %v %v", r.Header, r.TransferEncoding)
	}
	if r := check("GET", "/204", 204, ""); r.Header.Get("X-C") != "3" {
		t.Fatalf("/204: %v", r.Header)
	}
	if r := check("GET", "/304", 304, ""); r.Header.Get("Content-Length") != "10" || r.Header.Get("Etag") != `"e"` {
		t.Fatalf("/304: %v", r.Header)
	}
	if r := check("HEAD", "/head", 200, ""); r.ContentLength != 1000 {
		t.Fatalf("HEAD: Content-Length %d, want the proxy's 1000", r.ContentLength)
	}
	check("GET", "/1xx", 200, "ok")
	r := check("GET", "/hop", 200, "ok")
	for _, k := range []string{"X-Secret", "Keep-Alive", "Proxy-Authenticate"} {
		if r.Header.Get(k) != "" {
			t.Fatalf("hop-by-hop field %s passed on: %v", k, r.Header)
		}
	}
	if vs := r.Header.Values(HeaderProxy); len(vs) != 1 {
		t.Fatalf("%s: %q, want only the gateway's", HeaderProxy, vs)
	}
	if r := check("GET", "/reason", 599, ""); r.Status != "599 Odd Reason Here" {
		t.Fatalf("status line %q", r.Status)
	}
	if r := check("GET", "/lf", 200, "ok"); r.Header.Get("X-L") != "1" {
		t.Fatalf("/lf: %v", r.Header)
	}
	if r := check("GET", "/fold", 200, "ok"); strings.Join(strings.Fields(r.Header.Get("X-F")), " ") != "a b" {
		t.Fatalf("/fold: %q", r.Header.Get("X-F"))
	}
	check("GET", "/both", 200, "ok")
	// Until the proxy closes: chunked to the client, whose connection
	// goes on.
	check("GET", "/close", 200, "until close")
	check("GET", "/length", 200, "hello")
	_, conns := up.seen()
	if conns != 3 {
		t.Fatalf("the proxy saw %d connections, want 3 (kept alive but after the answer with a length and chunked, and the one until close)", conns)
	}
	poll.Until(t, "13 answers counted ok", 10*time.Second, func() bool { return requests(g, kindHTTP, outcomeOK) == 13 })
}

func TestLeanRequestForwarding(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr(), Labels: map[string]string{"a": "b"}}), nil)
	rc := dialGateway(t, g)
	rc.send("GET http://t.example:8080?q=1 HTTP/1.1\r\nHost: wrong.example\r\n" + aliceAuth +
		"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\nTe: trailers\r\nUpgrade: h2c\r\n" +
		"X-Proxyfleet-Session: s1\r\nX-Proxyfleet-Labels: a=b\r\nX-Keep: kept\r\nx-lower: case\r\n\r\n")
	if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	reqs, _ := up.seen()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.uri != "http://t.example:8080/?q=1" || r.host != "t.example:8080" || r.proto != "HTTP/1.1" {
		t.Fatalf("request line %q %q, Host %q", r.uri, r.proto, r.host)
	}
	if r.header.Get("Proxy-Authorization") != basic(fleetUser, fleetPass) {
		t.Fatalf("Proxy-Authorization %q, want the fleet's", r.header.Get("Proxy-Authorization"))
	}
	for _, k := range []string{"X-Drop", "Connection", "Proxy-Connection", "Keep-Alive", "Te", "Upgrade", HeaderSession, HeaderLabels} {
		if r.header.Get(k) != "" {
			t.Errorf("%s went to the proxy: %v", k, r.header)
		}
	}
	if r.header.Get("X-Keep") != "kept" || r.header.Get("X-Lower") != "case" {
		t.Fatalf("the client's own fields: %v", r.header)
	}
}

func TestLeanRequestBodies(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(len(r.body))), len(r.body))
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	rc := dialGateway(t, g)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	post := func(hdr, body string, wantLen int) {
		t.Helper()
		rc.send("POST http://t.example/ HTTP/1.1\r\nHost: t.example\r\n" + aliceAuth + hdr + "\r\n" + body)
		resp, got := rc.read("POST")
		if resp.StatusCode != 200 || got != fmt.Sprint(wantLen) {
			t.Fatalf("%q: %s, the proxy got %s bytes, want %d", hdr, resp.Status, got, wantLen)
		}
	}
	post("Content-Length: 5\r\n", "small", 5)
	post(fmt.Sprintf("Content-Length: %d\r\n", len(big)), string(big), len(big))
	chunked := "3\r\nabc\r\n" + fmt.Sprintf("%x\r\n%s\r\n", len(big), big) + "0\r\nX-T: 1\r\n\r\n"
	post("Transfer-Encoding: chunked\r\n", chunked, len(big)+3)
	post("Content-Length: 0\r\n", "", 0)

	// Expect: 100-continue: the gateway says go on, then the body goes.
	rc.send("PUT http://t.example/ HTTP/1.1\r\nHost: t.example\r\n" + aliceAuth + "Expect: 100-continue\r\nContent-Length: 4\r\n\r\n")
	resp, _ := rc.read("PUT")
	if resp.StatusCode != 100 {
		t.Fatalf("after Expect: %s, want 100 Continue", resp.Status)
	}
	rc.send("body")
	if resp, got := rc.read("PUT"); resp.StatusCode != 200 || got != "4" {
		t.Fatalf("after 100 Continue: %s %q", resp.Status, got)
	}
	reqs, conns := up.seen()
	if conns != 1 {
		t.Fatalf("the proxy saw %d connections, want 1 (kept alive)", conns)
	}
	last := reqs[len(reqs)-1]
	if last.header.Get("Expect") != "" || string(last.body) != "body" {
		t.Fatalf("the proxy saw Expect %q, body %q", last.header.Get("Expect"), last.body)
	}
	if !bytes.Equal(reqs[1].body, big) || string(reqs[2].body) != "abc"+string(big) {
		t.Fatal("a body arrived changed")
	}
	want := float64(5 + 2*len(big) + 3 + 4)
	poll.Until(t, "the bodies' bytes are counted", 10*time.Second, func() bool {
		return testutil.ToFloat64(g.m.bytes.WithLabelValues("up")) == want
	})
}

func TestLeanLargeAnswers(t *testing.T) {
	big := bytes.Repeat([]byte("fedcba9876543210"), 1<<19) // 8 MiB
	cookie := strings.Repeat("c", 20<<10)                  // a head larger than the buffers
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		switch r.uri {
		case "http://t.example/length":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(big))
			_, _ = c.Write(big)
		case "http://t.example/chunked":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			for b := big; len(b) > 0; {
				n := min(len(b), 100_000)
				fmt.Fprintf(c, "%x\r\n%s\r\n", n, b[:n])
				b = b[n:]
			}
			_, _ = io.WriteString(c, "0\r\n\r\n")
		case "http://t.example/head":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nSet-Cookie: %s\r\nContent-Length: 2\r\n\r\nok", cookie)
		}
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	rc := dialGateway(t, g)
	for _, path := range []string{"/length", "/chunked"} {
		rc.send(get1("http://t.example" + path))
		resp, body := rc.read("GET")
		if resp.StatusCode != 200 || body != string(big) {
			t.Fatalf("%s: %s, %d bytes, want the %d sent", path, resp.Status, len(body), len(big))
		}
	}
	rc.send(get1("http://t.example/head"))
	resp, body := rc.read("GET")
	if resp.Header.Get("Set-Cookie") != cookie || body != "ok" {
		t.Fatalf("a %d-byte field: %d bytes of it, body %q", len(cookie), len(resp.Header.Get("Set-Cookie")), body)
	}
	poll.Until(t, "the answers' bytes are counted", 10*time.Second, func() bool {
		return testutil.ToFloat64(g.m.bytes.WithLabelValues("down")) == float64(2*len(big)+2)
	})
}

func TestLeanPipelined(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		body := r.uri
		if r.method == http.MethodHead {
			body = ""
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(r.uri), body)
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	rc := dialGateway(t, g)
	rc.send(get1("http://t.example/1") + "HEAD http://t.example/2 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n" + get1("http://t.example/3", "Connection: close\r\n"))
	for i, m := range []string{"GET", "HEAD", "GET"} {
		resp, body := rc.read(m)
		want := fmt.Sprintf("http://t.example/%d", i+1)
		if m == "HEAD" {
			want = ""
		}
		if resp.StatusCode != 200 || body != want {
			t.Fatalf("answer %d: %s %q, want %q", i+1, resp.Status, body, want)
		}
		if i == 2 && !resp.Close {
			t.Fatal("the answer to Connection: close does not say close")
		}
	}
	if !rc.closed() {
		t.Fatal("the connection stays open after Connection: close")
	}
}

// TestLeanProxyBreaksOff: a proxy that closes mid-answer: the client
// sees it cut (not a shorter whole answer), and the proxy is not
// reported (bytes reached the client).
func TestLeanProxyBreaksOff(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		switch r.uri {
		case "http://t.example/length":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
		case "http://t.example/chunked":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		}
		return false
	})
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	for _, path := range []string{"/length", "/chunked"} {
		rc := dialGateway(t, g)
		rc.send(get1("http://t.example" + path))
		resp, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			t.Fatalf("%s: a whole answer of %q from a proxy that broke off", path, b)
		}
		if !rc.closed() {
			t.Fatalf("%s: the connection stays open", path)
		}
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Fatalf("reports %v", r)
	}
}

// TestLeanStaleConnection: a proxy that closed a kept-alive connection
// (without saying so) costs no request and no report: a request that
// can be sent again goes on a new connection (whether the proxy's close
// arrived yet or not); one that cannot finds the old one closed before
// it is sent.
func TestLeanStaleConnection(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return false // closes as it answered, without Connection: close
	})
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	rc := dialGateway(t, g)
	for i := range 3 {
		rc.send(get1("http://t.example/"))
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("GET %d: %s %q", i, resp.Status, body)
		}
	}
	for i := range 3 {
		// Once the proxy closed (no race with its FIN), the look before
		// the request sees it.
		poll.Until(t, "the proxy closed its side", 10*time.Second, func() bool {
			up.mu.Lock()
			defer up.mu.Unlock()
			return len(up.live) == 0
		})
		rc.send("POST http://t.example/ HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "Content-Length: 1\r\n\r\nx")
		if resp, body := rc.read("POST"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("POST %d: %s %q", i, resp.Status, body)
		}
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Fatalf("reports %v", r)
	}
	if reqs, _ := up.seen(); len(reqs) != 6 {
		t.Fatalf("the proxy got %d requests, want 6", len(reqs))
	}
}

// TestLeanClientLeaves: a client that leaves while its answer is awaited
// is counted as gone, its proxy connection closed, and nobody reported.
func TestLeanClientLeaves(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		<-release
		return false
	})
	t.Cleanup(free) // before the proxy's cleanup
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	rc := dialGateway(t, g)
	rc.send(get1("http://t.example/slow"))
	poll.Until(t, "the proxy has the request", 10*time.Second, func() bool {
		reqs, _ := up.seen()
		return len(reqs) == 1
	})
	rc.c.Close()
	poll.Until(t, "the gone client is counted", 10*time.Second, func() bool {
		return requests(g, kindHTTP, outcomeClientGone) == 1
	})
	if r := pk.gotReports(); len(r) != 0 {
		t.Fatalf("reports %v", r)
	}
	if got := testutil.ToFloat64(g.m.inFlight.WithLabelValues(kindHTTP)); got != 0 {
		t.Fatalf("in flight %v", got)
	}
	free()
}

func TestLeanHTTP10(t *testing.T) {
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		if strings.HasSuffix(r.uri, "/chunked") {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
			return true
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	// Keep-alive when asked; a chunked answer goes as it comes, then a
	// close.
	rc := dialGateway(t, g)
	rc.send("GET http://t.example/ HTTP/1.0\r\n" + aliceAuth + "Connection: keep-alive\r\n\r\n")
	resp, body := rc.read("GET")
	if body != "ok" || resp.Header.Get("Connection") != "keep-alive" {
		t.Fatalf("HTTP/1.0 keep-alive: %q, Connection %q", body, resp.Header.Get("Connection"))
	}
	rc.send("GET http://t.example/chunked HTTP/1.0\r\n" + aliceAuth + "Connection: keep-alive\r\n\r\n")
	resp, body = rc.read("GET")
	if body != "ok" || len(resp.TransferEncoding) != 0 || !resp.Close {
		t.Fatalf("chunked to HTTP/1.0: %q %v close %v", body, resp.TransferEncoding, resp.Close)
	}
	if !rc.closed() {
		t.Fatal("open after an answer framed by its close")
	}
	// Without keep-alive: one answer, then a close.
	rc = dialGateway(t, g)
	rc.send("GET http://t.example/ HTTP/1.0\r\n" + aliceAuth + "\r\n")
	if _, body := rc.read("GET"); body != "ok" || !rc.closed() {
		t.Fatalf("HTTP/1.0: %q, or left open", body)
	}
}

// TestOneParser: every request is read by the one parser: an
// origin-form request is refused (400, closed, what came after it never
// served), a field folded over lines too (400), and a head larger than
// the client's reader is carried, a plain request and CONNECT (its
// tunnel carried).
func TestOneParser(t *testing.T) {
	_, pk := fleet(t, 1)
	g := startGateway(t, pk, nil)
	tg := newTarget(t, false)
	u := tg.srv.URL + "/"

	// Origin-form: refused before the credential is looked at, and the
	// connection closed (what came after it is never served).
	rc := dialGateway(t, g)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n" + get1(u))
	if resp, body := rc.read("GET"); resp.StatusCode != 400 || !strings.Contains(body, "this is a proxy") {
		t.Fatalf("origin-form: %s %q", resp.Status, body)
	}
	if !rc.closed() {
		t.Fatal("the connection stays open after an origin-form request")
	}

	// A folded field is refused by the parser.
	rc = dialGateway(t, g)
	rc.send("GET " + u + " HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "X-Folded: a\r\n b\r\n\r\n")
	if resp, _ := rc.read("GET"); resp.StatusCode != 400 {
		t.Fatalf("obs-fold: %s", resp.Status)
	}
	if !rc.closed() {
		t.Fatal("the connection stays open after a refused head")
	}

	// A head larger than the client's reader is read whole apart,
	// checked and carried.
	rc = dialGateway(t, g)
	rc.send(get1(u, "Cookie: "+strings.Repeat("k", 12<<10)+"\r\n"))
	if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "hello from target" || resp.Header.Get(HeaderProxy) != "p1" {
		t.Fatalf("a 12 KiB head: %s %q", resp.Status, body)
	}
	if seen := tg.seen(); len(seen[len(seen)-1].Get("Cookie")) != 12<<10 {
		t.Fatal("the large field did not arrive whole")
	}
	// CONNECT with a large head: a tunnel.
	target := tg.srv.Listener.Addr().String()
	rc = dialGateway(t, g)
	rc.send("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n" + aliceAuth + largePad + "\r\n")
	if resp, err := http.ReadResponse(rc.br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 || resp.Header.Get(HeaderProxy) != "p1" {
		t.Fatalf("CONNECT with a large head: %v %v", resp, err)
	}
	rc.send("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
	if resp, body := rc.read("GET"); body != "hello from target" {
		t.Fatalf("through the tunnel: %s %q", resp.Status, body)
	}
}

// TestLeanDrain: at the drain's start, idle connections close at once;
// a request in flight gets its answer (saying close), then its
// connection closes.
func TestLeanDrain(t *testing.T) {
	release := make(chan struct{})
	up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
		if strings.HasSuffix(r.uri, "/slow") {
			<-release
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), func(c *Config) { c.DrainTimeout = 10 * time.Second })
	idle := dialGateway(t, g)
	idle.send(get1("http://t.example/"))
	idle.read("GET")
	busy := dialGateway(t, g)
	busy.send(get1("http://t.example/slow"))
	poll.Until(t, "the proxy has the slow request", 10*time.Second, func() bool {
		reqs, _ := up.seen()
		return len(reqs) == 2
	})
	stopped := make(chan error, 1)
	go func() { stopped <- g.run.Stop() }()
	if !idle.closed() {
		t.Fatal("an idle connection stays open in the drain")
	}
	close(release)
	resp, body := busy.read("GET")
	if body != "ok" || !resp.Close {
		t.Fatalf("in flight: %q, close %v", body, resp.Close)
	}
	if !busy.closed() {
		t.Fatal("the busy connection stays open after its answer")
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
