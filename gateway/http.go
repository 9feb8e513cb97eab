package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// realm is the Basic realm the gateway asks credentials for.
const realm = `Basic realm="proxyfleet"`

// ServeHTTP is the HTTP forward proxy: CONNECT and absolute-URI requests.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.track.add()
	defer g.track.done()
	kind := kindHTTP
	if r.Method == http.MethodConnect {
		kind = kindConnect
	}
	if closeAfter(r) {
		w.Header().Set("Connection", "close")
	}
	// net/http bounds the head's bytes (Server.MaxHeaderBytes) but not
	// its fields: counted here, before the credential is looked at.
	if n := fieldCount(r); n > g.cfg.MaxHeaderFields {
		g.m.request(kind, outcomeError).Inc()
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("more than %d header fields", g.cfg.MaxHeaderFields), http.StatusRequestHeaderFieldsTooLarge)
		return
	}
	u, o, ok := g.authHTTP(w, r, kind)
	if !ok {
		return
	}
	if !u.acquire() {
		g.m.request(kind, outcomeLimit).Inc()
		http.Error(w, fmt.Sprintf("too many connections at once for this user (at most %d)", u.max), http.StatusTooManyRequests)
		return
	}
	handed := false // a tunnel took the user's slot over
	defer func() {
		if !handed {
			u.release()
		}
	}()
	if err := o.withHeaders(r.Header.Get(HeaderSession), r.Header.Get(HeaderLabels), r.Header.Get(HeaderBan)); err != nil {
		g.m.request(kind, outcomeError).Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// What is in flight stops when the request ends or the drain runs
	// out (the server's BaseContext is g.hard).
	ctx := r.Context()

	g.m.flight(kind).Inc()
	if kind == kindConnect {
		handed = g.serveConnect(ctx, w, r, u, o)
		if !handed {
			g.m.flight(kind).Dec()
		}
		return
	}
	defer g.m.flight(kind).Dec()
	g.servePlain(ctx, w, r, o)
}

// connKey carries a slow-path request's connection in its context
// (Server.ConnContext).
type connKey struct{}

// fieldCount is how many header field lines r came with, as the lean
// parser counts them (Host, which net/http takes out of the header, and
// Transfer-Encoding each count one).
func fieldCount(r *http.Request) int {
	n := 0
	for _, vs := range r.Header {
		n += len(vs)
	}
	if r.Host != "" {
		n++
	}
	if len(r.TransferEncoding) > 0 {
		n++
	}
	return n
}

// closeAfter says whether the connection closes after the answer to r:
// a chunked request. net/http drops a Content-Length that came with
// Transfer-Encoding: chunked before the handler sees it, so the slow
// path cannot tell such a request (which RFC 9112 6.1 says must close
// the connection) from a plain chunked one, and closes after both: a
// chunked upload costs a new connection, never a request smuggled
// behind it.
func closeAfter(r *http.Request) bool {
	return len(r.TransferEncoding) > 0
}

// authHTTP checks Proxy-Authorization; without or with a wrong one it
// answers 407 and counts it (a wrong one closes the connection). A
// credential from a source address that failed too often lately is
// refused unchecked: 429 with Retry-After, and the connection closes.
func (g *Gateway) authHTTP(w http.ResponseWriter, r *http.Request, kind string) (*user, options, bool) {
	h := r.Header.Get("Proxy-Authorization")
	reason := authMissing
	if h != "" {
		src := sourceOfString(r.RemoteAddr)
		now := g.cfg.Now()
		if wait, blocked := g.authThrottle.blocked(src, now); blocked {
			g.m.request(kind, outcomeThrottled).Inc()
			g.m.authFailures.WithLabelValues(kind, authThrottled).Inc()
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter(wait)))
			http.Error(w, "too many failed credentials from this address", http.StatusTooManyRequests)
			return nil, options{}, false
		}
		reason = authWrong
		if name, pw, ok := basicCredentials(h); ok {
			u, o, err := g.users.check(name, pw)
			if err == nil {
				if pc, ok := r.Context().Value(connKey{}).(*prefixConn); ok {
					pc.unauth.release()
				}
				return u, o, true
			}
			if !errors.Is(err, errAuth) {
				g.m.request(kind, outcomeError).Inc()
				http.Error(w, err.Error(), http.StatusBadRequest)
				return nil, o, false
			}
		}
		g.authThrottle.fail(src, now)
		w.Header().Set("Connection", "close") // a wrong credential ends the connection
	}
	g.m.request(kind, outcomeAuth).Inc()
	g.m.authFailures.WithLabelValues(kind, reason).Inc()
	g.log.Debug("gateway: authentication failed", "kind", kind, "reason", reason, "remote", r.RemoteAddr)
	w.Header().Set("Proxy-Authenticate", realm)
	http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
	return nil, options{}, false
}

// answerFailure answers a request no proxy carried: 403 for a denied
// destination, 503 when none matched, 502 when those tried failed, and
// counts it.
func (g *Gateway) answerFailure(w http.ResponseWriter, kind string, err error) {
	var empty *emptyError
	var failed *allFailed
	var denied *deniedError
	var banned *bannedError
	switch {
	case errors.As(err, &denied):
		g.m.request(kind, outcomeDenied).Inc()
		http.Error(w, denied.Error(), http.StatusForbidden)
	case errors.As(err, &banned):
		g.m.request(kind, outcomeBanned).Inc()
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter(g.cfg.RetryAfter)))
		http.Error(w, banned.Error(), http.StatusServiceUnavailable)
	case errors.As(err, &empty):
		g.m.request(kind, outcomeEmpty).Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Max(1, math.Ceil(g.cfg.RetryAfter.Seconds())))))
		http.Error(w, empty.Error(), http.StatusServiceUnavailable)
	case errors.As(err, &failed):
		g.m.request(kind, outcomeUpstreamFailed).Inc()
		http.Error(w, failed.Error(), http.StatusBadGateway)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		g.m.request(kind, outcomeClientGone).Inc()
	default:
		g.m.request(kind, outcomeError).Inc()
		g.log.Error("gateway: request failed", "kind", kind, "err", err)
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
}

// serveConnect opens a tunnel through a proxy and answers 200 with the
// proxy's id; then the tunnel runs in goroutines of the gateway and the
// handler returns (so the server's buffers go). It says whether the
// tunnel took the request over (the user's slot, the in-flight count).
func (g *Gateway) serveConnect(ctx context.Context, w http.ResponseWriter, r *http.Request, u *user, o options) bool {
	target, err := parseHostPort(r.Host)
	if err != nil {
		// Refused before a proxy is picked: no proxy hears of it.
		g.m.request(kindConnect, outcomeError).Inc()
		http.Error(w, fmt.Sprintf("CONNECT %q: %v", r.Host, err), http.StatusBadRequest)
		return false
	}
	var up net.Conn
	var leftover []byte
	var egress netip.Addr
	p, err := g.attempts(ctx, kindConnect, target.host, o, func(at *attempt) (bool, error) {
		var err error
		egress = at.egress
		up, leftover, err = g.dialConnect(ctx, at.p, target, egress)
		return true, err
	})
	var ta *targetAnswer
	if errors.As(err, &ta) {
		g.m.request(kindConnect, outcomeOK).Inc()
		w.Header().Set(HeaderProxy, p.ID)
		if egress.IsValid() {
			w.Header().Set(HeaderEgress, egress.String())
		}
		w.Header().Set("X-Squid-Error", ta.squidError)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(ta.status)
		_, _ = w.Write(ta.body)
		return false
	}
	if err != nil {
		g.answerFailure(w, kindConnect, err)
		return false
	}
	client, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		g.m.request(kindConnect, outcomeError).Inc()
		g.log.Error("gateway: hijack", "err", err)
		http.Error(w, "cannot tunnel on this connection", http.StatusInternalServerError)
		return false
	}
	fail := func(err error) bool {
		client.Close()
		up.Close()
		g.m.request(kindConnect, outcomeClientGone).Inc()
		g.log.Debug("gateway: client left as its tunnel opened", "err", err)
		return false
	}
	if err := client.SetDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n"+HeaderProxy+": "+p.ID+"\r\n"+egressLine(egress)+"\r\n"); err != nil {
		return fail(err)
	}
	// What the client sent after its CONNECT (a TLS hello) is in the
	// server's buffer: pass it on, then let the buffers go.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			return fail(err)
		}
	}
	rw = nil
	// A connection the lean path handed over: what is left of what it
	// had read comes next; then the bare TCP connection (pump splices).
	if pc, ok := client.(*prefixConn); ok {
		if len(pc.prefix) > 0 {
			if _, err := up.Write(pc.prefix); err != nil {
				return fail(err)
			}
		}
		client = pc.Conn
	}
	if len(leftover) > 0 {
		if _, err := client.Write(leftover); err != nil {
			return fail(err)
		}
	}
	g.m.request(kindConnect, outcomeOK).Inc()
	release := g.picker.Acquire(p)
	t := &tunnel{g: g, proxyID: p.ID, client: client, up: up, onDone: func() {
		release()
		u.release()
		g.m.flight(kindConnect).Dec()
	}}
	g.track.add(client, up)
	go t.run()
	return true
}

// hopHeaders are a connection's own, never forwarded (RFC 9110 7.6.1),
// with the gateway's own request headers.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", HeaderSession, HeaderLabels, HeaderEgress, HeaderBan,
}

func removeHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// errIdleBody: the request's body stopped coming for IdleTimeout (the
// client's doing, as its leaving is).
var errIdleBody = fmt.Errorf("request body idle: %w", errClientLeft)

// idleBody is a request body read under a deadline IdleTimeout after
// its last byte (net/http's connection's read deadline, moved on as
// bytes come, and cleared once it is read whole: net/http's own read
// of the connection, while the answer goes, must not meet it).
type idleBody struct {
	idled atomic.Bool // a read met the deadline
	g     *Gateway
	rc    io.ReadCloser
	ctl   *http.ResponseController
	until time.Time
}

func (g *Gateway) idleBody(w http.ResponseWriter, rc io.ReadCloser) *idleBody {
	return &idleBody{g: g, rc: rc, ctl: http.NewResponseController(w)}
}

func (b *idleBody) Read(p []byte) (int, error) {
	idle := b.g.cfg.IdleTimeout
	if now := time.Now(); b.until.Sub(now) < idle-idle/8 {
		b.until = now.Add(idle)
		_ = b.ctl.SetReadDeadline(b.until)
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		_ = b.ctl.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		if b.idled.CompareAndSwap(false, true) {
			b.g.m.idleBody.Inc()
		}
	}
	return n, err
}

func (b *idleBody) Close() error { return b.rc.Close() }

// trackedBody is a request body the transport may close without closing
// the client's, and that says whether any of it was read (a request
// whose body was not touched can be sent again).
type trackedBody struct {
	rc   io.ReadCloser
	read atomic.Int64
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *trackedBody) Close() error { return nil }

// servePlain forwards an absolute-URI request to a proxy and streams the
// answer back with the proxy's id.
func (g *Gateway) servePlain(ctx context.Context, w http.ResponseWriter, r *http.Request, o options) {
	if !r.URL.IsAbs() || r.URL.Host == "" || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		g.m.request(kindHTTP, outcomeError).Inc()
		http.Error(w, "this is a proxy: send CONNECT or an absolute http:// URI", http.StatusBadRequest)
		return
	}
	// The authority goes to the proxy (the request line, Host, or the
	// transport's CONNECT for https://) only if it passes the target
	// rule; refused, no proxy hears of it.
	if !validAuthority(r.URL.Host) {
		g.m.request(kindHTTP, outcomeError).Inc()
		http.Error(w, fmt.Sprintf("URI host %q: %v", r.URL.Host, errAuthority), http.StatusBadRequest)
		return
	}
	hasBody := r.Body != nil && r.Body != http.NoBody
	var ib *idleBody
	if hasBody {
		ib = g.idleBody(w, r.Body)
		r.Body = ib
	}
	// A small body of known length (at most RetryBodyBytes) is held
	// whole, so another proxy may be sent it.
	var held []byte
	if hasBody && r.ContentLength >= 0 && r.ContentLength <= int64(g.cfg.RetryBodyBytes) {
		held = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, held); err != nil {
			g.m.request(kindHTTP, outcomeClientGone).Inc()
			g.log.Debug("gateway: request body not received", "err", err)
			panic(http.ErrAbortHandler) // no answer: the connection closes
		}
	}
	var resp *http.Response
	var up int64
	var egress netip.Addr
	var cancels []context.CancelCauseFunc
	defer func() {
		for _, c := range cancels {
			c(nil)
		}
	}()
	p, err := g.attempts(ctx, kindHTTP, r.URL.Hostname(), o, func(at *attempt) (bool, error) {
		p := at.p
		pu := &url.URL{Scheme: "http", Host: p.Addr}
		if g.cfg.UpstreamUser != "" {
			pu.User = url.UserPassword(g.cfg.UpstreamUser, g.cfg.UpstreamPassword)
		}
		// The attempt is a flight (failover.go): ended early, its
		// context is cancelled. The answer's body is read under it, so
		// it is cancelled only once the handler returns.
		actx, cancel := context.WithCancelCause(ctx)
		cancels = append(cancels, cancel)
		f := g.begin(p, func() { cancel(nil) })
		actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			f.carry(info.Conn, time.Now())
			if info.Reused && idleDead(info.Conn, info.IdleTime) {
				f.end(errSilent)
			}
		}})
		out := r.Clone(context.WithValue(actx, proxyURLKey{}, pu))
		out.RequestURI = ""
		out.Host = r.URL.Host // the authority checked above (net/http's r.Host for an absolute URI)
		out.Close = false
		removeHop(out.Header)
		if egress = at.egress; egress.IsValid() {
			out.Header.Set(HeaderEgress, egress.String())
		}
		var tb *trackedBody
		if held != nil {
			out.Body = io.NopCloser(bytes.NewReader(held))
		} else if hasBody {
			tb = &trackedBody{rc: r.Body}
			out.Body = tb
		} else {
			out.Body = nil
		}
		sent := time.Now()
		rsp, err := g.transport.RoundTrip(out)
		firstByte := time.Since(sent)
		g.land(f)
		if tb != nil {
			up += tb.read.Load()
		} else if err == nil {
			up += int64(len(held))
		}
		// Another attempt may follow if the request can be sent again:
		// it has no body, the body is held, or the proxy took none of it.
		retryable := tb == nil || tb.read.Load() == 0
		if fe := f.err(); fe != nil && ctx.Err() == nil {
			// Ended by the watcher (if just as the answer came, its
			// context is cancelled all the same).
			if err == nil {
				rsp.Body.Close()
			}
			return retryable, fe
		}
		if err != nil {
			if ib != nil && ib.idled.Load() {
				return false, errIdleBody // the client's doing: no proxy's failure
			}
			return retryable, err
		}
		if rsp.StatusCode == http.StatusProxyAuthRequired {
			// The proxy's own answer: our credential is not its.
			rsp.Body.Close()
			return retryable, &upstreamError{causeStatus, "answered 407 Proxy Authentication Required"}
		}
		if g.rules.Len() > 0 {
			var body []byte
			if at.sc.needsBody() {
				body, rsp.Body = peekBody(rsp.Body, g.cfg.BodyPeek)
			}
			if g.judge(at, rsp.StatusCode, body, firstByte, !hasBody || held != nil) {
				rsp.Body.Close() // dropped: the request goes to another address
				return true, errRuleRetry
			}
		}
		resp, at.status = rsp, rsp.StatusCode
		return true, nil
	})
	g.m.bytesUp.Add(float64(up))
	if errors.Is(err, errIdleBody) {
		g.m.request(kindHTTP, outcomeClientGone).Inc()
		panic(http.ErrAbortHandler) // no answer: the connection closes
	}
	if err != nil {
		g.answerFailure(w, kindHTTP, err)
		return
	}
	defer resp.Body.Close()
	release := g.picker.Acquire(p)
	defer release()
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	removeHop(h)
	if closeAfter(r) {
		h.Set("Connection", "close")
	}
	h.Set(HeaderProxy, p.ID)
	if egress.IsValid() {
		h.Set(HeaderEgress, egress.String())
	}
	w.WriteHeader(resp.StatusCode)
	n, err := copyFlush(w, resp.Body)
	g.m.bytesDown.Add(float64(n))
	if err != nil && ctx.Err() != nil {
		g.m.request(kindHTTP, outcomeClientGone).Inc()
		return
	}
	g.m.request(kindHTTP, outcomeOK).Inc()
}

// peekBody reads up to n bytes of an answer's body (fewer when it is
// shorter, or fails) and returns them with a body that reads them again
// first, then the rest.
func peekBody(body io.ReadCloser, n int) ([]byte, io.ReadCloser) {
	b := make([]byte, n)
	k, err := io.ReadFull(body, b)
	b = b[:k]
	rest := io.Reader(body)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		rest = errReader{err}
	}
	return b, struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), rest), body}
}

// errReader fails every read with its error.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyFlush streams body to w, flushing after every read, so a slow or
// endless answer reaches the client as it comes.
func copyFlush(w http.ResponseWriter, body io.Reader) (int64, error) {
	rc := http.NewResponseController(w)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			m, werr := w.Write(buf[:k])
			n += int64(m)
			if werr != nil {
				return n, werr
			}
			if err := rc.Flush(); err != nil {
				return n, err
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
