package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// fence abandons a worker's in-flight work once the worker may have lost
// it. JetStream redelivers an unacknowledged item AckWait after the last
// InProgress it received, and while this worker is cut off from NATS its
// InProgress ticks do not arrive, so another worker (the host's next pinned
// owner) may get the item and run it while this one still does: two calls
// for one id at once, which the executor promises never happens.
//
// So in-flight work runs under the fence's current context, which is
// cancelled once the connection has been down for after (a quarter of
// AckWait): at the latest that is half an AckWait after the last InProgress
// that can have reached the server (ticks come every quarter), which leaves
// the abandoned work half an AckWait to stop before the item can be
// delivered again. A connection back within after lets the next tick reach
// the server at most three quarters of an AckWait after the last one, in
// time. Work delivered after a cut runs under a fresh context.
type fence struct {
	nc    *nats.Conn
	after time.Duration
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

func newFence(nc *nats.Conn, after time.Duration, log *slog.Logger) *fence {
	f := &fence{nc: nc, after: after, log: log, now: time.Now}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// current is the context in-flight work delivered now runs under.
func (f *fence) current() context.Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ctx
}

// cut abandons the work of the current generation and starts a new one.
func (f *fence) cut() {
	f.mu.Lock()
	cancel := f.cancel
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.mu.Unlock()
	cancel()
}

// run watches the connection until ctx is done.
func (f *fence) run(ctx context.Context) {
	defer func() {
		f.mu.Lock()
		f.cancel()
		f.mu.Unlock()
	}()
	t := time.NewTicker(max(f.after/5, 10*time.Millisecond))
	defer t.Stop()
	var downSince time.Time
	cut := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The clock is read on every check, connected or not: a test's
		// clock counts the checks, to know the fence had its chances to
		// cut, and can make each one hours later than the last.
		now := f.now()
		if f.nc == nil || f.nc.IsConnected() {
			downSince, cut = time.Time{}, false
			continue
		}
		if downSince.IsZero() {
			downSince = now
		}
		if !cut && now.Sub(downSince) >= f.after {
			cut = true
			f.log.Warn("cut off from NATS: abandoning in-flight work, which JetStream will deliver again",
				"down", now.Sub(downSince).Round(time.Millisecond))
			f.cut()
		}
	}
}

// bind returns ctx, also cancelled when the fence cuts the work delivered
// now, and the func that releases the binding.
func (f *fence) bind(ctx context.Context) (context.Context, func()) {
	if f == nil {
		return ctx, func() {}
	}
	hctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(f.current(), cancel)
	return hctx, func() { stop(); cancel() }
}
