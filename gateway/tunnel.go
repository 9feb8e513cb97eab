package gateway

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// seenReader reads r, storing the time (unix ns) in seen after every
// read that brought bytes.
type seenReader struct {
	r    io.Reader
	seen *atomic.Int64
}

func (s seenReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.seen.Store(time.Now().UnixNano())
	}
	return n, err
}

// tracker counts what the gateway runs (handlers, handshakes, tunnels)
// and holds the connections it must close when a drain runs out.
type tracker struct {
	mu     sync.Mutex
	n      int
	idle   chan struct{} // made by wait while n > 0, closed when n gets to 0
	closed bool          // closeAll ran: whatever registers now is closed at once
	conns  map[io.Closer]struct{}
}

func newTracker() *tracker {
	return &tracker{conns: map[io.Closer]struct{}{}}
}

// closedChan is a closed channel: wait's answer while nothing runs.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// add counts one more thing running, with its connections.
func (t *tracker) add(conns ...io.Closer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	for _, c := range conns {
		if t.closed {
			c.Close()
			continue
		}
		t.conns[c] = struct{}{}
	}
}

// done says one thing stopped; its connections are forgotten (their
// owner closes them).
func (t *tracker) done(conns ...io.Closer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range conns {
		delete(t.conns, c)
	}
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// wait is closed once nothing runs. (Its channel is made only when asked
// for: counting a request allocates nothing.)
func (t *tracker) wait() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return closedChan
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	return t.idle
}

// closeIdle closes the HTTP client connections that wait for a
// request (the drain's start).
func (t *tracker) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		if cc, ok := c.(*clientConn); ok {
			cc.closeIfIdle()
		}
	}
}

// closeAll closes every connection held, and any registered later.
func (t *tracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	clear(t.conns)
}

// tunnel pipes client and up both ways. The caller has counted it in the
// tracker (add with both connections); the last direction to end closes
// both, counts the bytes, gives back what it holds (release, the
// user's connection, the in-flight count of kind) and says done. A
// tunnel that carried no byte either way for IdleTimeout is closed:
// each direction reads under a deadline, IdleTimeout after the last
// byte either way.
type tunnel struct {
	g          *Gateway
	proxyID    string // the proxy that carries it
	client, up net.Conn
	// crc and urc are client's and up's raw connections (nil: taken by
	// pump when it needs them).
	crc, urc  syscall.RawConn
	release   func()       // the picker's hold on the proxy (nil: none)
	user      *user        // the user whose connection it is (nil: none)
	kind      string       // the request's kind, counted in flight ("": none)
	seen      atomic.Int64 // when a byte last went either way (unix ns)
	mu        sync.Mutex
	left      int
	up2, down int64
}

// run copies client to up in a goroutine of its own and up to client in
// the caller's. Between two *net.TCPConn (Linux, see pump) a buffer is
// taken from a pool for each burst only: an idle tunnel holds none.
func (t *tunnel) run() {
	t.left = 2
	t.seen.Store(time.Now().UnixNano())
	t.g.tunnels.add(t)
	if _, ok := t.g.picker.Get(t.proxyID); !ok {
		t.g.tunnels.markLeft(t.g.picker) // it left as the tunnel opened
	}
	t.g.track.add()
	go func() {
		defer t.g.track.done()
		t.copy(t.up, t.client, true)
	}()
	t.copy(t.client, t.up, false)
}

func (t *tunnel) copy(dst, src net.Conn, up bool) {
	idle := t.g.cfg.IdleTimeout
	var n int64
	err := src.SetReadDeadline(time.Now().Add(idle))
	for err == nil {
		var k int64
		rc, wc := t.urc, t.crc
		if up {
			rc, wc = t.crc, t.urc
		}
		k, err = pump(dst, src, rc, wc, &t.seen)
		n += k
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		// Nothing came this way for IdleTimeout: over unless bytes
		// went the other way meanwhile.
		last := time.Unix(0, t.seen.Load())
		if time.Since(last) >= idle {
			t.g.m.idleTunnel.Inc()
			t.g.log.Debug("gateway: tunnel idle, closed", "idle", idle)
			break
		}
		err = src.SetReadDeadline(last.Add(idle))
	}
	t.mu.Lock()
	if up {
		t.up2 = n
	} else {
		t.down = n
	}
	t.left--
	last := t.left == 0
	t.mu.Unlock()
	if !last {
		if err != nil {
			// One side failed: the other direction is over too.
			t.client.Close()
			t.up.Close()
		} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
		return
	}
	// Both directions are over: the closes end the write sides too.
	t.client.Close()
	t.up.Close()
	t.g.tunnels.remove(t)
	t.g.m.bytesUp.Add(float64(t.up2))
	t.g.m.bytesDown.Add(float64(t.down))
	if t.release != nil {
		t.release()
	}
	if t.user != nil {
		t.user.release()
	}
	if t.kind != "" {
		t.g.m.flight(t.kind).Dec()
	}
	t.g.track.done(t.client, t.up)
}
