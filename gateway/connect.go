package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"
)

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
	var ta *targetAnswer
	if errors.As(err, &ta) {
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
	t := &tunnel{g: g, proxyID: p.ID, client: cc.c, up: up, onDone: func() {
		release()
		u.release()
		g.m.flight(kindConnect).Dec()
	}}
	// The tunnel runs in goroutines of its own: this one's stack, grown
	// by the request, goes (an idle tunnel costs two small stacks).
	g.track.add(cc.c, up)
	go t.run()
	return false, true
}

// watch returns a context that ends when the client leaves (its
// connection reads EOF or fails) before stop is called; stop ends the
// watch (the client's read deadline is then in the past: the caller sets
// the one it needs).
func (cc *clientConn) watch() (context.Context, func()) {
	ctx, cancel := context.WithCancel(cc.g.hard)
	if cc.br.Buffered() > cc.headLen || cc.rc == nil {
		return ctx, cancel // it sent more already: it is there
	}
	// The wait must not end at the idle deadline (a short KeepAliveTimeout).
	cc.idleUntil = time.Time{}
	if cc.c.SetReadDeadline(time.Time{}) != nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := waitReadable(cc.rc, cc.peekBuf[:]); r == peekEOF || r == peekError && !cc.stopping.Load() {
			cancel()
		}
	}()
	return ctx, func() {
		cc.stopping.Store(true)
		_ = cc.c.SetReadDeadline(aLongTimeAgo)
		<-done
		cc.stopping.Store(false)
		cc.idleUntil = time.Time{}
		cancel()
	}
}
