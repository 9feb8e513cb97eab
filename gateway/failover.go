package gateway

import (
	"net"
	"sync"
	"time"
)

// Failover that does not wait. An attempt of a request on a proxy is a
// flight from the moment its proxy is picked until the answer's head
// (for CONNECT: the proxy's 200) came. The gateway's watcher (one
// goroutine of Run) ends a flight early, with an *upstreamError the
// request then fails over with (attempts), when
//
//   - its proxy left the rotation (causeLeft), seen at the rotation's
//     next change: the proxy is not waited for, and is not reported
//     (health took it out already);
//   - its connection shows no sign of life (causeSilent): it has carried
//     the request for FirstByteTimeout or longer, bytes sent on it are
//     still unacknowledged, and nothing (no acknowledgement, no byte)
//     came from the proxy for FirstByteTimeout. A proxy that lives
//     acknowledges within a round trip whatever its target does, so a
//     slow target is never taken for a dead proxy; it is waited for up
//     to ResponseTimeout as before.
//
// The same test (idleDead) is made of a kept-alive connection before it
// carries a request, in proportion to how long it was idle: the
// connections to proxies have TCP keepalive from keepaliveIdle of
// quiet on, so one idle for longer than deadAfterIdle has been probed,
// and one whose probes went unanswered is dead; younger ones have
// nothing to judge by and are judged, once used, as above.
//
// Plain requests and the tunnels' CONNECT go through flights and these two tests: the decision is made here only.

// The keepalive of the connections to proxies, and the idle time from
// which a kept-alive connection is judged by it.
const (
	keepaliveIdle     = 10 * time.Second
	keepaliveInterval = 2 * time.Second
	keepaliveCount    = 5
	// deadAfterIdle: a connection idle for longer has had a keepalive
	// probe answered within the last deadAfterIdle if its proxy lives.
	deadAfterIdle = keepaliveIdle + 2*keepaliveInterval
	// watchEvery is how often the watcher looks at the flights that
	// have waited for FirstByteTimeout.
	watchEvery = 250 * time.Millisecond
)

var (
	errProxyLeft = &upstreamError{causeLeft, "the proxy left the rotation"}
	errSilent    = &upstreamError{causeSilent, "no sign of life from the proxy"}
)

// flight is one attempt in flight on a proxy.
type flight struct {
	p    Proxy
	stop func() // wakes the attempt once ended (it then reads err)

	mu    sync.Mutex
	c     net.Conn  // the proxy connection that carries it, once known
	since time.Time // when c began to carry it
	cause error     // why it was ended; nil while it goes on
	done  bool      // its answer's head came, or it failed: no longer watched
}

// err is why the flight was ended early, or nil.
func (f *flight) err() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cause
}

// carry says that c carries the flight from now on.
func (f *flight) carry(c net.Conn, now time.Time) {
	f.mu.Lock()
	f.c, f.since = c, now
	f.mu.Unlock()
}

// end ends the flight with cause (the first cause wins) and wakes it:
// its stop, or else a read deadline in the past on its connection.
// False if it had ended or landed.
func (f *flight) end(cause error) bool {
	f.mu.Lock()
	if f.done || f.cause != nil {
		f.mu.Unlock()
		return false
	}
	f.cause = cause
	c := f.c
	f.mu.Unlock()
	switch {
	case f.stop != nil:
		f.stop()
	case c != nil:
		_ = c.SetReadDeadline(aLongTimeAgo)
	}
	return true
}

// flights are the attempts in flight, by proxy id.
type flights struct {
	mu    sync.Mutex
	byID  map[string]map[*flight]struct{}
	count int
}

func newFlights() *flights { return &flights{byID: map[string]map[*flight]struct{}{}} }

// begin starts watching an attempt on p; stop (nil: a read deadline in
// the past on the connection it carries) wakes it once the watcher
// ended it, and it then reads err. The caller calls g.land with it once
// the answer's head came or the attempt failed.
func (g *Gateway) begin(p Proxy, stop func()) *flight {
	f := &flight{p: p, stop: stop}
	fs := g.flights
	fs.mu.Lock()
	m := fs.byID[p.ID]
	if m == nil {
		m = map[*flight]struct{}{}
		fs.byID[p.ID] = m
	}
	m[f] = struct{}{}
	fs.count++
	fs.mu.Unlock()
	// A change between the pick and now is not seen by the watcher.
	if _, ok := g.picker.Get(p.ID); !ok {
		f.end(errProxyLeft)
	}
	return f
}

// land stops watching f.
func (g *Gateway) land(f *flight) {
	f.mu.Lock()
	f.done = true
	f.c = nil
	f.mu.Unlock()
	fs := g.flights
	fs.mu.Lock()
	if m := fs.byID[f.p.ID]; m != nil {
		if _, ok := m[f]; ok {
			delete(m, f)
			fs.count--
		}
		if len(m) == 0 {
			delete(fs.byID, f.p.ID)
		}
	}
	fs.mu.Unlock()
}

// watch ends flights early (see above) until stop is closed.
func (g *Gateway) watch(stop <-chan struct{}) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	changed := g.picker.Changed()
	for {
		select {
		case <-stop:
			return
		case <-changed:
			changed = g.picker.Changed() // before the look: no change is missed
			g.endLeft()
			g.tunnels.markLeft(g.picker)
		case now := <-t.C:
			g.endSilent(now)
			g.tunnels.closeSilent(g.cfg.FirstByteTimeout)
		}
	}
}

// endLeft ends the flights whose proxy is no longer in the rotation.
func (g *Gateway) endLeft() {
	var ended []*flight
	fs := g.flights
	fs.mu.Lock()
	for id, m := range fs.byID {
		if _, ok := g.picker.Get(id); ok {
			continue
		}
		for f := range m {
			ended = append(ended, f)
		}
	}
	fs.mu.Unlock()
	for _, f := range ended {
		if f.end(errProxyLeft) {
			g.log.Info("gateway: proxy left the rotation, its request goes to another", "proxy", f.p.ID)
		}
	}
}

// endSilent ends the flights whose connection shows no sign of life.
func (g *Gateway) endSilent(now time.Time) {
	var look []*flight
	fs := g.flights
	fs.mu.Lock()
	if fs.count == 0 {
		fs.mu.Unlock()
		return
	}
	for _, m := range fs.byID {
		for f := range m {
			look = append(look, f)
		}
	}
	fs.mu.Unlock()
	limit := g.cfg.FirstByteTimeout
	for _, f := range look {
		f.mu.Lock()
		c, since, done := f.c, f.since, f.done || f.cause != nil
		f.mu.Unlock()
		if done || c == nil || now.Sub(since) < limit || !silent(c, limit) {
			continue
		}
		if f.end(errSilent) {
			g.log.Info("gateway: proxy silent, its request goes to another", "proxy", f.p.ID, "after", now.Sub(since).Round(time.Millisecond))
		}
	}
}

// idleDead says whether a kept-alive connection idle for idle is dead:
// it was idle long enough to have been probed (deadAfterIdle), and the
// proxy answered nothing for that long.
func idleDead(c net.Conn, idle time.Duration) bool {
	return idle > deadAfterIdle && quietFor(c) > deadAfterIdle
}

// silent says whether c carries bytes the proxy has not acknowledged
// and nothing came from the proxy for d.
func silent(c net.Conn, d time.Duration) bool {
	unacked, quiet, ok := tcpStateOf(c)
	return ok && unacked && quiet >= d
}

// quietFor is how long nothing came from the proxy on c (0 when it
// cannot be told).
func quietFor(c net.Conn) time.Duration {
	_, quiet, ok := tcpStateOf(c)
	if !ok {
		return 0
	}
	return quiet
}

// keepalive is the dialer's configuration for the connections to
// proxies (see deadAfterIdle).
var keepalive = net.KeepAliveConfig{Enable: true, Idle: keepaliveIdle, Interval: keepaliveInterval, Count: keepaliveCount}

// tcpStateOf is tcpState (a variable for the tests, which cannot make a
// loopback peer stop acknowledging).
var tcpStateOf = tcpState

// An open tunnel whose proxy left the rotation is watched from then on:
// once its connection to the proxy shows no sign of life (silent, for
// FirstByteTimeout) both its connections are closed, so its client
// learns at once and may open another (through a proxy of the
// rotation). One that lives goes on: a proxy taken out alive (drained,
// recycled) carries its tunnels to their end.
type tunnelSet struct {
	mu   sync.Mutex
	byID map[string]map[*tunnel]struct{}
	left map[*tunnel]struct{} // whose proxy left the rotation
}

func newTunnelSet() *tunnelSet {
	return &tunnelSet{byID: map[string]map[*tunnel]struct{}{}, left: map[*tunnel]struct{}{}}
}

func (s *tunnelSet) add(t *tunnel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.byID[t.proxyID]
	if m == nil {
		m = map[*tunnel]struct{}{}
		s.byID[t.proxyID] = m
	}
	m[t] = struct{}{}
}

func (s *tunnelSet) remove(t *tunnel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.byID[t.proxyID]; m != nil {
		delete(m, t)
		if len(m) == 0 {
			delete(s.byID, t.proxyID)
		}
	}
	delete(s.left, t)
}

// markLeft watches the tunnels whose proxy is not in the rotation (and
// stops watching those whose proxy came back).
func (s *tunnelSet) markLeft(p Picker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.left)
	for id, m := range s.byID {
		if _, ok := p.Get(id); ok {
			continue
		}
		for t := range m {
			s.left[t] = struct{}{}
		}
	}
}

// closeSilent closes the watched tunnels whose proxy connection is
// silent for d.
func (s *tunnelSet) closeSilent(d time.Duration) {
	s.mu.Lock()
	var dead []*tunnel
	for t := range s.left {
		if silent(t.up, d) {
			dead = append(dead, t)
			delete(s.left, t)
		}
	}
	s.mu.Unlock()
	for _, t := range dead {
		t.g.m.failure(causeSilent).Inc()
		t.g.log.Info("gateway: a tunnel's proxy left the rotation and is silent, tunnel closed", "proxy", t.proxyID)
		t.client.Close()
		t.up.Close()
	}
}
