package gateway

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Credential guessing is throttled by source address: after limit
// failed credentials from one address within window (counted from the
// first of them), its further attempts are refused without a password
// being checked until the window has passed. The table holds at most
// max addresses; a new one beyond that evicts the one whose window
// began first, so memory stays bounded whatever the sources.
const (
	authFailWindow = time.Minute
	maxAuthSources = 10_000
)

type throttle struct {
	limit  int
	window time.Duration
	max    int

	mu    sync.Mutex
	m     map[netip.Addr]*list.Element // of *authSource
	order list.List                    // by window start, oldest first
}

// authSource is one address's failures in its current window.
type authSource struct {
	addr  netip.Addr
	start time.Time
	n     int
}

func newThrottle(limit int, window time.Duration, max int) *throttle {
	return &throttle{limit: limit, window: window, max: max, m: map[netip.Addr]*list.Element{}}
}

// blocked says whether addr's attempts are refused at now, and for how
// much longer.
func (t *throttle) blocked(addr netip.Addr, now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[addr]
	if e == nil {
		return 0, false
	}
	s := e.Value.(*authSource)
	if now.Sub(s.start) >= t.window {
		t.order.Remove(e)
		delete(t.m, addr)
		return 0, false
	}
	if s.n < t.limit {
		return 0, false
	}
	return s.start.Add(t.window).Sub(now), true
}

// fail counts a failed credential from addr at now.
func (t *throttle) fail(addr netip.Addr, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[addr]; e != nil {
		s := e.Value.(*authSource)
		if now.Sub(s.start) >= t.window {
			s.start, s.n = now, 0
			t.order.MoveToBack(e)
		}
		s.n++
		return
	}
	for len(t.m) >= t.max {
		oldest := t.order.Front()
		delete(t.m, oldest.Value.(*authSource).addr)
		t.order.Remove(oldest)
	}
	t.m[addr] = t.order.PushBack(&authSource{addr: addr, start: now, n: 1})
}

// len is how many addresses the table holds.
func (t *throttle) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// sourceOf is the address of a connection's peer (IPv4 unmapped); the
// zero Addr if it has none (all such share one entry).
func sourceOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	return sourceOfString(a.String())
}

// sourceOfString is sourceOf for a host:port string (net/http's
// RemoteAddr).
func sourceOfString(s string) netip.Addr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// retryAfter is d in whole seconds, at least 1, for a Retry-After.
func retryAfter(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
