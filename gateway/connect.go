package gateway

import (
	"context"
	"sync"
	"time"
)

// watchAfter is how long a CONNECT waits for its proxy's answer before
// the client's connection is watched for its leaving: a proxy that
// answers sooner (as one near the gateway does to most) costs no
// watcher, and a client that left meanwhile is seen then.
const watchAfter = 50 * time.Millisecond

// clientWatch is the watch of a client's connection while its CONNECT
// waits (see watch).
type clientWatch struct {
	mu      sync.Mutex
	stopped bool          // stop was called: the watcher is not to begin
	done    chan struct{} // made once the watcher began, closed as it ends
}

// watch returns a context that ends when the client leaves (its
// connection reads EOF or fails) before stop is called; the connection
// is watched from watchAfter on. stop ends the watch; the client's read
// deadline is then unknown (the caller sets the one it needs).
func (cc *clientConn) watch() (context.Context, func()) {
	ctx, cancel := context.WithCancel(cc.g.hard)
	if cc.br.Buffered() > cc.headLen || cc.rc == nil {
		return ctx, cancel // it sent more already: it is there
	}
	w := &clientWatch{}
	t := time.AfterFunc(watchAfter, func() {
		w.mu.Lock()
		// The wait must not end at the idle deadline (a short
		// KeepAliveTimeout). The deadline is cleared under the lock, so
		// a stop that finds the watcher begun sets its own after.
		if w.stopped || cc.c.SetReadDeadline(time.Time{}) != nil {
			w.mu.Unlock()
			return
		}
		w.done = make(chan struct{})
		done := w.done
		w.mu.Unlock()
		defer close(done)
		if r := waitReadable(cc.rc, cc.peekBuf[:]); r == peekEOF || r == peekError && !cc.stopping.Load() {
			cancel()
		}
	})
	return ctx, func() {
		t.Stop()
		w.mu.Lock()
		w.stopped = true
		done := w.done
		w.mu.Unlock()
		if done != nil {
			cc.stopping.Store(true)
			_ = cc.c.SetReadDeadline(aLongTimeAgo)
			<-done
			cc.stopping.Store(false)
		}
		cc.idleUntil = time.Time{}
		cancel()
	}
}
