package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"proxyfleet/gateway/h1"
)

// upstreamError is a proxy's failure of one attempt: it is reported,
// counted by cause, and the request is tried on another proxy.
type upstreamError struct {
	cause  string // causeRefused, ...
	reason string // what the report and the client's 502 say
}

func (e *upstreamError) Error() string { return e.reason }

// targetAnswer is a proxy's answer to CONNECT that speaks for the target
// (squid marks its own error pages with X-Squid-Error: the target did
// not answer, its name did not resolve, the port is not allowed): it is
// passed on to the client, not held against the proxy.
type targetAnswer struct {
	status     int
	statusText string
	squidError string
	body       []byte
}

func (e *targetAnswer) Error() string {
	return fmt.Sprintf("the proxy answered CONNECT %d %s (%s)", e.status, e.statusText, e.squidError)
}

// errConnectTimeout: the proxy did not accept, or did not answer
// CONNECT, within ConnectTimeout.
var errConnectTimeout = errors.New("connect timeout")

// dialError marks an error of the dial to a proxy (nothing was sent).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dial connects to a proxy within ConnectTimeout, observing the latency.
func (g *Gateway) dial(ctx context.Context, addr string) (net.Conn, error) {
	start := g.cfg.Now()
	dctx, cancel := context.WithTimeout(ctx, g.cfg.ConnectTimeout)
	defer cancel()
	c, err := g.dialer.DialContext(dctx, "tcp", addr)
	g.m.connectDur.Observe(g.cfg.Now().Sub(start).Seconds())
	if err != nil {
		if ctx.Err() == nil && dctx.Err() != nil {
			err = errConnectTimeout
		}
		return nil, &dialError{err}
	}
	return c, nil
}

// classify turns an attempt's error into its cause and reason, with the
// fleet's password never in it.
func (g *Gateway) classify(err error) *upstreamError {
	var ue *upstreamError
	if errors.As(err, &ue) {
		return ue
	}
	var ne net.Error
	switch {
	case errors.Is(err, errResponseTimeout):
		return &upstreamError{causeTimeout, errResponseTimeout.Error()}
	case errors.As(err, &ne) && ne.Timeout() && strings.Contains(err.Error(), "awaiting response headers"):
		// http.Transport's ResponseHeaderTimeout: no other way to tell it.
		return &upstreamError{causeTimeout, "no answer within the response timeout"}
	case errors.Is(err, errConnectTimeout), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return &upstreamError{causeTimeout, "connect timeout"}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &upstreamError{causeRefused, "connect: connection refused"}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return &upstreamError{causeReset, "connection reset"}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &upstreamError{causeReset, "connection closed before an answer"}
	}
	s := err.Error()
	if p := g.cfg.UpstreamPassword; p != "" {
		s = strings.ReplaceAll(s, p, "***")
	}
	return &upstreamError{causeOther, s}
}

// reqBufSize is the capacity of a pooled CONNECT request's buffer; one
// grown past it (a long host name) is not given back.
const reqBufSize = 512

// reqBufs are the buffers the requests CONNECT are written from.
var reqBufs = sync.Pool{New: func() any { b := make([]byte, 0, reqBufSize); return &b }}

// readers are the small buffers the answers to CONNECT are read with.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

// aLongTimeAgo is a deadline in the past: it unblocks a conn at once.
var aLongTimeAgo = time.Unix(1, 0)

// dialConnect opens a tunnel to target through p: connect, CONNECT with
// the fleet's credential, wait for 200, all within ConnectTimeout; a
// flight until the answer (failover.go).
// leftover is what the proxy sent after its answer (a server-first
// protocol's greeting), to be passed on first. target is a hostPort, so
// the request line and Host carry nothing but a host and a port.
//
// egress, if valid, is the address of p's the tunnel is to leave from
// (HeaderEgress).
func (g *Gateway) dialConnect(ctx context.Context, p Proxy, target hostPort, egress netip.Addr) (up net.Conn, leftover []byte, err error) {
	start := g.cfg.Now()
	f := g.begin(p, nil)
	defer g.land(f)
	if err := f.err(); err != nil {
		return nil, nil, err
	}
	c, err := g.dial(ctx, p.Addr)
	if err != nil {
		return nil, nil, err
	}
	f.carry(c, time.Now())
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	deadline := start.Add(g.cfg.ConnectTimeout)
	if err := c.SetDeadline(deadline); err != nil {
		return nil, nil, err
	}
	// A client seen leaving (watch) ends the wait at once.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	defer stop()

	rb := reqBufs.Get().(*[]byte)
	b := append((*rb)[:0], "CONNECT "...)
	b = target.appendTo(b)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = target.appendTo(b)
	b = append(b, "\r\n"...)
	if g.upstreamAuth != "" {
		b = append(b, "Proxy-Authorization: "...)
		b = append(b, g.upstreamAuth...)
		b = append(b, "\r\n"...)
	}
	b = appendEgressLine(b, egress)
	b = append(b, "\r\n"...)
	_, err = c.Write(b)
	if cap(b) <= reqBufSize {
		*rb = b[:0]
		reqBufs.Put(rb)
	}
	if err != nil {
		return nil, nil, g.ctxErr(ctx, err)
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	defer func() {
		br.Reset(nil)
		readers.Put(br)
	}()
	var h h1.Head
	if err := readConnectAnswer(br, &h); err != nil {
		if fe := f.err(); fe != nil && ctx.Err() == nil {
			return nil, nil, fe
		}
		return nil, nil, g.ctxErr(ctx, err)
	}
	if status := h.Status(); status != http.StatusOK {
		text := string(h.Line[2])
		if se := squidError(&h); se != "" && status != http.StatusProxyAuthRequired {
			body := readAnswerBody(br, &h, targetBodyBytes)
			return nil, nil, &targetAnswer{status: status, statusText: text, squidError: se, body: body}
		}
		return nil, nil, &upstreamError{causeStatus, fmt.Sprintf("CONNECT answered %d %s", status, text)}
	}
	if !stop() {
		return nil, nil, ctx.Err()
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		leftover = append([]byte(nil), b...)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, nil, err
	}
	ok = true
	return c, leftover, nil
}

// targetAnswerOf is err's *targetAnswer (nil: none; without an error
// nothing is allocated for the look).
func targetAnswerOf(err error) *targetAnswer {
	if err == nil {
		return nil
	}
	var ta *targetAnswer
	if errors.As(err, &ta) {
		return ta
	}
	return nil
}

// targetBodyBytes bounds the body of a target's failure passed on.
const targetBodyBytes = 8 << 10

// errConnectAnswer: the proxy's answer to CONNECT is not HTTP/1.x.
var errConnectAnswer = &upstreamError{causeOther, "malformed answer to CONNECT"}

// readConnectAnswer reads the head of the proxy's answer to CONNECT
// from br into h (consumed from br), with the gateway's parser.
func readConnectAnswer(br *bufio.Reader, h *h1.Head) error {
	raw, err := h1.PeekHead(br, false, nil)
	consumed := false
	if errors.Is(err, h1.ErrTooLarge) {
		var acc []byte
		raw, err = h1.ReadLongHead(br, &acc, maxResponseHead)
		consumed = true
	}
	if err != nil {
		if he := (*h1.Error)(nil); errors.As(err, &he) {
			return errConnectAnswer // (never taken for the client's head's refusal)
		}
		return err
	}
	if h.Parse(raw, false) != nil {
		return errConnectAnswer
	}
	if !consumed {
		// The head's bytes stay valid: the fields are read before br is.
		_, _ = br.Discard(len(raw))
	}
	return nil
}

// squidError is h's X-Squid-Error ("" without).
func squidError(h *h1.Head) string {
	for _, f := range h.Fields {
		if h1.EqualFold(f.Name, "X-Squid-Error") {
			return string(f.Value)
		}
	}
	return ""
}

// readAnswerBody reads up to limit bytes of the body of an answer
// whose head h was read from br: by its length, chunked, or until the
// close; what fails to come ends it.
func readAnswerBody(br *bufio.Reader, h *h1.Head, limit int) []byte {
	var b []byte
	switch {
	case h.Chunked:
		for len(b) < limit {
			n, err := h1.ReadChunkSize(br)
			if err != nil || n == 0 {
				break
			}
			chunk := make([]byte, min(n, int64(limit-len(b))))
			k, err := io.ReadFull(br, chunk)
			b = append(b, chunk[:k]...)
			if err != nil || int64(k) < n || h1.ReadCRLF(br) != nil {
				break
			}
		}
	case h.Length >= 0:
		b = make([]byte, min(h.Length, int64(limit)))
		k, _ := io.ReadFull(br, b)
		b = b[:k]
	default:
		b, _ = io.ReadAll(io.LimitReader(br, int64(limit)))
	}
	return b
}

// ctxErr is the context's error if it ended (the client left), else err.
func (g *Gateway) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// emptyError: no proxy matched the request's labels (or the rotation
// is empty); answered 503.
type emptyError struct{ labels map[string]string }

func (e *emptyError) Error() string {
	if len(e.labels) == 0 {
		return "no proxy in the rotation"
	}
	return "no proxy matches labels " + formatLabels(e.labels)
}

// deniedError: the target is an address Config.Deny refuses; answered
// 403 (SOCKS5: reply 2), no proxy picked.
type deniedError struct{ addr netip.Addr }

func (e *deniedError) Error() string { return "destination " + e.addr.String() + " is denied" }

// allFailed: every proxy tried failed; answered 502.
type allFailed struct{ failures []string }

func (e *allFailed) Error() string {
	return "no proxy could carry the request: " + strings.Join(e.failures, "; ")
}

// attempts runs try on a proxy, and on others while it fails with a
// proxy's failure, up to Retries more: each failing proxy is reported and
// excluded from the next pick (a session moves). try returns an
// *upstreamError (or an error classify makes one of) for a proxy's
// failure; retryable says whether another attempt may follow it. try
// returns errRuleRetry when a rule refused the answer and asked for a
// retry (judge): the next attempt leaves from another address, and no
// proxy is reported.
//
// host is the request's target host, as it passed the target rule (a
// name, an IPv4 address, an IPv6 one with or without brackets): every
// kind of request comes here before a proxy is picked, so this is where
// a denied address is refused (a *deniedError; no proxy picked, none
// reported), and where the addresses banned for its site are passed
// over: a proxy with none other is not tried (none at all: a
// *bannedError). Each request that gets this far is counted in the
// gateway's stats for its site, with its answer's class (attempt.status)
// and retries.
func (g *Gateway) attempts(ctx context.Context, kind, host string, o options, try func(at *attempt) (retryable bool, err error)) (_ Proxy, err error) {
	if g.deny.Len() > 0 {
		if a, ok := targetAddr(host); ok && g.deny.Denies(a) {
			g.log.Debug("gateway: destination denied", "kind", kind, "addr", a.String())
			return Proxy{}, &deniedError{a}
		}
	}
	sc := g.scopeOf(host)
	var last *attempt // the one tried last
	retries := 0
	defer func() { g.stats.request(sc.site, answerClass(last, err), retries) }()
	if o.ban > 0 {
		g.banAsked(ctx, o, sc)
	}
	var failures []string
	seq := &attemptSeq{g: g, ctx: ctx, o: o, sc: sc}
	for ; ; seq.i++ {
		i := seq.i
		at := seq.next // picked ahead by attempt.more
		seq.next = nil
		if at == nil {
			var err error
			if at, err = g.pick(ctx, o, sc); err != nil {
				if !errors.Is(err, ErrEmpty) {
					return Proxy{}, fmt.Errorf("pick a proxy: %w", err)
				}
				switch {
				case i > 0:
					failures = append(failures, "no other proxy matches")
					return Proxy{}, &allFailed{failures}
				case sc.skippedBan:
					g.m.bannedRefused.Inc()
					return Proxy{}, &bannedError{sc.site}
				}
				return Proxy{}, &emptyError{labels: o.labels}
			}
		}
		at.seq = seq
		last = at
		p := at.p
		if i > 0 {
			g.m.retry(kind).Inc()
			retries++
		}
		retryable, err := try(at)
		if err == nil {
			return p, nil
		}
		if ctx.Err() != nil {
			return p, ctx.Err()
		}
		var refused *h1.Error
		if errors.Is(err, errClientLeft) || errors.As(err, &refused) {
			return p, err // nobody's failure, or the client's
		}
		var ta *targetAnswer
		if errors.As(err, &ta) {
			return p, err
		}
		if errors.Is(err, errRuleRetry) {
			// The address's answer was refused (judge passed it over
			// already): another one, on this proxy or another.
			g.m.ruleRetry().Inc()
			continue
		}
		ue := g.classify(err)
		g.m.failure(ue.cause).Inc()
		switch ue.cause {
		case causeLeft:
			// Health took it out already: nothing to report.
			g.pool.drop(p.Addr)
		case causeSilent:
			g.pool.drop(p.Addr)
			g.report(p, ue.reason)
		default:
			g.report(p, ue.reason)
		}
		failures = append(failures, p.ID+": "+ue.reason)
		sc.tried = append(sc.tried, p.ID)
		if !retryable || i >= g.retries {
			return p, &allFailed{failures}
		}
		g.m.failover(ue.cause).Inc()
		g.log.Info("proxy failed, trying another", "kind", kind, "proxy", p.ID, "reason", ue.reason, "session", o.session != "")
	}
}

// pick chooses the proxy and address of a request's next attempt: the
// picker's choice among those matching o and not in sc.tried, passing over
// a proxy whose every address the request may not leave from (sc.skip).
// The address is of the family the proxy reaches the target with
// (rotation.FamilyCache.TargetFamily: a name is resolved, once its
// proxy has addresses to choose from; one that does not resolve leaves
// the choice to the proxy). errors.Is(err, ErrEmpty) when none is left.
func (g *Gateway) pick(ctx context.Context, o options, sc *scope) (*attempt, error) {
	sel := o.selector()
	exclude := sc.tried
	for range g.picker.Len() + 1 {
		sel.Exclude = exclude
		var p Proxy
		var err error
		if o.session != "" {
			p, err = g.picker.PickSession(o.session, sel)
		} else {
			p, err = g.picker.Pick(sel)
		}
		if err != nil {
			return nil, err
		}
		egress, ok := g.egressFor(p, o, g.families.TargetFamily(ctx, sc.host, p), sc.skip)
		if ok {
			addr := egress
			if !addr.IsValid() {
				addr = ownEgress(p)
			}
			return &attempt{p: p, egress: egress, addr: addr, sc: sc}, nil
		}
		sc.skippedBan = true
		exclude = append(slices.Clip(exclude), p.ID)
	}
	return nil, ErrEmpty
}

// report tells the rotation that p failed us.
func (g *Gateway) report(p Proxy, reason string) {
	if err := g.picker.Report(p, reason); err != nil {
		g.m.reportFail.Inc()
		g.log.Warn("report a failed proxy", "proxy", p.ID, "reason", reason, "err", err)
		return
	}
	g.m.reportOK.Inc()
	g.log.Warn("proxy failed, reported", "proxy", p.ID, "addr", p.Addr, "reason", reason)
}
