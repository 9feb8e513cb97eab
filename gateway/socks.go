package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// errTooManyFiles is accept's error when the process is out of
// descriptors.
var errTooManyFiles = syscall.EMFILE

// SOCKS5 (RFC 1928) with username/password authentication (RFC 1929),
// CONNECT only.
const (
	socksVersion    = 5
	socksAuthUserPW = 2
	socksNoMethod   = 0xff
	socksCmdConnect = 1

	socksAtypIPv4   = 1
	socksAtypDomain = 3
	socksAtypIPv6   = 4

	repSucceeded         = 0
	repGeneralFailure    = 1
	repNotAllowed        = 2 // connection not allowed by ruleset
	repNetUnreachable    = 3
	repHostUnreachable   = 4
	repConnRefused       = 5
	repCmdNotSupported   = 7
	repAtypNotSupported  = 8
	socksAuthVersion     = 1
	socksAuthOK          = 0
	socksAuthFailed      = 1
	maxSocksPasswordSize = 255
)

// serveSocks accepts SOCKS5 clients until ln is closed (stop closed
// first: then it returns nil).
func (g *Gateway) serveSocks(ln net.Listener, stop <-chan struct{}) error {
	return g.accept(ln, stop, "SOCKS5", func(c net.Conn) {
		slot := &unauthSlot{}
		if !slot.take(g.unauth) {
			g.m.refusedUnauth.Inc()
			c.Close()
			return
		}
		g.track.add(c)
		go func() {
			defer slot.release()
			if g.serveSocksConn(c, slot) {
				g.track.done() // c is the tunnel's now
			} else {
				g.track.done(c)
			}
		}()
	})
}

// accept accepts connections on ln and hands each to serve until ln is
// closed (stop closed first: then it returns nil).
func (g *Gateway) accept(ln net.Listener, stop <-chan struct{}, name string, serve func(net.Conn)) error {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-stop:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				// Out of descriptors, or the like: wait and go on, as
				// net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				g.log.Warn("gateway: "+name+" accept", "err", err, "retry_in", delay)
				select {
				case <-time.After(delay):
				case <-stop:
					return nil
				}
				continue
			}
			return err
		}
		delay = 0
		serve(c)
	}
}

// socksError is the reply code a failed request is answered with.
func socksReply(c net.Conn, code byte) error {
	// BND.ADDR 0.0.0.0:0: the tunnel's far end is the proxy's business.
	_, err := c.Write([]byte{socksVersion, code, 0, socksAtypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}

// serveSocksConn runs one client: greeting, authentication, request,
// then the tunnel in this goroutine and one more. It says whether a
// tunnel took c over.
func (g *Gateway) serveSocksConn(c net.Conn, unauth *unauthSlot) (handed bool) {
	defer func() {
		if !handed {
			c.Close()
		}
	}()
	if err := c.SetDeadline(g.cfg.Now().Add(g.cfg.HandshakeTimeout)); err != nil {
		return false
	}
	u, o, ok := g.socksAuth(c)
	if !ok {
		return false
	}
	unauth.release()
	target, err := socksRequest(c)
	if err != nil {
		var re *socksRequestError
		if errors.As(err, &re) {
			g.m.request(kindSocks, outcomeError).Inc()
			_ = socksReply(c, re.code)
		} else {
			g.m.request(kindSocks, outcomeClientGone).Inc()
		}
		return false
	}
	if !u.acquire() {
		g.m.request(kindSocks, outcomeLimit).Inc()
		_ = socksReply(c, repGeneralFailure)
		return false
	}
	defer func() {
		if !handed {
			u.release()
		}
	}()
	ctx, cancel := context.WithCancel(g.hard)
	defer cancel()
	// A client that leaves while its proxy is dialed ends the attempts.
	g.m.flight(kindSocks).Inc()
	defer func() {
		if !handed {
			g.m.flight(kindSocks).Dec()
		}
	}()
	var up net.Conn
	var leftover []byte
	p, err := g.attempts(ctx, kindSocks, target.host, o, func(at *attempt) (bool, error) {
		var err error
		up, leftover, err = g.dialConnect(ctx, at.p, target, at.egress)
		return true, err
	})
	if err != nil {
		var empty *emptyError
		var failed *allFailed
		var ta *targetAnswer
		var denied *deniedError
		code := byte(repGeneralFailure)
		outcome := outcomeError
		switch {
		case errors.As(err, &denied):
			code, outcome = repNotAllowed, outcomeDenied
		case errors.As(err, new(*bannedError)):
			code, outcome = repNotAllowed, outcomeBanned
		case errors.As(err, &ta):
			code, outcome = socksReplyFor(ta), outcomeOK
		case errors.As(err, &empty):
			code, outcome = repNetUnreachable, outcomeEmpty
		case errors.As(err, &failed):
			outcome = outcomeUpstreamFailed
		case errors.Is(err, context.Canceled):
			outcome = outcomeClientGone
		}
		g.m.request(kindSocks, outcome).Inc()
		g.log.Debug("gateway: SOCKS5 request failed", "target", target.String(), "err", err)
		_ = socksReply(c, code)
		return false
	}
	if err := socksReply(c, repSucceeded); err != nil {
		up.Close()
		g.m.request(kindSocks, outcomeClientGone).Inc()
		return false
	}
	if len(leftover) > 0 {
		if _, err := c.Write(leftover); err != nil {
			up.Close()
			g.m.request(kindSocks, outcomeClientGone).Inc()
			return false
		}
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		up.Close()
		return false
	}
	g.m.request(kindSocks, outcomeOK).Inc()
	g.log.Debug("gateway: SOCKS5 tunnel", "target", target.String(), "proxy", p.ID)
	release := g.picker.Acquire(p)
	handed = true
	t := &tunnel{g: g, proxyID: p.ID, client: c, up: up, release: release, user: u, kind: kindSocks}
	// The accept loop counted this goroutine with c; the tunnel is one
	// more thing running, with both connections.
	g.track.add(c, up)
	t.run()
	return true
}

// The errnos squid reports are its host's, the guests' Linux, whatever
// the gateway runs on.
const (
	guestECONNREFUSED = "111"
	guestENETUNREACH  = "101"
)

// socksReplyFor is the SOCKS5 reply to a proxy's answer that speaks
// for the target. squid names its error page and the system error
// behind it in X-Squid-Error ("ERR_CONNECT_FAIL 111": the page, then
// errno, 0 for none):
//
//   - ERR_ACCESS_DENIED (403: an http_access deny, proxy.deny's acl
//     among them, a name that resolves into it included; a port not
//     allowed) and ERR_FORWARDING_DENIED: 2, not allowed by ruleset;
//   - ERR_CONNECT_FAIL by errno: ECONNREFUSED 5, connection refused;
//     ENETUNREACH 3, network unreachable; any other (a timeout, no
//     route to the host) 4, host unreachable;
//   - ERR_DNS_FAIL (the name did not resolve) and ERR_CANNOT_FORWARD
//     (no way to the target was found): 4, host unreachable;
//   - anything else: 1, general failure.
func socksReplyFor(ta *targetAnswer) byte {
	page, errno, _ := strings.Cut(strings.TrimSpace(ta.squidError), " ")
	switch page {
	case "ERR_ACCESS_DENIED", "ERR_FORWARDING_DENIED":
		return repNotAllowed
	case "ERR_CONNECT_FAIL":
		switch errno {
		case guestECONNREFUSED:
			return repConnRefused
		case guestENETUNREACH:
			return repNetUnreachable
		}
		return repHostUnreachable
	case "ERR_DNS_FAIL", "ERR_CANNOT_FORWARD":
		return repHostUnreachable
	}
	return repGeneralFailure
}

// socksAuth reads the greeting and the RFC 1929 sub-negotiation.
func (g *Gateway) socksAuth(c net.Conn) (*user, options, bool) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != socksVersion {
		g.m.request(kindSocks, outcomeError).Inc()
		return nil, options{}, false
	}
	var methods [255]byte
	if _, err := io.ReadFull(c, methods[:hdr[1]]); err != nil {
		g.m.request(kindSocks, outcomeError).Inc()
		return nil, options{}, false
	}
	offered := false
	for _, m := range methods[:hdr[1]] {
		offered = offered || m == socksAuthUserPW
	}
	if !offered {
		// Never an open proxy: no method without a password. (Counted
		// first: the answer may be read before the count.)
		g.m.request(kindSocks, outcomeAuth).Inc()
		g.m.authFailures.WithLabelValues(kindSocks, authMissing).Inc()
		_, _ = c.Write([]byte{socksVersion, socksNoMethod})
		return nil, options{}, false
	}
	if _, err := c.Write([]byte{socksVersion, socksAuthUserPW}); err != nil {
		return nil, options{}, false
	}
	// VER ULEN UNAME PLEN PASSWD
	var b [1 + 1 + 255 + 1 + maxSocksPasswordSize]byte
	if _, err := io.ReadFull(c, b[:2]); err != nil || b[0] != socksAuthVersion {
		g.m.request(kindSocks, outcomeError).Inc()
		return nil, options{}, false
	}
	ulen := int(b[1])
	if _, err := io.ReadFull(c, b[2:2+ulen+1]); err != nil {
		g.m.request(kindSocks, outcomeError).Inc()
		return nil, options{}, false
	}
	name := string(b[2 : 2+ulen])
	plen := int(b[2+ulen])
	pw := b[3+ulen : 3+ulen+plen]
	if _, err := io.ReadFull(c, pw); err != nil {
		g.m.request(kindSocks, outcomeError).Inc()
		return nil, options{}, false
	}
	src := sourceOf(c.RemoteAddr())
	now := g.cfg.Now()
	if _, blocked := g.authThrottle.blocked(src, now); blocked {
		// Refused unchecked: too many failed from this address lately.
		clear(b[:])
		g.m.request(kindSocks, outcomeThrottled).Inc()
		g.m.authFailures.WithLabelValues(kindSocks, authThrottled).Inc()
		_, _ = c.Write([]byte{socksAuthVersion, socksAuthFailed})
		return nil, options{}, false
	}
	u, o, err := g.users.check(name, string(pw))
	clear(b[:]) // the password leaves no copy of ours
	if err != nil {
		if errors.Is(err, errAuth) {
			g.authThrottle.fail(src, now)
			g.m.request(kindSocks, outcomeAuth).Inc()
			g.m.authFailures.WithLabelValues(kindSocks, authWrong).Inc()
		} else {
			g.m.request(kindSocks, outcomeError).Inc()
			g.log.Debug("gateway: SOCKS5 user options", "err", err)
		}
		_, _ = c.Write([]byte{socksAuthVersion, socksAuthFailed})
		return nil, options{}, false
	}
	if _, err := c.Write([]byte{socksAuthVersion, socksAuthOK}); err != nil {
		return nil, options{}, false
	}
	return u, o, true
}

// socksRequestError is a request answered with code.
type socksRequestError struct {
	code byte
	msg  string
}

func (e *socksRequestError) Error() string { return e.msg }

// socksRequest reads VER CMD RSV ATYP DST.ADDR DST.PORT and returns the
// target. One the target rule (target.go) refuses (a domain that is not
// a host name or an address, a port 0) is answered 4, host unreachable:
// RFC 1928 has no code for a malformed address, and 4 puts the failure
// on the target, not on the gateway or its proxies (no proxy is dialed
// for it).
func socksRequest(c net.Conn) (hostPort, error) {
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return hostPort{}, err
	}
	if b[0] != socksVersion {
		return hostPort{}, &socksRequestError{repGeneralFailure, fmt.Sprintf("version %d", b[0])}
	}
	if b[1] != socksCmdConnect {
		return hostPort{}, &socksRequestError{repCmdNotSupported, fmt.Sprintf("command %d: only CONNECT", b[1])}
	}
	var host string
	switch b[3] {
	case socksAtypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(c, a[:]); err != nil {
			return hostPort{}, err
		}
		host = net.IP(a[:]).String()
	case socksAtypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(c, a[:]); err != nil {
			return hostPort{}, err
		}
		host = net.IP(a[:]).String()
	case socksAtypDomain:
		var l [1]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return hostPort{}, err
		}
		var d [255]byte
		if _, err := io.ReadFull(c, d[:l[0]]); err != nil {
			return hostPort{}, err
		}
		host = string(d[:l[0]])
	default:
		return hostPort{}, &socksRequestError{repAtypNotSupported, fmt.Sprintf("address type %d", b[3])}
	}
	var port [2]byte
	if _, err := io.ReadFull(c, port[:]); err != nil {
		return hostPort{}, err
	}
	t, err := newHostPort(host, binary.BigEndian.Uint16(port[:]))
	if err != nil {
		return hostPort{}, &socksRequestError{repHostUnreachable, fmt.Sprintf("target %q: %v", host, err)}
	}
	return t, nil
}
