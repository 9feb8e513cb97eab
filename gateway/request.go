package gateway

// What happens to a request on the HTTP listener, in the order it
// happens; the connection's loop (serve.go) reads its head and calls
// route, and the byte-level work is done below it (gateway/h1 parses,
// relay.go and body.go carry a plain request and its answer, connect.go
// and tunnel.go a tunnel, upstream.go picks and tries the proxies).
//
//  1. The head: refused (its status from h1, and a close) if it breaks
//     RFC 9112, has more than MaxHeaderFields fields, or its target is
//     neither CONNECT's host:port nor an absolute http:// URI (refuse);
//     an http:// authority the target rule refuses too (plain).
//  2. Admission (admit): the credential (authenticate: 407, the
//     throttle's 429), the user's limit (429), the options of the user
//     name and the gateway's own fields (markOwn; 400).
//  3. The attempts (Gateway.attempts): denied destinations (403),
//     bans, the pick, a try on each proxy, retries and reports.
//  4. The answer: the proxy's (plain: relayed; CONNECT: 200 and the
//     tunnel; the target's failure in squid's words, passed on), or the
//     gateway's own for a request no proxy carried (fail: 403, 503, 502).

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"proxyfleet/gateway/h1"
)

// route answers one request whose head was read (err: why it was not
// read whole, or not taken). keep: the connection goes on; tunneled: it
// became a tunnel, which runs on in goroutines of its own.
func (cc *clientConn) route(headLen int, err error) (keep, tunneled bool) {
	g := cc.g
	cc.own = ownFields{}
	if err == nil {
		markOwn(&cc.h, &cc.own)
	}
	switch {
	case err == nil && len(cc.h.Fields) > g.cfg.MaxHeaderFields:
		// Before the credential is looked at; the connection closes.
		cc.refuse(&h1.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Text: fmt.Sprintf("more than %d header fields", g.cfg.MaxHeaderFields)})
		return false, false
	case err != nil:
		// (he is declared here: a request that parsed allocates none.)
		if he := (*h1.Error)(nil); errors.As(err, &he) {
			// Refused here: there is no other parser.
			cc.refuse(he)
		}
		return false, false // else the client left, or its head's time ran out
	case string(cc.h.Line[0]) == http.MethodConnect:
		return cc.connect(headLen)
	case hasPrefixHTTP(cc.h.Line[1]):
		return cc.plain(headLen), false
	}
	// origin-form, asterisk-form, https:// or another scheme: not a
	// forward proxy's request; refused before the credential is looked
	// at.
	cc.refuse(errNotProxy)
	return false, false
}

// errNotProxy refuses a target the gateway does not carry: an
// https:// one is tunneled with CONNECT.
var errNotProxy = &h1.Error{Status: http.StatusBadRequest, Text: "this is a proxy: send CONNECT or an absolute http:// URI"}

// refuse answers a request refused for its head with the status of he,
// before its credential is looked at, and ends the connection (what the
// client sent after it is read and dropped for a while, so that the
// close does not reset the answer away).
func (cc *clientConn) refuse(he *h1.Error) {
	g := cc.g
	cc.h.Close = true
	g.m.request(headKind(&cc.h), outcomeError).Inc()
	g.log.Debug("gateway: request refused", "status", he.Status, "why", he.Text, "remote", cc.c.RemoteAddr().String())
	cc.reply(he.Status, he.Text) // (h.close: it says the connection ends)
	lingerClose(cc.c)
}

// headKind is the kind label of a request refused for its head.
func headKind(h *h1.Head) string {
	if string(h.Line[0]) == http.MethodConnect {
		return kindConnect
	}
	return kindHTTP
}

func hasPrefixHTTP(target []byte) bool { return bytes.HasPrefix(target, []byte("http://")) }

// admit runs what every request goes through before a proxy is picked:
// credentials, the user's limit, the header options. ok false: it has
// answered (keep: the connection goes on); else the caller releases u.
func (cc *clientConn) admit(kind string) (u *user, o options, ok, keep bool) {
	u, o, ok, keep = cc.authenticate(kind)
	if !ok {
		return nil, o, false, keep
	}
	if !u.acquire() {
		cc.g.m.request(kind, outcomeLimit).Inc()
		return nil, o, false, cc.reply(http.StatusTooManyRequests, fmt.Sprintf("too many connections at once for this user (at most %d)", u.max))
	}
	if own := &cc.own; own.hasSession || own.hasLabels || own.hasBan {
		if err := o.withHeaders(string(own.session), string(own.labels), string(own.ban)); err != nil {
			u.release()
			cc.g.m.request(kind, outcomeError).Inc()
			return nil, o, false, cc.reply(http.StatusBadRequest, err.Error())
		}
	}
	return u, o, true, true
}

// authenticate checks the request's Proxy-Authorization (the last one
// that passed on this connection is taken again without a hash). On a
// refusal it has answered; keep says whether the connection goes on:
// only after a missing credential (a browser sends it on the same
// connection once asked). A credential from a source address that
// failed too often lately is refused unchecked (429, see throttle).
func (cc *clientConn) authenticate(kind string) (u *user, o options, ok, keep bool) {
	g := cc.g
	a := cc.h.Auth
	if cc.authUser != nil && bytes.Equal(a, cc.authRaw) {
		return cc.authUser, cc.authOpts, true, true
	}
	reason := authMissing
	if len(a) > 0 {
		src := sourceOf(cc.c.RemoteAddr())
		now := g.cfg.Now()
		if wait, blocked := g.authThrottle.blocked(src, now); blocked {
			g.m.request(kind, outcomeThrottled).Inc()
			g.m.authFailures.WithLabelValues(kind, authThrottled).Inc()
			cc.h.Close = true
			return nil, options{}, false, cc.reply(http.StatusTooManyRequests, "too many failed credentials from this address", "Retry-After: "+strconv.Itoa(retryAfter(wait)))
		}
		reason = authWrong
		if name, pw, found := basicCredentials(string(a)); found {
			u, o, err := g.users.check(name, pw)
			if err == nil {
				cc.authRaw = append(cc.authRaw[:0], a...)
				cc.authUser, cc.authOpts = u, o
				cc.unauth.release()
				return u, o, true, true
			}
			if !errors.Is(err, errAuth) {
				g.m.request(kind, outcomeError).Inc()
				return nil, o, false, cc.reply(http.StatusBadRequest, err.Error())
			}
		}
		g.authThrottle.fail(src, now)
		cc.h.Close = true // a wrong credential ends the connection
	}
	g.m.request(kind, outcomeAuth).Inc()
	g.m.authFailures.WithLabelValues(kind, reason).Inc()
	g.log.Debug("gateway: authentication failed", "kind", kind, "reason", reason, "remote", cc.c.RemoteAddr().String())
	return nil, options{}, false, cc.reply(http.StatusProxyAuthRequired, "proxy authentication required", "Proxy-Authenticate: "+realm)
}

// realm is the Basic realm the gateway asks credentials for.
const realm = `Basic realm="proxyfleet"`

// ownFields are the gateway's own fields of a request: the first of
// each option a client may send in a header.
type ownFields struct {
	session, labels, ban          []byte
	hasSession, hasLabels, hasBan bool
}

// markOwn marks the gateway's own fields of h (the options a client
// sends, and HeaderProxy and HeaderEgress, which the gateway sets) as a
// connection's own, never forwarded; of a request's (o not nil) it keeps
// the first of each option in o.
func markOwn(h *h1.Head, o *ownFields) {
	for i := range h.Fields {
		f := &h.Fields[i]
		if f.Kind != h1.KindOther || len(f.Name) < len("X-Proxyfleet-") || f.Name[0] != 'x' && f.Name[0] != 'X' {
			continue
		}
		switch {
		case h1.EqualFold(f.Name, HeaderProxy), h1.EqualFold(f.Name, HeaderEgress):
			f.Kind = h1.KindHop
		case h1.EqualFold(f.Name, HeaderSession):
			f.Kind = h1.KindHop
			if o != nil && !o.hasSession {
				o.session, o.hasSession = f.Value, true
			}
		case h1.EqualFold(f.Name, HeaderLabels):
			f.Kind = h1.KindHop
			if o != nil && !o.hasLabels {
				o.labels, o.hasLabels = f.Value, true
			}
		case h1.EqualFold(f.Name, HeaderBan):
			f.Kind = h1.KindHop
			if o != nil && !o.hasBan {
				o.ban, o.hasBan = f.Value, true
			}
		}
	}
}

// connect answers a CONNECT: a tunnel through a proxy. keep: the connection goes on
// (an answer but 200); tunneled: it became a tunnel, which runs on in
// goroutines of its own.
func (cc *clientConn) connect(headLen int) (keep, tunneled bool) {
	g := cc.g
	cc.headLen = headLen
	u, o, ok, keep := cc.admit(kindConnect)
	if !ok {
		return keep, false
	}
	handed := false
	defer func() {
		if !handed {
			u.release()
		}
	}()
	g.m.flight(kindConnect).Inc()
	defer func() {
		if !handed {
			g.m.flight(kindConnect).Dec()
		}
	}()
	target, err := parseHostPort(string(cc.h.Line[1]))
	if err != nil {
		// Refused before a proxy is picked: no proxy hears of it.
		g.m.request(kindConnect, outcomeError).Inc()
		return cc.reply(http.StatusBadRequest, fmt.Sprintf("CONNECT %q: %v", cc.h.Line[1], err)), false
	}
	ctx, stopWatch := cc.watch()
	var up net.Conn
	var leftover []byte
	var egress netip.Addr
	p, err := g.attempts(ctx, kindConnect, target.host, o, func(at *attempt) (bool, error) {
		var err error
		egress = at.egress
		up, leftover, err = g.dialConnect(ctx, at.p, target, egress)
		return true, err
	})
	stopWatch()
	if cc.c.SetReadDeadline(time.Time{}) != nil {
		err = errors.Join(err, errClientLeft)
	}
	if ta := targetAnswerOf(err); ta != nil {
		// The target's failure, in the proxy's words: passed on.
		g.m.request(kindConnect, outcomeOK).Inc()
		b := cc.startHead(ta.status)
		b = append(b, HeaderProxy+": "...)
		b = append(b, p.ID...)
		b = append(b, "\r\n"...)
		b = append(b, egressLine(egress)...)
		b = append(b, "X-Squid-Error: "...)
		b = append(b, ta.squidError...)
		b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\n"...)
		return cc.finishReply(b, ta.body), false
	}
	if err != nil {
		if up != nil {
			up.Close()
		}
		return cc.fail(kindConnect, err), false
	}
	cc.consumeHead()
	fail := func(err error) (bool, bool) {
		up.Close()
		g.m.request(kindConnect, outcomeClientGone).Inc()
		g.log.Debug("gateway: client left as its tunnel opened", "err", err)
		return false, false
	}
	b := append((*cc.out)[:0], "HTTP/1.1 200 Connection established\r\n"+HeaderProxy+": "...)
	b = append(b, p.ID...)
	b = append(b, "\r\n"...)
	b = append(b, egressLine(egress)...)
	b = append(b, "\r\n"...)
	if err := cc.write(b); err != nil {
		return fail(err)
	}
	// What the client sent after its CONNECT (a TLS hello) is in the
	// reader: pass it on, then let the buffers go.
	if n := cc.br.Buffered(); n > 0 {
		sent, _ := cc.br.Peek(n)
		if _, err := up.Write(sent); err != nil {
			return fail(err)
		}
	}
	if len(leftover) > 0 {
		if err := cc.write(leftover); err != nil {
			return fail(err)
		}
	}
	g.m.request(kindConnect, outcomeOK).Inc()
	release := g.picker.Acquire(p)
	handed = true
	cc.release()
	t := &tunnel{g: g, proxyID: p.ID, client: cc.c, up: up, crc: cc.rc, release: release, user: u, kind: kindConnect}
	if sc, ok := up.(syscall.Conn); ok {
		t.urc, _ = sc.SyscallConn()
	}
	// The tunnel runs in goroutines of its own: this one's stack, grown
	// by the request, goes (an idle tunnel costs two small stacks).
	g.track.add(cc.c, up)
	go t.run()
	return false, true
}

// plain carries an absolute http:// request. keep: the connection goes
// on.
func (cc *clientConn) plain(headLen int) (keep bool) {
	g := cc.g
	cc.headLen = headLen
	host, ok := authority(cc.h.Line[1])
	if !ok {
		// Refused before a proxy is picked (and before the credential
		// is looked at): no proxy hears of it.
		why := "a fragment in the URI"
		if t := cc.h.Line[1][len("http://"):]; bytes.IndexByte(t, '#') < 0 {
			if end := bytes.IndexAny(t, "/?"); end >= 0 {
				t = t[:end]
			}
			why = fmt.Sprintf("URI host %q: %v", t, errAuthority)
		}
		cc.refuse(&h1.Error{Status: http.StatusBadRequest, Text: why})
		return false
	}
	u, o, ok, keep := cc.admit(kindHTTP)
	if !ok {
		return keep
	}
	defer u.release()
	g.m.flight(kindHTTP).Inc()
	defer g.m.flight(kindHTTP).Dec()

	req := cc.requestHead(host)
	hostname, _, _ := cutPort(string(host))
	var st relayState
	p, err := g.attempts(g.hard, kindHTTP, hostname, o, func(at *attempt) (bool, error) {
		st.p, st.egress, st.at = at.p, at.egress, at
		retryable, err := cc.try(withEgress(req, st.egress), &st)
		if err == nil {
			at.status = cc.rh.Status()
		}
		return retryable, err
	})
	g.m.bytesUp.Add(float64(st.upBytes))
	if err != nil {
		keep := cc.fail(kindHTTP, err)
		return keep && !cc.hasBody()
	}
	release := g.picker.Acquire(p)
	keep = cc.answer(&st)
	release()
	return keep
}

// authority is the host[:port] of an http:// target; ok false for a
// target refused (a fragment, an authority the target rule refuses:
// user info, a bad port, a host neither a name nor an address). The
// host that goes to the proxy has passed the rule.
func authority(target []byte) (host []byte, ok bool) {
	rest := target[len("http://"):]
	end := bytes.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	host = rest[:end]
	if bytes.IndexByte(rest, '#') >= 0 || !validAuthority(host) {
		return nil, false
	}
	return host, true
}

// fail answers a request no proxy carried: 403 for a denied
// destination, 503 (with Retry-After) for a banned site or none
// matching, 502 when those tried failed; a client that left gets
// nothing; a head refused late (a malformed chunked body) is refused.
// It counts the outcome, and says whether the connection goes on.
func (cc *clientConn) fail(kind string, err error) bool {
	g := cc.g
	var empty *emptyError
	var failed *allFailed
	var denied *deniedError
	var banned *bannedError
	var refused *h1.Error
	switch {
	case errors.As(err, &denied):
		g.m.request(kind, outcomeDenied).Inc()
		return cc.reply(http.StatusForbidden, denied.Error())
	case errors.As(err, &banned):
		g.m.request(kind, outcomeBanned).Inc()
		return cc.reply(http.StatusServiceUnavailable, banned.Error(), "Retry-After: "+strconv.Itoa(retryAfter(g.cfg.RetryAfter)))
	case errors.As(err, &empty):
		g.m.request(kind, outcomeEmpty).Inc()
		return cc.reply(http.StatusServiceUnavailable, empty.Error(), "Retry-After: "+strconv.Itoa(int(math.Max(1, math.Ceil(g.cfg.RetryAfter.Seconds())))))
	case errors.As(err, &failed):
		g.m.request(kind, outcomeUpstreamFailed).Inc()
		return cc.reply(http.StatusBadGateway, failed.Error())
	case isCanceled(err):
		g.m.request(kind, outcomeClientGone).Inc()
		return false
	case errors.As(err, &refused):
		cc.refuse(refused)
		return false
	}
	g.m.request(kind, outcomeError).Inc()
	g.log.Error("gateway: request failed", "kind", kind, "err", err)
	return cc.reply(http.StatusBadGateway, err.Error())
}
