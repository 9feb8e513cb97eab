package worker

import (
	"context"
	"sync"
)

// keyedLocks serialises work per proxy id inside one worker.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	ch   chan struct{}
	refs int
}

func newKeyedLocks() *keyedLocks { return &keyedLocks{locks: map[string]*keyedLock{}} }

// lock waits for id's lock or ctx.
func (k *keyedLocks) lock(ctx context.Context, id string) (func(), error) {
	k.mu.Lock()
	l := k.locks[id]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.locks[id] = l
	}
	l.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, id)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// tryLock takes id's lock if it is free.
func (k *keyedLocks) tryLock(id string) (func(), bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.locks[id]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.locks[id] = l
	}
	select {
	case l.ch <- struct{}{}:
	default:
		return nil, false
	}
	l.refs++
	return func() {
		<-l.ch
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.locks, id)
		}
		k.mu.Unlock()
	}, true
}
