package gateway

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Credential guessing is throttled by source (an IPv4 address, or an
// IPv6 /64: sourceOf): after limit failed credentials from one source
// within window (counted from the first of them), its further attempts
// are refused without a password being checked until the window has
// passed. The table holds at most max sources; a new one beyond that
// evicts the one whose window began first, so memory stays bounded
// whatever the sources.
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

// sourceOf is the throttle's key for a connection's peer: its IPv4
// address (an IPv4-mapped IPv6 one unmapped), or the /64 of its IPv6
// address (sourcePrefix6); the zero Addr if it has none (all such share
// one entry).
func sourceOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return sourceKey(ta.AddrPort().Addr())
	}
	if a == nil {
		return netip.Addr{}
	}
	return sourceOfString(a.String())
}

// sourceOfString is sourceOf for a host:port string.
func sourceOfString(s string) netip.Addr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}
	}
	return sourceKey(ap.Addr())
}

// sourcePrefix6 is the IPv6 prefix one source holds: a /64 is the
// smallest a network hands a host (RFC 6177), and a host with one has
// 2^64 addresses to guess from.
const sourcePrefix6 = 64

// sourceKey is the throttle's key for address a.
func sourceKey(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if !a.Is6() {
		return a
	}
	p, err := a.WithZone("").Prefix(sourcePrefix6)
	if err != nil {
		return a
	}
	return p.Addr()
}

// retryAfter is d in whole seconds, at least 1, for a Retry-After.
func retryAfter(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
