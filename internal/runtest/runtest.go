// Package runtest runs a component's Run(ctx) error in a test: in a
// goroutine of its own, stopped (its context cancelled, its return waited
// for) when the test ends, so goleak sees nothing left behind.
package runtest

import (
	"context"
	"testing"
	"time"
)

// stopBound is how long Stop and the test's cleanup wait for Run to
// return: a bound for hangs, not a timing assertion.
const stopBound = time.Minute

// Running is one Run in flight.
type Running struct {
	t      testing.TB
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Go calls run in a goroutine with a context Stop cancels. When the test
// ends it is stopped, if it has not been.
func Go(t testing.TB, run func(context.Context) error) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{t: t, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() { r.stop() })
	return r
}

// Start is Go, then waits until started is closed; it fails the test if
// Run returns first, or if started is not closed within bound.
func Start(t testing.TB, run func(context.Context) error, started <-chan struct{}, bound time.Duration) *Running {
	t.Helper()
	r := Go(t, run)
	select {
	case <-started:
	case <-r.done:
		t.Fatalf("run returned before it started: %v", r.err)
	case <-time.After(bound):
		t.Fatalf("not started within %s", bound)
	}
	return r
}

// Stop cancels Run's context, waits for Run to return and returns its
// error. It may be called more than once.
func (r *Running) Stop() error {
	r.t.Helper()
	r.stop()
	return r.err
}

func (r *Running) stop() {
	r.t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(stopBound):
		r.t.Fatalf("run did not return within %s of its context's end", stopBound)
	}
}

// Done is closed once Run has returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Err is what Run returned; call it once Done is closed.
func (r *Running) Err() error {
	<-r.done
	return r.err
}

// Wait waits up to bound for Run to return by itself and returns its
// error; it fails the test if Run is still running then.
func (r *Running) Wait(bound time.Duration) error {
	r.t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(bound):
		r.t.Fatalf("run still running after %s", bound)
		return nil
	}
}
