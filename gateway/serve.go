package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"proxyfleet/gateway/defaults"
	"proxyfleet/gateway/h1"
)

// The HTTP proxy's connections are served by one loop of the gateway's
// own (this file): one goroutine per client connection reads a request
// head with the strict parser of package h1 (one larger than the
// client's reader is read whole apart, up to MaxHeaderBytes) and hands
// it to route (request.go), which refuses it, answers CONNECT, or
// relays an absolute http:// request (relay.go, body.go) over a
// keep-alive connection to the picked proxy (pool.go) with a write for
// the head (and a small body) and one for the answer's head (and what
// came of its body), allocating nothing in the steady state.

const (
	// clientReadSize is a client connection's read buffer: the largest
	// request head read in place.
	clientReadSize = defaults.MinMaxHeaderBytes
	// outSize is the buffer answers are written from.
	outSize = 32 << 10
	// maxResponseHead bounds a proxy's answer's head (as http.Transport).
	maxResponseHead = 10 << 20
)

var (
	clientReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, clientReadSize) }}
	outBufs       = sync.Pool{New: func() any { b := make([]byte, 0, outSize); return &b }}
)

// Connection states, for the drain: an idle connection is closed at once.
const (
	connActive int32 = iota
	connIdle
	connClosed
)

// clientConn is one HTTP client connection.
type clientConn struct {
	g   *Gateway
	c   net.Conn
	rc  syscall.RawConn
	br  *bufio.Reader
	h   h1.Head   // the request's
	own ownFields // the request's options in its fields
	rh  h1.Head   // the answer's
	// out is the buffer heads and bodies are written from.
	out  *[]byte
	acc  []byte // an answer's head too large for a reader's buffer
	long []byte // a request's head too large for br

	idleUntil time.Time // the read deadline set for the next request
	// held is the length of the request's body that went to a proxy
	// with its head and is still at the front of br, kept until the
	// answer comes so another proxy may be sent it (0: none).
	held    int
	lastEnd time.Time // when the last answer ended (zero: not known)
	// headBy is the deadline of the head being read (HeaderTimeout from
	// the accept, or from a next request's first byte); zero: none yet.
	headBy time.Time
	// unauth is the connection's place under MaxUnauthenticated until
	// it presents a valid credential.
	unauth unauthSlot

	// The last credential that passed, and what it gave: a connection
	// sends the same one with every request.
	authRaw  []byte
	authUser *user
	authOpts options

	headLen      int  // the request's head, still in br (0: consumed)
	sentContinue bool // 100 Continue went to the client for this request

	state    atomic.Int32
	stopping atomic.Bool            // the CONNECT watch is being stopped
	up       atomic.Pointer[upConn] // the proxy connection in use, closed by Close
	closed   atomic.Bool
	peekBuf  [1]byte

	// fields back h.Fields for a head of up to len(fields) fields, so
	// parsing one allocates nothing.
	fields [4]h1.Field
}

// serveHTTP accepts the HTTP proxy's clients until ln is closed (stop
// closed first: then it returns nil), each in a goroutine of its own.
func (g *Gateway) serveHTTP(ln net.Listener, stop <-chan struct{}) error {
	return g.accept(ln, stop, "HTTP", func(c net.Conn) {
		cc := &clientConn{g: g, c: c}
		if !cc.unauth.take(g.unauth) {
			g.m.refusedUnauth.Inc()
			c.Close()
			return
		}
		cc.headBy = time.Now().Add(g.cfg.HeaderTimeout)
		if sc, ok := c.(syscall.Conn); ok {
			cc.rc, _ = sc.SyscallConn()
		}
		g.track.add(cc)
		go func() {
			defer g.track.done(cc)
			cc.serve()
		}()
	})
}

// Close closes the client's connection and the proxy connection in use
// (the tracker's hard stop).
func (cc *clientConn) Close() error {
	cc.closed.Store(true)
	cc.state.Store(connClosed)
	if u := cc.up.Load(); u != nil {
		u.c.Close()
	}
	return cc.c.Close()
}

// closeIfIdle closes the connection if it waits for a request (the
// drain).
func (cc *clientConn) closeIfIdle() {
	if cc.state.CompareAndSwap(connIdle, connClosed) {
		cc.c.Close()
	}
}

// use records u as the proxy connection in use (nil: none), so a hard
// stop closes it too.
func (cc *clientConn) use(u *upConn) {
	cc.up.Store(u)
	if u != nil && cc.closed.Load() {
		u.c.Close()
	}
}

// gone says whether the client has left while it waits for an answer:
// its connection was closed (or reset); bytes it sent meanwhile (a
// pipelined request) say it is there.
func (cc *clientConn) gone() bool {
	if cc.closed.Load() {
		return true
	}
	if cc.br != nil && cc.br.Buffered() > cc.held || cc.rc == nil {
		return false
	}
	r := peek(cc.rc, cc.peekBuf[:])
	return r == peekEOF || r == peekError
}

// serve runs requests until the connection ends or becomes a tunnel.
func (cc *clientConn) serve() {
	g := cc.g
	cc.br = clientReaders.Get().(*bufio.Reader)
	cc.br.Reset(cc.c)
	cc.out = outBufs.Get().(*[]byte)
	cc.h.Fields = cc.fields[:0]
	handed := false
	defer func() {
		cc.release()
		if !handed {
			cc.unauth.release()
			cc.c.Close()
		}
	}()
	// The first request's head is due HeaderTimeout after the accept
	// (headBy), however long it takes to begin.
	first := true
	if cc.c.SetReadDeadline(cc.headBy) != nil {
		return
	}
	for {
		// Idle: the drain may close it now.
		cc.state.Store(connIdle)
		if g.draining.Load() || cc.closed.Load() {
			return
		}
		if first {
			if _, err := cc.br.Peek(1); err != nil {
				return
			}
		} else if cc.br.Buffered() == 0 {
			// The deadline is set again only once it is more than a
			// slack older than KeepAliveTimeout (setting it costs; so does
			// reading the clock: the last answer's end is taken).
			now := cc.lastEnd
			if now.IsZero() {
				now = time.Now()
			}
			if cc.idleUntil.Sub(now) < g.cfg.KeepAliveTimeout-min(time.Second, g.cfg.KeepAliveTimeout/8) {
				cc.idleUntil = now.Add(g.cfg.KeepAliveTimeout)
				if cc.c.SetReadDeadline(cc.idleUntil) != nil {
					return
				}
			}
			if _, err := cc.br.Peek(1); err != nil {
				return
			}
		}
		cc.lastEnd = time.Time{}
		if !cc.state.CompareAndSwap(connIdle, connActive) {
			return // closed by the drain
		}
		raw, err := h1.PeekHead(cc.br, true, func() error {
			if first {
				return nil // due since the accept
			}
			// A next request: due HeaderTimeout after its first byte.
			cc.idleUntil = time.Time{}
			cc.headBy = time.Now().Add(g.cfg.HeaderTimeout)
			return cc.c.SetReadDeadline(cc.headBy)
		})
		headLen := len(raw) // what of br the head takes (0: consumed)
		if errors.Is(err, h1.ErrTooLarge) {
			// Larger than the reader's buffer: read whole (up to
			// MaxHeaderBytes) into a buffer of its own, and checked and
			// served as any other.
			raw, err = cc.readLongHead(first)
			headLen = 0
		}
		if err == nil {
			err = cc.h.Parse(raw, true)
		}
		keep, tunneled := cc.route(headLen, err)
		if tunneled {
			handed = true
			return // the tunnel's now
		}
		if !keep {
			return
		}
		cc.consumeHead() // (every answer that keeps the connection did)
		first, cc.headBy = false, time.Time{}
	}
}

// release gives the connection's buffers back.
func (cc *clientConn) release() {
	if cc.br != nil {
		cc.br.Reset(nil)
		clientReaders.Put(cc.br)
		cc.br = nil
	}
	if cc.out != nil {
		if cap(*cc.out) <= 2*outSize { // not one grown for a huge head
			*cc.out = (*cc.out)[:0]
			outBufs.Put(cc.out)
		}
		cc.out = nil
	}
	cc.acc, cc.long = nil, nil
	cc.h, cc.rh, cc.own = h1.Head{}, h1.Head{}, ownFields{}
	cc.fields = [len(cc.fields)]h1.Field{} // (their bytes are the buffers')
}

// readLongHead reads a request head that does not fit the client's
// reader (consumed from it) into cc.long, up to MaxHeaderBytes: over it,
// errHeadTooLarge. A next request's head is due HeaderTimeout from now
// if its deadline was not set yet.
func (cc *clientConn) readLongHead(first bool) ([]byte, error) {
	if !first && cc.headBy.IsZero() {
		cc.idleUntil = time.Time{}
		cc.headBy = time.Now().Add(cc.g.cfg.HeaderTimeout)
		if err := cc.c.SetReadDeadline(cc.headBy); err != nil {
			return nil, err
		}
	}
	return h1.ReadLongHead(cc.br, &cc.long, cc.g.cfg.MaxHeaderBytes)
}

// Closing a connection whose peer still sends (a refused request's body)
// resets it, and the peer may lose the answer it was sent: first the
// write side is closed, then what comes is read and dropped, up to
// lingerBytes or for lingerTime.
const (
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 256 << 10
)

// lingerClose closes c's write side and drains it (the caller closes c).
func lingerClose(c net.Conn) {
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil || c.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, lingerBytes)
}

// write writes b to the client.
func (cc *clientConn) write(b []byte) error {
	_, err := cc.c.Write(b)
	return err
}

// reply answers the request with the gateway's own answer, as
// http.Error does (text/plain, nosniff, the text and a newline); hdr
// are more header lines ("Name: value"). It says whether the
// connection may go on.
func (cc *clientConn) reply(status int, text string, hdr ...string) bool {
	b := cc.startHead(status)
	for _, h := range hdr {
		b = append(b, h...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n"...)
	return cc.finishReply(b, []byte(text+"\n"))
}

// startHead starts an answer of the gateway's own in cc.out.
func (cc *clientConn) startHead(status int) []byte {
	return h1.AppendStart((*cc.out)[:0], status, time.Now())
}

// finishReply ends an answer of the gateway's own with its body, and
// writes it. A request whose body was not read closes the connection.
func (cc *clientConn) finishReply(b, body []byte) bool {
	keep := cc.keepAlive() && !cc.hasBody()
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n"...)
	b = cc.appendConnection(b, keep)
	b = append(b, "\r\n"...)
	b = append(b, body...)
	*cc.out = b[:0]
	if cc.write(b) != nil {
		return false
	}
	if keep {
		cc.consumeHead()
	}
	return keep
}
