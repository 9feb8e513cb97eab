package worker

import (
	"context"
	"sync"
)

// stage is a set of the worker's goroutines that stop together. Every
// goroutine the worker starts for as long as it runs is started through
// its lifecycle in one of them, and drain stops the stages in this order,
// the order of the constants:
//
//   - stageMembers, the membership's loop: first, so that no hand-over
//     starts during the drain and the record can then say "draining";
//   - stageSupervisors, the consumers' supervisors: before pulling stops,
//     so that nothing consumes again behind the drain;
//   - stageHandlers, what the handlers lean on (the host view, the fence,
//     the observation ticks, a hand-over's wait for its work): once the
//     work in flight has ended, or the drain timeout's share for it has
//     passed and it is cancelled;
//   - stageWriters, the writers of the hosts' records: last, since
//     handlers that end release room through them.
type stage int

const (
	stageMembers stage = iota
	stageSupervisors
	stageHandlers
	stageWriters
	numStages
)

// lifecycle owns the goroutines of a worker's run. A stage starts none
// until it is opened (start opens each once what its goroutines use is
// ready) and none once it is stopped. The zero value is ready to use; it
// is used once.
type lifecycle struct {
	mu     sync.Mutex
	stages [numStages]stageState
}

type stageState struct {
	ctx     context.Context // nil until opened
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
	done    chan struct{} // closed once stopped and its goroutines have returned
}

// open lets s start goroutines, under a context that stop(s) cancels. It
// does nothing once s is stopped.
func (l *lifecycle) open(s stage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &l.stages[s]
	if st.ctx == nil && !st.stopped {
		st.ctx, st.cancel = context.WithCancel(context.Background())
	}
}

// goIn runs fn on a goroutine of s, with s's context, and reports true;
// or reports false, starting nothing, if s is not open or is stopped.
func (l *lifecycle) goIn(s stage, fn func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := &l.stages[s]
	if st.ctx == nil || st.stopped {
		return false
	}
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		fn(st.ctx)
	}()
	return true
}

// ctx is s's context: cancelled by stop(s), nil before open(s).
func (l *lifecycle) ctx(s stage) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stages[s].ctx
}

// done is closed once s is stopped and its goroutines have returned.
func (l *lifecycle) done(s stage) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.doneLocked(s)
}

func (l *lifecycle) doneLocked(s stage) chan struct{} {
	st := &l.stages[s]
	if st.done == nil {
		st.done = make(chan struct{})
	}
	return st.done
}

// stop cancels s's context and waits for its goroutines to return; s
// starts none from then on. Stopping a stopped stage waits likewise.
func (l *lifecycle) stop(s stage) {
	l.mu.Lock()
	st := &l.stages[s]
	first := !st.stopped
	st.stopped = true
	if st.cancel != nil {
		st.cancel()
	}
	done := l.doneLocked(s)
	l.mu.Unlock()
	st.wg.Wait()
	if first {
		close(done)
	}
}

// stopAll stops every stage in order.
func (l *lifecycle) stopAll() {
	for s := range numStages {
		l.stop(s)
	}
}
