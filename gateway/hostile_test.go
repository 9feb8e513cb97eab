package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"proxyfleet/internal/poll"
)

// The hostile-request table: requests as an attacker or a broken client
// sends them, drawn from RFC 9112's rules and the categories of public
// suites, each sent as raw bytes to the gateway's HTTP listener (with
// alice's credential where one matters) in front of a recording proxy.
// Sources, cited per case:
//
//   - RFC 9112 (and RFC 9110 where it says): the section whose rule the
//     case breaks;
//   - Http11Probe (its categories: Compliance, Smuggling, Malformed
//     Input);
//   - PortSwigger's http-request-smuggler (CL.TE, TE.CL, TE.TE and its
//     Transfer-Encoding permutations);
//   - Go's net/http tests (server_test.go, readrequest_test.go,
//     transfer_test.go: the requests net/http refuses);
//   - HAProxy's reg-tests (reg-tests/http-messaging: header and framing
//     checks of its H1 parser).
//
// Every case holds: the answer is the expected status (0: the connection
// is closed without one), a refused head reaches no proxy, and the
// proxy never parses a request that the client did not send as one
// (none with "smuggled" in its target or a field name: the marker of a
// request hidden in another's body or fields). The gateway answers a
// good request after each case; when the table is done and the gateway
// stopped, no goroutine and no descriptor of its is left.

// hostileCase is one row of the table.
type hostileCase struct {
	name string
	src  string // where the rule comes from
	raw  string // sent as it is
	// status is the answer expected (0: closed without one).
	status int
	// proxied is how many requests the proxy must parse.
	proxied int
	// closes: the connection must close after the answer.
	closes bool
}

// Parts of the table's requests.
const (
	hTarget = "http://t.example/"
	hAuth   = "Proxy-Authorization: Basic YWxpY2U6YWxpY2UtcHctWnE5\r\n" // alice:alice-pw-Zq9
	hHost   = "Host: t.example\r\n"
	// hSmuggled is a request hidden where a parser that disagrees would
	// find one.
	hSmuggled = "GET http://t.example/smuggled HTTP/1.1\r\nHost: t.example\r\n\r\n"
)

// post is a POST to hTarget with the credential, Host, the extra field
// lines and the body.
func post(fields, body string) string {
	return "POST " + hTarget + " HTTP/1.1\r\n" + hHost + hAuth + fields + "\r\n" + body
}

// getWith is a GET of hTarget with the credential, Host and the extra
// field lines.
func getWith(fields string) string {
	return "GET " + hTarget + " HTTP/1.1\r\n" + hHost + hAuth + fields + "\r\n"
}

func hostileCases() []hostileCase {
	return []hostileCase{
		// Framing: the request smuggling classics.
		{"CL.TE", "PortSwigger CL.TE; RFC 9112 6.1, 6.3",
			post("Content-Length: 6\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"+hSmuggled), 200, 1, true},
		{"TE.CL", "PortSwigger TE.CL; RFC 9112 6.1, 6.3",
			post("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", "3a\r\n"+hSmuggled[:0x3a]+"\r\n0\r\n\r\n"), 200, 1, true},
		{"TE.TE xchunked", "PortSwigger TE.TE; RFC 9112 6.1 (chunked not final: 400, then close)",
			post("Transfer-Encoding: xchunked\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE chunked then identity", "PortSwigger TE.TE; RFC 9112 6.1 (chunked must be final)",
			post("Transfer-Encoding: chunked, identity\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE twice", "PortSwigger TE.TE; HAProxy reg-tests h1_te",
			post("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE chunked twice", "RFC 9112 7 (chunked applied once)",
			post("Transfer-Encoding: chunked, chunked\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE empty then chunked", "RFC 9110 5.3 (field lines combine into one list)",
			post("Transfer-Encoding: \r\nTransfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\n\r\n"), 200, 1, false},
		{"TE gzip, chunked", "RFC 9112 6.1; Http11Probe Compliance",
			post("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"), 501, 0, true},
		{"TE space before colon", "PortSwigger TE.TE; RFC 9112 5.1",
			post("Transfer-Encoding : chunked\r\nContent-Length: 6\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE obs-fold", "PortSwigger TE.TE (line wrapping); RFC 9112 5.2",
			post("X-A: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 6\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE leading space", "PortSwigger TE.TE; RFC 9112 2.2 (whitespace before the first field)",
			"POST " + hTarget + " HTTP/1.1\r\n Transfer-Encoding: chunked\r\n" + hHost + hAuth + "Content-Length: 6\r\n\r\n0\r\n\r\n" + hSmuggled, 400, 0, true},
		{"TE vertical tab", "PortSwigger TE.TE; RFC 9110 5.5",
			post("Transfer-Encoding: \x0bchunked\r\nContent-Length: 6\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"TE in HTTP/1.0", "RFC 9112 6.1 (faulty framing in 1.0)",
			"POST " + hTarget + " HTTP/1.0\r\n" + hHost + hAuth + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hSmuggled, 400, 0, true},
		{"TE chunked, mixed case", "RFC 9112 7 (coding names are case-insensitive)",
			post("Transfer-Encoding: ChUnKeD\r\n", "3\r\nabc\r\n0\r\n\r\n"), 200, 1, false},
		{"two lengths", "RFC 9112 6.3 (5); Http11Probe Smuggling",
			post("Content-Length: 6\r\nContent-Length: 0\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"length list", "RFC 9112 6.3 (5); Go net/http transfer_test",
			post("Content-Length: 6, 0\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"length sign", "Go net/http readrequest_test; RFC 9110 8.6",
			post("Content-Length: +6\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"length negative", "Http11Probe Malformed Input; RFC 9110 8.6",
			post("Content-Length: -1\r\n", hSmuggled), 400, 0, true},
		{"length hex", "Http11Probe Malformed Input; RFC 9110 8.6",
			post("Content-Length: 0x6\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"length overflow", "Http11Probe Malformed Input; HAProxy reg-tests h1_cl",
			post("Content-Length: 99999999999999999999\r\n", hSmuggled), 400, 0, true},
		{"length with TE invalid", "Go net/http transfer_test (a bad length refused even beside chunked)",
			post("Transfer-Encoding: chunked\r\nContent-Length: x\r\n", "0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"same length twice", "RFC 9112 6.3 (5): identical values may be taken as one",
			post("Content-Length: 3\r\nContent-Length: 3\r\n", "abc"), 200, 1, false},
		{"length and a pipelined request", "RFC 9112 9.3.2 (pipelining): the next request is the client's own",
			post("Content-Length: 3\r\n", "abc") + getWith(""), 200, 2, false},

		// Chunked bodies the gateway refuses to pass on: the proxy gets
		// the chunks before, re-framed, then its connection is closed
		// (never a request of the client's choosing, nor a whole one);
		// the client gets 400 and a close.
		{"chunk size not hex", "Http11Probe Malformed Input; RFC 9112 7.1",
			post("Transfer-Encoding: chunked\r\n", "zz\r\nabc\r\n0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"chunk size overflow", "Go net/http chunked_test; RFC 9112 7.1",
			post("Transfer-Encoding: chunked\r\n", "ffffffffffffffffff\r\nabc\r\n0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"chunk size leading space", "PortSwigger chunk-size permutations; RFC 9112 7.1",
			post("Transfer-Encoding: chunked\r\n", " 3\r\nabc\r\n0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"chunk data too long", "HAProxy reg-tests h1_chunk; RFC 9112 7.1",
			post("Transfer-Encoding: chunked\r\n", "3\r\nabcdef\r\n0\r\n\r\n"+hSmuggled), 400, 0, true},
		{"chunk bare LF", "Http11Probe Smuggling (bare LF in chunk framing); RFC 9112 7.1",
			post("Transfer-Encoding: chunked\r\n", "3\nabc\n0\n\n"+hSmuggled), 400, 0, true},
		{"chunk extension", "RFC 9112 7.1.1 (extensions are ignored)",
			post("Transfer-Encoding: chunked\r\n", "3 ;a=b\r\nabc\r\n0\r\n\r\n"), 200, 1, false},
		{"chunk trailer", "RFC 9112 7.1.2 (trailer fields, dropped)",
			post("Transfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"), 200, 1, false},

		// The request line.
		{"two spaces", "RFC 9112 3; Http11Probe Malformed Input",
			"GET  " + hTarget + " HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"trailing space", "RFC 9112 3; HAProxy reg-tests h1_request_line",
			"GET " + hTarget + " HTTP/1.1 \r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"no version", "RFC 9112 3 (HTTP/0.9 not taken); Http11Probe Compliance",
			"GET " + hTarget + "\r\n\r\n", 400, 0, true},
		{"NUL in target", "Http11Probe Malformed Input; RFC 9112 3.2",
			"GET http://t.example/\x00 HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"method not a token", "RFC 9110 9.1; Go net/http readrequest_test",
			"G(T " + hTarget + " HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"HTTP/2 preface", "RFC 9112 2.3 (505); Http11Probe Compliance",
			"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, 0, true},
		{"version 2.0", "RFC 9110 15.6.6 (505)",
			"GET " + hTarget + " HTTP/2.0\r\n" + hHost + hAuth + "\r\n", 505, 0, true},
		{"version lowercase", "RFC 9112 2.3 (HTTP-name is case-sensitive); Http11Probe Compliance",
			"GET " + hTarget + " http/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"bare LF lines", "RFC 9112 2.2 (a recipient may refuse bare LF); Http11Probe Compliance",
			"GET " + hTarget + " HTTP/1.1\n" + "Host: t.example\n\n", 400, 0, true},
		{"bare CR", "RFC 9112 2.2 (a bare CR is refused or replaced)",
			"GET " + hTarget + " HTTP/1.1\r\n" + hHost + hAuth + "X-A: a\rb\r\n\r\n", 400, 0, true},
		{"origin-form", "RFC 9112 3.2.1 (a forward proxy is sent absolute-form)",
			"GET / HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"asterisk-form", "RFC 9112 3.2.4 (OPTIONS * is for a server, not a proxy)",
			"OPTIONS * HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"scheme https", "RFC 9110 9.3.6 (an https:// target is tunneled with CONNECT)",
			"GET https://t.example/ HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"fragment", "RFC 9112 3.2 (no fragment in a target)",
			"GET http://t.example/#frag HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, false},
		{"user info", "RFC 9110 4.2.4 (userinfo is deprecated, refused)",
			"GET http://u:p@t.example/ HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, false},
		{"scheme ftp", "RFC 9112 3.2.2 (absolute-form of a scheme the gateway does not carry)",
			"GET ftp://t.example/ HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 400, 0, true},
		{"CONNECT without port", "RFC 9112 3.2.3 (authority-form is host:port)",
			"CONNECT t.example HTTP/1.1\r\nHost: t.example\r\n" + hAuth + "\r\n", 400, 0, false},
		{"CONNECT absolute-form", "RFC 9112 3.2.3",
			"CONNECT http://t.example:443/ HTTP/1.1\r\nHost: t.example:443\r\n" + hAuth + "\r\n", 400, 0, false},

		// Header fields.
		{"space before colon", "RFC 9112 5.1 (400); Http11Probe Smuggling",
			getWith("X-A : 1\r\n"), 400, 0, true},
		{"tab before colon", "RFC 9112 5.1; HAProxy reg-tests h1_hdr",
			getWith("X-A\t: 1\r\n"), 400, 0, true},
		{"obs-fold", "RFC 9112 5.2 (400 outside message/http); Http11Probe Compliance",
			getWith("X-A: a\r\n b\r\n"), 400, 0, true},
		{"no colon", "RFC 9112 5; Go net/http readrequest_test",
			getWith("X-A\r\n"), 400, 0, true},
		{"empty name", "RFC 9110 5.1; Http11Probe Malformed Input",
			getWith(": v\r\n"), 400, 0, true},
		{"bad name byte", "RFC 9110 5.1 (token); HAProxy reg-tests h1_hdr",
			getWith("X@A: v\r\n"), 400, 0, true},
		{"NUL in name", "Http11Probe Malformed Input",
			getWith("X\x00A: v\r\n"), 400, 0, true},
		{"NUL in value", "RFC 9110 5.5; Http11Probe Malformed Input",
			getWith("X-A: a\x00b\r\n"), 400, 0, true},
		{"DEL in value", "RFC 9110 5.5",
			getWith("X-A: a\x7fb\r\n"), 400, 0, true},
		{"smuggled field name", "PortSwigger header injection: CR in a value",
			getWith("X-A: a\rSmuggled-Field: 1\r\n"), 400, 0, true},
		{"no Host in 1.1", "RFC 9112 3.2 (400); Http11Probe Compliance",
			"GET " + hTarget + " HTTP/1.1\r\n" + hAuth + "\r\n", 400, 0, true},
		{"two Hosts", "RFC 9112 3.2 (400); Http11Probe Compliance",
			getWith("Host: u.example\r\n"), 400, 0, true},
		{"Host with space", "RFC 9112 3.2 (400 for an invalid Host); Http11Probe Malformed Input",
			"GET " + hTarget + " HTTP/1.1\r\nHost: t example\r\n" + hAuth + "\r\n", 400, 0, true},
		{"Host with user info", "RFC 9112 3.2; HAProxy reg-tests h1_host_normalization",
			"GET " + hTarget + " HTTP/1.1\r\nHost: u@t.example\r\n" + hAuth + "\r\n", 400, 0, true},
		{"no Host in 1.0", "RFC 9112 3.2 (Host is 1.1's)",
			"GET " + hTarget + " HTTP/1.0\r\n" + hAuth + "\r\n", 200, 1, true},
		{"Host differs from target", "RFC 9112 3.2.2 (a proxy goes by the target)",
			"GET " + hTarget + " HTTP/1.1\r\nHost: other.example\r\n" + hAuth + "\r\n", 200, 1, false},
		{"odd expectation", "RFC 9110 10.1.1 (417)",
			post("Expect: magic\r\nContent-Length: 3\r\n", "abc"), 417, 0, true},
		{"too many Connection options", "RFC 9110 7.6.1; the gateway's bound",
			getWith("Connection: a, b, c, d, e, f, g, h, i\r\n"), 400, 0, true},

		// Limits (gateway.max_header_bytes, gateway.max_header_fields; set
		// small for the table).
		{"fields over the limit", "the gateway's max_header_fields; Envoy and HAProxy bound them",
			getWith(manyFields(hMaxFields)), 431, 0, true},
		{"head over the limit", "the gateway's max_header_bytes; Http11Probe Malformed Input (huge headers)",
			getWith("Cookie: " + strings.Repeat("k", hMaxBytes) + "\r\n"), 431, 0, true},
		{"target over the limit", "Http11Probe Malformed Input (long URI)",
			"GET http://t.example/" + strings.Repeat("a", hMaxBytes) + " HTTP/1.1\r\n" + hHost + hAuth + "\r\n", 431, 0, true},
		{"head within the limit", "the gateway's max_header_bytes: a large head is carried",
			getWith("Cookie: " + strings.Repeat("k", hMaxBytes-1024) + "\r\n"), 200, 1, false},
		{"obs-fold in a large head", "RFC 9112 5.2; a head over the client's reader is checked as strictly",
			getWith("Cookie: " + strings.Repeat("k", hMaxBytes-2048) + "\r\nX-A: a\r\n b\r\n"), 400, 0, true},
		{"bare LF in a large head", "RFC 9112 2.2; a head over the client's reader is checked as strictly",
			getWith("Cookie: " + strings.Repeat("k", hMaxBytes-2048) + "\nX-A: a\r\n"), 400, 0, true},

		// A refused request's connection carries no second request,
		// whatever it is.
		{"after an origin-form request", "RFC 9112 5.2, 9.3.2; Http11Probe Compliance (obs-fold)",
			"GET / HTTP/1.1\r\n" + hHost + hAuth + "\r\n" + getWith("X-A: a\r\n b\r\n"), 400, 0, true},
	}
}

// The table's limits.
const (
	hMaxBytes  = 16 << 10
	hMaxFields = 30
)

// recordingProxy is a proxy that parses what it receives with net/http
// (a third parser, as squid is) and records every request it finds; it
// answers each with 200 and a short body, CONNECT with 200 and then
// reads the tunnel to its end. A stream it cannot parse is recorded as
// an error, and the connection closed.
type recordingProxy struct {
	address string
	mu      sync.Mutex
	reqs    []seenRequest
	errs    []string
	// reply (if not empty) is written as the answer to each plain
	// request, and the connection then closed.
	reply []byte
}

func newRecordingProxy(t testing.TB) *recordingProxy {
	p := &recordingProxy{}
	p.address = serveAddr(t, p.serve)
	return p
}

func (p *recordingProxy) addr() string { return p.address }

func (p *recordingProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		if _, err := br.Peek(1); err != nil {
			return // the gateway closed it: at a boundary
		}
		r, err := http.ReadRequest(br)
		if err != nil {
			p.fail("request: " + err.Error())
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			p.fail("body: " + err.Error())
			return
		}
		p.mu.Lock()
		p.reqs = append(p.reqs, seenRequest{method: r.Method, uri: r.RequestURI, host: r.Host, proto: r.Proto, header: r.Header, body: body})
		p.mu.Unlock()
		if r.Method == http.MethodConnect {
			_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			_, _ = io.Copy(io.Discard, br)
			return
		}
		p.mu.Lock()
		reply := p.reply
		p.mu.Unlock()
		if len(reply) > 0 {
			_, _ = c.Write(reply)
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// fail records an error of a stream the gateway sent, unless the
// connection merely ended (the gateway closed it mid-body: a client's
// body refused).
func (p *recordingProxy) fail(what string) {
	if strings.Contains(what, "EOF") || strings.Contains(what, "use of closed") || strings.Contains(what, "reset by peer") {
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, what)
	p.mu.Unlock()
}

func (p *recordingProxy) seen() ([]seenRequest, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.reqs...), append([]string(nil), p.errs...)
}

// smuggled says whether r is a request nobody sent as one.
func smuggled(r seenRequest) bool {
	if strings.Contains(strings.ToLower(r.uri), "smuggled") {
		return true
	}
	for k := range r.header {
		if strings.Contains(strings.ToLower(k), "smuggled") {
			return true
		}
	}
	return false
}

// openFDs is how many descriptors the process has open.
func openFDs(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}

// sendHostile sends c.raw on a new connection to g and returns the
// status of the answer (0: none) and whether the connection then closed.
func sendHostile(t *testing.T, g *testGateway, raw string) (status int, closed bool) {
	t.Helper()
	rc := dialGateway(t, g)
	defer rc.c.Close()
	// A refused request may be closed while it is still being written:
	// a failed write is the close the case may want.
	_, _ = io.WriteString(rc.c, raw)
	_ = rc.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("no answer and no close within 15s")
		}
		return 0, true
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Closed: EOF (or a reset) next, or nothing else sent but another
	// answer to a pipelined request that was the client's own.
	_ = rc.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	for {
		next, err := http.ReadResponse(rc.br, nil)
		if err != nil {
			var ne net.Error
			return resp.StatusCode, !(errors.As(err, &ne) && ne.Timeout())
		}
		_, _ = io.Copy(io.Discard, next.Body)
		next.Body.Close()
	}
}

// TestHostileRequests runs the table against a gateway in front of a
// recording proxy.
func TestHostileRequests(t *testing.T) {
	// The runtime's poller and the test's own descriptors come first.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	ignore := goleak.IgnoreCurrent()
	fds := openFDs(t)

	t.Run("table", func(t *testing.T) {
		up := newRecordingProxy(t)
		g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), func(c *Config) {
			c.MaxHeaderBytes = hMaxBytes
			c.MaxHeaderFields = hMaxFields
			c.HeaderTimeout = 5 * time.Second
		})
		for _, c := range hostileCases() {
			t.Run(c.name, func(t *testing.T) {
				before, _ := up.seen()
				status, closed := sendHostile(t, g, c.raw)
				if status != c.status {
					t.Errorf("answered %d, want %d (%s)", status, c.status, c.src)
				}
				if c.closes && !closed {
					t.Errorf("the connection stays open (%s)", c.src)
				}
				after, errs := up.seen()
				if got := len(after) - len(before); got != c.proxied {
					t.Errorf("the proxy parsed %d requests, want %d (%s): %+v", got, c.proxied, c.src, after[len(before):])
				}
				for _, r := range after[len(before):] {
					if smuggled(r) {
						t.Errorf("a smuggled request reached the proxy: %s %s %v", r.method, r.uri, r.header)
					}
				}
				if len(errs) > 0 {
					t.Errorf("the proxy could not parse what it was sent: %v", errs)
				}
				// The gateway is alive and answers a good request.
				if st, _ := sendHostile(t, g, getWith("Connection: close\r\n")); st != 200 {
					t.Fatalf("a good request after the case: %d", st)
				}
			})
		}
	})
	// The subtest's cleanups stopped the gateway and the proxy.
	poll.Until(t, "the descriptors closed", 10*time.Second, func() bool { return openFDs(t) <= fds })
	goleak.VerifyNone(t, ignore)
}
