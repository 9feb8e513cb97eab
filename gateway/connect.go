package gateway

import (
	"context"
	"time"
)

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
