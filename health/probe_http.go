package health

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"proxyfleet/messages"
)

// maxProbeBody bounds what a probe reads of the target's answer.
const maxProbeBody = 64 << 10

// HTTPProber probes a proxy by sending a request through it, as an HTTP
// forward proxy, to Target: a GET with an absolute URI for an http target,
// CONNECT then TLS and a GET for an https one, each written by hand on a
// connection of its own. It adds a fresh random nonce to the target's query
// (nonce=...) and passes if the answer is a 200 whose body contains Expect
// or, when Expect is empty, the nonce: so a proxy answering from a cache,
// an error page or a captive portal fails, and so does anything that
// merely accepts a TCP connection.
//
// With credentials (WithCredentials) every request carries
// Proxy-Authorization: Basic on the GET (http) or on the CONNECT (https),
// and Check can also send the same request without them (the open check).
// The credentials never appear in an error it returns: anything the proxy
// sends back is scrubbed of them.
//
// When the target is health's own /probe (ProbeHandler), its answer also
// reports the address the request came from (the proxy's egress) and the
// headers that reached it; Check compares them with the client's address
// (this end of the connection to the proxy) and looks for the
// credentials (see Findings). Another target reports nothing: no egress,
// no leak verdict.
//
// Connections are not kept alive: probing thousands of proxies must not
// hold thousands of idle sockets.
type HTTPProber struct {
	Target *url.URL
	Expect string

	dialer    *net.Dialer
	tlsConfig *tls.Config // for https targets
	auth      bool        // credentials are sent
	secrets   []string    // what must never appear in an error: the credentials, longest first

	// The request without its nonce: head is up to the query's nonce
	// value, tail what follows it up to the egress line (see
	// CheckEgress), with and without credentials, then endGet (for an
	// https target, the GET inside the tunnel, which never carries them).
	head, tail, tailNoAuth string
	// For an https target, the CONNECT request up to the egress line,
	// with and without credentials, then the empty line.
	connect, connectNoAuth string
}

// endGet ends a probe's GET, after its egress line if any.
const endGet = "Connection: close\r\n\r\n"

// A ProberOption configures an HTTPProber.
type ProberOption func(*proberOptions)

type proberOptions struct {
	user, password string
	tls            *tls.Config
}

// WithCredentials has every probe carry Proxy-Authorization: Basic
// base64(user:password). An empty user sends none.
func WithCredentials(user, password string) ProberOption {
	return func(o *proberOptions) { o.user, o.password = user, password }
}

// WithTLSConfig is the TLS configuration of probes of an https target
// (default: the system's roots; the target's host name is checked).
func WithTLSConfig(c *tls.Config) ProberOption {
	return func(o *proberOptions) { o.tls = c }
}

// NewHTTPProber returns a prober of target (an http or https URL) that
// checks for expect (empty: the nonce).
func NewHTTPProber(target, expect string, opts ...ProberOption) (*HTTPProber, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("probe target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("probe target %q: want http(s)://host[:port]/path", target)
	}
	var o proberOptions
	for _, opt := range opts {
		opt(&o)
	}
	if strings.Contains(o.user, ":") || strings.ContainsFunc(o.user+o.password, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		// RFC 7617: the user-id cannot hold a colon, and neither holds
		// control characters. Not named: it may be a password pasted in
		// the wrong field.
		return nil, errors.New("probe credentials: the user may not contain ':' and neither may contain control characters")
	}
	p := &HTTPProber{Target: u, Expect: expect, dialer: &net.Dialer{KeepAlive: -1}}
	authLine := ""
	if o.user != "" {
		token := base64.StdEncoding.EncodeToString([]byte(o.user + ":" + o.password))
		authLine = "Proxy-Authorization: Basic " + token + "\r\n"
		p.auth = true
		p.secrets = []string{token, o.user + ":" + o.password}
		if o.password != "" {
			p.secrets = append(p.secrets, o.password)
		}
		slices.SortFunc(p.secrets, func(a, b string) int { return len(b) - len(a) })
	}

	// The bytes net/http would send with keep-alives off, without its
	// per-connection goroutines and buffers.
	q := u.Query()
	q.Del(NonceParam)
	query := q.Encode()
	if query != "" {
		query += "&"
	}
	uri := *u
	uri.User, uri.RawQuery, uri.ForceQuery, uri.Fragment, uri.RawFragment = nil, "", false, "", ""
	if uri.Path == "" && uri.RawPath == "" {
		uri.Path = "/"
	}
	const fixed = "User-Agent: proxyfleet-health\r\nCache-Control: no-cache\r\n"
	if u.Scheme == "http" {
		p.head = "GET " + uri.String() + "?" + query + NonceParam + "="
		p.tail = " HTTP/1.1\r\nHost: " + u.Host + "\r\n" + fixed + authLine
		p.tailNoAuth = " HTTP/1.1\r\nHost: " + u.Host + "\r\n" + fixed
		return p, nil
	}
	hostPort := u.Host
	if u.Port() == "" {
		hostPort = net.JoinHostPort(u.Hostname(), "443")
	}
	p.connect = "CONNECT " + hostPort + " HTTP/1.1\r\nHost: " + hostPort + "\r\nUser-Agent: proxyfleet-health\r\n" + authLine
	p.connectNoAuth = "CONNECT " + hostPort + " HTTP/1.1\r\nHost: " + hostPort + "\r\nUser-Agent: proxyfleet-health\r\n"
	p.head = "GET " + uri.RequestURI() + "?" + query + NonceParam + "="
	p.tail = " HTTP/1.1\r\nHost: " + u.Host + "\r\n" + fixed
	p.tailNoAuth = p.tail
	if o.tls != nil {
		p.tlsConfig = o.tls.Clone()
	} else {
		p.tlsConfig = &tls.Config{}
	}
	if p.tlsConfig.ServerName == "" {
		p.tlsConfig.ServerName = u.Hostname()
	}
	p.tlsConfig.NextProtos = []string{"http/1.1"}
	return p, nil
}

// Families is the family of the addresses a probe can name: IPv6 for a
// target whose host is an IPv6 address, else IPv4 (a name is taken to be
// reached over IPv4: a proxy uses a named address only over its family).
func (p *HTTPProber) Families() Families {
	if a, err := netip.ParseAddr(p.Target.Hostname()); err == nil && a.Unmap().Is6() {
		return FamilyIPv6
	}
	return FamilyIPv4
}

// ChecksOpen reports whether the prober sends credentials, and so can
// check that a proxy refuses a request without them.
func (p *HTTPProber) ChecksOpen() bool { return p.auth }

// Probe sends one request through the proxy at addr.
func (p *HTTPProber) Probe(ctx context.Context, addr string) error {
	return p.Check(ctx, addr, false).Err
}

// Check sends one request through the proxy at addr, with the credentials,
// and checks the answer; if it passed, it compares what the target
// reported with what was sent (egress, leak) and, with checkOpen and
// credentials, sends the same request without them: the proxy is open if
// that one reaches the target too.
func (p *HTTPProber) Check(ctx context.Context, addr string, checkOpen bool) Findings {
	return p.CheckEgress(ctx, addr, "", checkOpen)
}

// CheckEgress is Check with a request that names egress, an address of
// the proxy's, in messages.HeaderEgress (on the GET for an http target,
// on the CONNECT for an https one; "": no header): the proxy is to leave
// from it, and the target's report says whether it did.
func (p *HTTPProber) CheckEgress(ctx context.Context, addr, egress string, checkOpen bool) Findings {
	f := Findings{Kind: KindHTTP}
	if p.Target.Scheme == "https" {
		f.Kind = KindConnect
	}
	ans, err := p.request(ctx, addr, egress, true)
	if err != nil {
		f.Err = p.scrub(err)
		return f
	}
	if ans.report != nil {
		f.Egress, f.Reported, f.Leak = ans.report.Egress, true, ans.report.leak(ans.client)
	}
	if checkOpen && p.auth {
		_, err := p.request(ctx, addr, egress, false)
		f.Open, f.OpenErr = openResult(err)
		f.OpenErr = p.scrub(f.OpenErr)
	}
	return f
}

// Close does nothing: no connection is kept. (It is there for callers of
// an earlier version.)
func (p *HTTPProber) Close() {}

// answer is what one request through a proxy brought back.
type answer struct {
	report *probeReport // nil if the target reported nothing
	client netip.Addr   // this end of the connection to the proxy
}

// errNoConnection marks a request that never reached the proxy (the dial
// failed): an open check it was part of is inconclusive.
var errNoConnection = errors.New("no connection to the proxy")

// errTunnelGranted marks an https request whose CONNECT the proxy granted
// but that did not reach the target after: for an open check, inconclusive
// (the proxy opened a tunnel without credentials; whether it leads to the
// target is not known).
var errTunnelGranted = errors.New("the proxy granted the tunnel")

// openResult is the open check's result from the error of the request
// without credentials.
func openResult(err error) (string, error) {
	var ne net.Error
	switch {
	case err == nil:
		return OpenAnswered, errors.New("the request without credentials reached the target")
	case errors.Is(err, errNoConnection), errors.Is(err, errTunnelGranted),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.As(err, &ne) && ne.Timeout():
		return OpenInconclusive, err
	default:
		// A 407, a 403, another status, another body, a closed
		// connection: the proxy did not let it through.
		return OpenRefused, err
	}
}

// probeBufs are the buffers of probes.
var probeBufs = sync.Pool{New: func() any { return &probeBuf{r: bufio.NewReaderSize(nil, 4096)} }}

type probeBuf struct {
	w []byte
	r *bufio.Reader
}

// request sends one request through the proxy at addr on a connection of
// its own, closed after the answer, and checks the answer.
func (p *HTTPProber) request(ctx context.Context, addr, egress string, withAuth bool) (answer, error) {
	var ans answer
	if egress != "" {
		// Only an address, written as the proxy's rules match it: no
		// line of the request can be made of it.
		a, err := netip.ParseAddr(egress)
		if err != nil || a.Zone() != "" {
			return ans, fmt.Errorf("egress %q: not an address", egress)
		}
		egress = messages.HeaderEgress + ": " + a.Unmap().String() + "\r\n"
	}
	nonce, err := newNonce()
	if err != nil {
		return ans, err
	}
	conn, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return ans, fmt.Errorf("%w: %w", errNoConnection, err)
	}
	defer conn.Close()
	if ap, err := netip.ParseAddrPort(conn.LocalAddr().String()); err == nil {
		ans.client = ap.Addr().Unmap()
	}
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	// A cancelled probe must return at once: wake a blocked read or write.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	b := probeBufs.Get().(*probeBuf)
	defer func() {
		b.r.Reset(nil)
		probeBufs.Put(b)
	}()
	tail := p.tailNoAuth
	if withAuth {
		tail = p.tail
	}

	var rw io.ReadWriter = conn
	br := b.r // what the answer is read from
	if p.Target.Scheme == "https" {
		connect := p.connectNoAuth
		if withAuth {
			connect = p.connect
		}
		b.w = append(append(append(b.w[:0], connect...), egress...), "\r\n"...)
		egress = ""
		if _, err := conn.Write(b.w); err != nil {
			return ans, p.ctxErr(ctx, err)
		}
		b.r.Reset(conn)
		resp, err := http.ReadResponse(b.r, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return ans, p.ctxErr(ctx, err)
		}
		if resp.StatusCode != http.StatusOK {
			return ans, &ProbeError{Result: ResultStatus, Err: fmt.Errorf("CONNECT %s through %s: %s", p.Target.Host, addr, statusText(resp.StatusCode))}
		}
		tc := tls.Client(&bufferedConn{Conn: conn, r: b.r}, p.tlsConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			return ans, fmt.Errorf("%w: TLS with %s: %w", errTunnelGranted, p.Target.Host, p.ctxErr(ctx, err))
		}
		rw, br = tc, bufio.NewReaderSize(tc, 4096)
	} else {
		br.Reset(conn)
	}
	b.w = append(append(append(append(append(b.w[:0], p.head...), nonce...), tail...), egress...), endGet...)
	if _, err := rw.Write(b.w); err != nil {
		return ans, tunnel(p.Target.Scheme, p.ctxErr(ctx, err))
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return ans, tunnel(p.Target.Scheme, p.ctxErr(ctx, err))
	}
	// The body is not closed: closing would read what is left of it,
	// and the connection is closed anyway.
	report, err := p.check(resp, addr, nonce)
	if err != nil {
		return ans, tunnel(p.Target.Scheme, p.ctxErr(ctx, err))
	}
	ans.report = report
	return ans, nil
}

// tunnel marks an error after a granted CONNECT (see errTunnelGranted),
// unless it is the target's own answer (a status or a body): for an open
// check, the proxy let the request through to something.
func tunnel(scheme string, err error) error {
	var pe *ProbeError
	if scheme != "https" || err == nil || errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%w: %w", errTunnelGranted, err)
}

// bufferedConn reads what the proxy sent after its answer to CONNECT from
// the reader that read that answer.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// ctxErr returns ctx's error for an error caused by its end (the deadline
// set on the connection), so that a probe out of time reads as one.
func (p *HTTPProber) ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		var pe *ProbeError
		if !errors.As(err, &pe) {
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
	return err
}

// statusText is a status for an error: the code and its standard text,
// never the proxy's own reason phrase (which could echo anything sent).
func statusText(code int) string {
	return fmt.Sprintf("%d %s", code, http.StatusText(code))
}

// check passes a 200 answer whose body holds the expected value, and reads
// the target's report if the body is one (see ProbeHandler).
func (p *HTTPProber) check(resp *http.Response, addr, nonce string) (*probeReport, error) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &ProbeError{Result: ResultStatus, Err: fmt.Errorf("%s through %s: %s", p.Target.Redacted(), addr, statusText(resp.StatusCode))}
	}
	want := p.Expect
	if want == "" {
		want = nonce
	}
	if !strings.Contains(string(body), want) {
		return nil, &ProbeError{Result: ResultBody, Err: fmt.Errorf("%s through %s: the answer lacks the expected value", p.Target.Redacted(), addr)}
	}
	return parseReport(body, nonce), nil
}

// scrub returns err with the credentials cut out of its text: a proxy's
// answer (an echoed request in a malformed response) may hold them. The
// error returned keeps the original's class (a timeout, a ProbeError's
// result) but not the original, which could be printed.
func (p *HTTPProber) scrub(err error) error {
	if err == nil || len(p.secrets) == 0 {
		return err
	}
	msg := err.Error()
	clean := msg
	for _, s := range p.secrets {
		clean = strings.ReplaceAll(clean, s, "[redacted]")
	}
	if clean == msg {
		return err
	}
	r := &redactedError{msg: clean, result: classify(err)}
	r.noConn, r.tunnel = errors.Is(err, errNoConnection), errors.Is(err, errTunnelGranted)
	var pe *ProbeError
	if errors.As(err, &pe) {
		return &ProbeError{Result: pe.Result, Err: r}
	}
	return r
}

// redactedError is an error whose text had credentials cut out.
type redactedError struct {
	msg            string
	result         string
	noConn, tunnel bool
}

func (e *redactedError) Error() string   { return e.msg }
func (e *redactedError) Timeout() bool   { return e.result == ResultTimeout }
func (e *redactedError) Temporary() bool { return false }
func (e *redactedError) Is(target error) bool {
	return (target == errNoConnection && e.noConn) || (target == errTunnelGranted && e.tunnel)
}

func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
