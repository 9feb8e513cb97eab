package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The connections to the proxies: kept alive between plain
// requests, in a pool per proxy address (most recently used first).
const (
	maxIdlePerProxy = 64               // idle connections kept per proxy
	maxIdleTotal    = 1024             // and in all
	idleConnTimeout = 90 * time.Second // an idle connection older is closed
	// pollEvery is how often a wait for a proxy's answer looks whether
	// the client is still there (and whether the response timeout ran
	// out): the read deadline of the proxy's connection.
	pollEvery = 250 * time.Millisecond
	// bodyPollEvery is the same while an answer's body is awaited (a
	// stream may idle for long: a write to a client that left fails
	// anyway once the proxy sends more).
	bodyPollEvery = 5 * time.Second
	// upReadSize is the buffer an answer's head and chunks are read with.
	upReadSize = 8 << 10
)

// upConn is a keep-alive connection to a proxy.
type upConn struct {
	c         net.Conn
	rc        syscall.RawConn // for a look without a read (peek)
	br        *bufio.Reader   // reads c through upConn.Read
	addr      string
	idleSince time.Time
	reused    bool
	deadline  time.Time // the read deadline set on c
	peekBuf   [1]byte

	// For the request on it now: its client, polled while the answer is
	// awaited (nil while a body sender reads the client: it sees it
	// leave itself).
	client atomic.Pointer[clientConn]
	// limit ends the wait for the answer's head (unix ns): 0 none (the
	// body is being read), -1 not yet (the request's body is still
	// being sent: the response timeout starts once it is).
	limit atomic.Int64
	// flight is the attempt it carries while the answer's head is
	// awaited (nil otherwise): its end (failover.go) ends the wait.
	flight *flight
}

func newUpConn(c net.Conn, addr string) *upConn {
	u := &upConn{c: c, addr: addr}
	if sc, ok := c.(syscall.Conn); ok {
		u.rc, _ = sc.SyscallConn()
	}
	u.br = bufio.NewReaderSize(u, upReadSize)
	return u
}

// errResponseTimeout: no answer's head within the response timeout.
var errResponseTimeout = errors.New("no answer within the response timeout")

// errClientLeft: the client left while its request was carried (a
// context.Canceled to attempts and fail: nobody's failure).
var errClientLeft = fmt.Errorf("client left: %w", context.Canceled)

// Read reads c; a read that outlives the deadline (pollEvery) looks at
// the attempt's flight (ended: its cause), the client (gone:
// errClientLeft) and the response timeout (over: errResponseTimeout),
// and else waits on.
func (u *upConn) Read(p []byte) (int, error) {
	for {
		n, err := u.c.Read(p)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if err := u.flight.err(); err != nil {
			return n, err
		}
		now := time.Now()
		if l := u.limit.Load(); l > 0 && now.UnixNano() >= l {
			return n, errResponseTimeout
		}
		if cc := u.client.Load(); cc != nil && cc.gone() {
			return n, errClientLeft
		}
		every := pollEvery
		if u.limit.Load() == 0 {
			every = bodyPollEvery
		}
		if err := u.setDeadline(now.Add(every)); err != nil {
			return n, err
		}
	}
}

func (u *upConn) setDeadline(t time.Time) error {
	u.deadline = t
	return u.c.SetReadDeadline(t)
}

// arm starts the wait for an answer at now: the response timeout from
// now (or once the request's body is sent: bodyPending), a poll deadline
// unless one soon enough is set already (setting it costs).
func (u *upConn) arm(now time.Time, timeout time.Duration, bodyPending bool) error {
	if bodyPending {
		u.limit.Store(-1)
	} else {
		u.limit.Store(now.Add(timeout).UnixNano())
	}
	if u.deadline.Before(now.Add(pollEvery/2)) || u.deadline.After(now.Add(timeout)) {
		return u.setDeadline(now.Add(min(pollEvery, timeout)))
	}
	return nil
}

// pool holds idle connections to proxies.
type pool struct {
	mu     sync.Mutex
	idle   map[string][]*upConn
	n      int
	closed bool
}

func newPool() *pool { return &pool{idle: map[string][]*upConn{}} }

// get takes an idle connection to addr (nil if none), the most
// recently used first. Each is looked at first, however briefly it was
// idle (usable: nothing buffered, a peek that does not wait finds
// nothing): one the proxy closed, or on which it sent anything while it
// was idle (an answer nobody asked for would be taken for the next
// request's), is closed, as is one idle for idleConnTimeout or longer.
// One idle long enough to have been probed whose proxy answered nothing
// (idleDead) says the proxy is dead: every idle connection to addr is
// closed and dead is true (the caller fails the attempt as the proxy's).
func (p *pool) get(addr string, now time.Time) (u *upConn, dead bool) {
	for {
		p.mu.Lock()
		l := p.idle[addr]
		if len(l) == 0 {
			p.mu.Unlock()
			return nil, false
		}
		u := l[len(l)-1]
		l[len(l)-1] = nil
		p.idle[addr] = l[:len(l)-1]
		p.n--
		p.mu.Unlock()
		idle := now.Sub(u.idleSince)
		if idle < idleConnTimeout && u.usable() {
			if idleDead(u.c, idle) {
				u.c.Close()
				p.drop(addr)
				return nil, true
			}
			u.reused = true
			return u, false
		}
		u.c.Close()
	}
}

// drop closes every idle connection to addr.
func (p *pool) drop(addr string) {
	p.mu.Lock()
	l := p.idle[addr]
	delete(p.idle, addr)
	p.n -= len(l)
	p.mu.Unlock()
	for _, u := range l {
		u.c.Close()
	}
}

// put keeps u for another request, or closes it when the pool is full
// or closed. The caller puts only a connection at a message boundary:
// its answer read whole, nothing buffered after it, no request body
// still being sent.
func (p *pool) put(u *upConn, now time.Time) {
	u.client.Store(nil)
	u.idleSince = now
	p.mu.Lock()
	if p.closed || p.n >= maxIdleTotal || len(p.idle[u.addr]) >= maxIdlePerProxy {
		p.mu.Unlock()
		u.c.Close()
		return
	}
	p.idle[u.addr] = append(p.idle[u.addr], u)
	p.n++
	p.mu.Unlock()
}

// sweep closes the connections idle for longer than idleConnTimeout.
func (p *pool) sweep(now time.Time) {
	var old []*upConn
	p.mu.Lock()
	for addr, l := range p.idle {
		keep := l[:0]
		for _, u := range l {
			if now.Sub(u.idleSince) >= idleConnTimeout {
				old = append(old, u)
			} else {
				keep = append(keep, u)
			}
		}
		clear(l[len(keep):])
		p.n -= len(l) - len(keep)
		if len(keep) == 0 {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = keep
		}
	}
	p.mu.Unlock()
	for _, u := range old {
		u.c.Close()
	}
}

// close closes every idle connection, and those put back later.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle, p.n = map[string][]*upConn{}, 0
	p.mu.Unlock()
	for _, l := range idle {
		for _, u := range l {
			u.c.Close()
		}
	}
}

// usable says whether an idle connection may carry a request: the proxy
// sent nothing on it (no close, no unasked answer) while it was idle.
func (u *upConn) usable() bool {
	return u.br.Buffered() == 0 && u.rc != nil && peek(u.rc, u.peekBuf[:]) == peekNothing
}

// peekResult is what a look at a socket without a read found.
type peekResult int

const (
	peekNothing peekResult = iota // nothing to read: open and quiet
	peekData                      // bytes wait to be read
	peekEOF                       // the peer closed
	peekError                     // reset, or the look failed
)
