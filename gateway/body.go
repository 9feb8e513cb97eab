package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"proxyfleet/gateway/h1"
)

// Bodies of a plain request: the request's goes to the proxy as it came
// (by its length, or chunked again), the answer's to the client by its
// length, or chunked (what came chunked or until the proxy closed, to an
// HTTP/1.1 client; as it comes and then a close, to an HTTP/1.0 one).
// Bytes are written as soon as no more can be read without a wait, so a
// slow or endless answer reaches the client as it comes, and a small one
// goes in the write of its head.

// errBodyChunked: a request's chunked body was malformed; the proxy's
// connection is closed (it never sees the rest as a request of its own)
// and the client is answered 400.
var errBodyChunked = &h1.Error{Status: http.StatusBadRequest, Text: "malformed chunked request body"}

// bodySender sends a request's body to the proxy in a goroutine of its
// own while the answer is awaited: a proxy may answer before it has read
// it all.
type bodySender struct {
	client    net.Conn      // read under a deadline IdleTimeout after the last byte either way
	idle      time.Duration // IdleTimeout
	until     time.Time     // the client's read deadline
	stopping  atomic.Bool   // abort runs: the deadline stays in the past
	done      chan struct{}
	n         int64 // body bytes taken from the client
	clientErr error // reading the client failed: it left (or sent a bad body)
	upErr     error // writing to the proxy failed
}

// copyBufs are the buffers a request's body is sent from.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// sendBody starts sending the request's body (its head is sent) to uc.
// Once it is all sent, the response timeout starts.
func (cc *clientConn) sendBody(uc *upConn, timeout time.Duration) *bodySender {
	idle := cc.g.cfg.IdleTimeout
	s := &bodySender{client: cc.c, idle: idle, until: time.Now().Add(idle), done: make(chan struct{})}
	length, chunked, br := cc.h.Length, cc.h.Chunked, cc.br
	go func() {
		defer close(s.done)
		bp := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(bp)
		if chunked {
			s.chunked(br, uc.c, *bp)
		} else {
			s.fixed(br, uc.c, length, *bp)
		}
		switch {
		case s.clientErr != nil:
			if errors.Is(s.clientErr, os.ErrDeadlineExceeded) {
				cc.g.m.idleBody.Inc()
			}
			uc.c.Close() // the wait for the answer ends: nobody wants it
		case s.upErr == nil:
			uc.limit.CompareAndSwap(-1, time.Now().Add(timeout).UnixNano())
			uc.client.Store(cc) // polled again while the answer is awaited
		}
	}()
	return s
}

// senderGrace is how long an answered request's body may take to be
// sent whole (its last write may still be under way as the answer
// comes) before the sender is stopped and both connections closed.
const senderGrace = 500 * time.Millisecond

// finish waits (up to senderGrace) for the sender to end, and says
// whether the whole body was sent.
func (s *bodySender) finish() bool {
	select {
	case <-s.done:
	default:
		t := time.NewTimer(senderGrace)
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
			return false
		}
	}
	return s.clientErr == nil && s.upErr == nil
}

// abort ends the sender (if it still runs, by closing the proxy's
// connection and unblocking the client's) and waits for it.
func (s *bodySender) abort(cc *clientConn, uc *upConn) {
	select {
	case <-s.done:
		return
	default:
	}
	s.stopping.Store(true)
	uc.c.Close()
	_ = cc.c.SetReadDeadline(aLongTimeAgo)
	<-s.done
	if s.clientErr == nil && s.upErr == nil {
		s.upErr = net.ErrClosed
	}
}

// touch moves the client's read deadline to IdleTimeout from now: a
// byte went one way. It is set again only once it is more than an
// eighth of IdleTimeout old (setting it costs).
func (s *bodySender) touch() {
	now := time.Now()
	if s.until.Sub(now) >= s.idle-s.idle/8 {
		return
	}
	s.until = now.Add(s.idle)
	_ = s.client.SetReadDeadline(s.until)
	if s.stopping.Load() {
		_ = s.client.SetReadDeadline(aLongTimeAgo) // abort's, which this one may have undone
	}
}

func (s *bodySender) fixed(br *bufio.Reader, up net.Conn, n int64, buf []byte) {
	for n > 0 {
		k, err := br.Read(buf[:min(n, int64(len(buf)))])
		if k > 0 {
			s.n += int64(k)
			n -= int64(k)
			if _, werr := up.Write(buf[:k]); werr != nil {
				s.upErr = werr
				return
			}
			s.touch()
		}
		if err != nil && n > 0 {
			s.clientErr = err
			return
		}
	}
}

// chunkRoom is the room before a chunk's data for its size line.
const chunkRoom = 18

func (s *bodySender) chunked(br *bufio.Reader, up net.Conn, buf []byte) {
	for {
		size, err := h1.ReadChunkSize(br)
		if err != nil {
			s.clientErr = err
			return
		}
		s.touch()
		if size == 0 {
			if err := h1.ReadTrailers(br); err != nil {
				s.clientErr = err
				return
			}
			if _, err := io.WriteString(up, "0\r\n\r\n"); err != nil {
				s.upErr = err
			}
			return
		}
		for size > 0 {
			k, err := br.Read(buf[chunkRoom : chunkRoom+int(min(size, int64(len(buf)-chunkRoom-2)))])
			if k > 0 {
				s.n += int64(k)
				size -= int64(k)
				h := strconv.AppendInt(buf[:0:chunkRoom], int64(k), 16)
				h = append(h, "\r\n"...)
				start := chunkRoom - len(h)
				copy(buf[start:], h)
				end := chunkRoom + k
				buf[end], buf[end+1] = '\r', '\n'
				if _, werr := up.Write(buf[start : end+2]); werr != nil {
					s.upErr = werr
					return
				}
				s.touch()
			}
			if err != nil && size > 0 {
				s.clientErr = err
				return
			}
		}
		if err := h1.ReadCRLF(br); err != nil {
			s.clientErr = err
			return
		}
	}
}

// How an answer's body is framed.
const (
	bodyNone = iota
	bodyLength
	bodyChunked
	bodyClose
)

// answer relays the proxy's answer (its head is in cc.rh) to the client
// and says whether the client's connection goes on.
func (cc *clientConn) answer(st *relayState) (keep bool) {
	g := cc.g
	h, rh, uc := &cc.h, &cc.rh, st.uc
	status := rh.Status()
	mode := bodyClose
	switch {
	case h.IsHead || status == http.StatusNoContent || status == http.StatusNotModified:
		mode = bodyNone
	case rh.Chunked:
		mode = bodyChunked
	case rh.Length >= 0:
		mode = bodyLength
	}
	toChunks := (mode == bodyChunked || mode == bodyClose) && !h.HTTP10
	keep = cc.keepAlive() && (mode == bodyNone || mode == bodyLength || toChunks)
	// The proxy's connection is kept only for an answer framed one way
	// (not Content-Length with chunked) that the proxy will not close.
	upKeep := !rh.Close && (!rh.HTTP10 || rh.KeepAlive) && mode != bodyClose && !rh.Both && !st.early

	b := append((*cc.out)[:0], "HTTP/1.1 "...)
	b = append(b, rh.Line[1]...)
	b = append(b, ' ')
	b = append(b, rh.Line[2]...)
	b = append(b, "\r\n"...)
	b = appendFields(b, rh.Fields)
	if mode == bodyLength || mode == bodyNone && rh.Length >= 0 && status != http.StatusNoContent {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, rh.Length, 10)
		b = append(b, "\r\n"...)
	}
	if toChunks {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	b = append(b, HeaderProxy+": "...)
	b = append(b, st.p.ID...)
	b = append(b, "\r\n"...)
	b = append(b, egressLine(st.egress)...)
	b = cc.appendConnection(b, keep)
	b = append(b, "\r\n"...)
	if st.headLen > 0 {
		_, _ = uc.br.Discard(st.headLen)
	}

	c := copier{cc: cc, up: uc.br, b: b}
	switch mode {
	case bodyNone:
		c.flush()
	case bodyLength:
		c.length(rh.Length)
	case bodyChunked:
		c.chunked(toChunks)
	case bodyClose:
		c.untilClose(toChunks)
	}
	*cc.out = c.b[:0]
	g.m.bytesDown.Add(float64(c.n))

	if s := st.sender; s != nil {
		if !s.finish() {
			s.abort(cc, uc)
			keep, upKeep = false, false
		}
		g.m.bytesUp.Add(float64(s.n))
		if s.clientErr != nil {
			keep = false
		}
	}
	cc.use(nil)
	switch {
	case c.clientErr != nil || isCanceled(c.upErr) || g.hard.Err() != nil:
		g.m.request(kindHTTP, outcomeClientGone).Inc()
		uc.c.Close()
		return false
	case c.upErr != nil:
		// The proxy failed mid-answer: the client sees it cut (its
		// length unmet, no last chunk) and the connection closed.
		g.m.request(kindHTTP, outcomeOK).Inc()
		g.log.Debug("gateway: the proxy's answer broke off", "proxy", st.p.ID, "err", c.upErr)
		uc.c.Close()
		return false
	}
	g.m.request(kindHTTP, outcomeOK).Inc()
	cc.lastEnd = time.Now()
	// Only at a clean boundary: the answer read to its end and nothing
	// after it. A byte more (a second answer nobody asked for) would
	// be read as another request's answer.
	if upKeep && uc.br.Buffered() == 0 {
		g.pool.put(uc, cc.lastEnd)
	} else {
		uc.c.Close()
	}
	return keep
}

// copier writes an answer's body to the client after its head (in b).
type copier struct {
	cc        *clientConn
	up        *bufio.Reader
	b         []byte
	n         int64 // body bytes
	upErr     error
	clientErr error
}

// flush writes what b holds.
func (c *copier) flush() bool {
	if len(c.b) == 0 {
		return true
	}
	if err := c.cc.write(c.b); err != nil {
		c.clientErr = err
		return false
	}
	c.b = c.b[:0]
	return true
}

// wait makes sure the proxy's reader holds at least one byte, writing
// what b holds first if it must wait. false at the end (eof: the proxy
// closed) or on an error.
func (c *copier) wait() (ok, eof bool) {
	if c.up.Buffered() > 0 {
		return true, false
	}
	if !c.flush() {
		return false, false
	}
	if _, err := c.up.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return false, true
		}
		c.upErr = err
		return false, false
	}
	return true, false
}

// room makes room in b for at least n more bytes.
func (c *copier) room(n int) bool {
	if cap(c.b)-len(c.b) >= n {
		return true
	}
	return c.flush() && cap(c.b) >= n
}

func (c *copier) length(n int64) {
	for n > 0 {
		if len(c.b) == cap(c.b) || c.up.Buffered() == 0 && len(c.b) > 0 {
			if !c.flush() {
				return
			}
		}
		k, err := c.up.Read(c.b[len(c.b) : len(c.b)+int(min(n, int64(cap(c.b)-len(c.b))))])
		c.b = c.b[:len(c.b)+k]
		c.n += int64(k)
		n -= int64(k)
		if err != nil && n > 0 {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			c.flush()
			c.upErr = err
			return
		}
	}
	c.flush()
}

// piece moves up to n buffered bytes of the proxy's into b, as a chunk
// of its own if toChunks. It returns how many.
func (c *copier) piece(n int64, toChunks bool) int {
	if !c.room(64) {
		return 0
	}
	k := int(min(n, int64(c.up.Buffered()), int64(cap(c.b)-len(c.b)-chunkRoom-2)))
	data, _ := c.up.Peek(k)
	if toChunks {
		c.b = strconv.AppendInt(c.b, int64(k), 16)
		c.b = append(c.b, "\r\n"...)
	}
	c.b = append(c.b, data...)
	if toChunks {
		c.b = append(c.b, "\r\n"...)
	}
	_, _ = c.up.Discard(k)
	c.n += int64(k)
	return k
}

// sizeLine waits until a chunk's size line is buffered whole (writing
// what b holds first if it must wait) and reads it.
func (c *copier) sizeLine() (int64, error) {
	buf, _ := c.up.Peek(c.up.Buffered())
	if !containsLF(buf) && !c.flush() {
		return 0, c.clientErr
	}
	return h1.ReadChunkSize(c.up)
}

func containsLF(b []byte) bool {
	for _, x := range b {
		if x == '\n' {
			return true
		}
	}
	return false
}

func (c *copier) chunked(toChunks bool) {
	for {
		size, err := c.sizeLine()
		if err != nil {
			if c.clientErr == nil {
				c.upErr = err
			}
			return
		}
		if size == 0 {
			// No trailer (the common case): the end is buffered, and goes
			// in one write with the last data; else write that first.
			if buf, _ := c.up.Peek(c.up.Buffered()); (len(buf) < 2 || buf[0] != '\r' || buf[1] != '\n') && !c.flush() {
				return
			}
			if err := h1.ReadTrailers(c.up); err != nil {
				c.upErr = err
				return
			}
			break
		}
		for size > 0 {
			if ok, eof := c.wait(); !ok {
				if eof {
					c.upErr = io.ErrUnexpectedEOF
				}
				return
			}
			size -= int64(c.piece(size, toChunks))
			if c.clientErr != nil {
				return
			}
		}
		if c.up.Buffered() < 2 && !c.flush() {
			return
		}
		if err := h1.ReadCRLF(c.up); err != nil {
			c.upErr = err
			return
		}
	}
	if toChunks {
		c.b = append(c.b, "0\r\n\r\n"...)
	}
	c.flush()
}

func (c *copier) untilClose(toChunks bool) {
	for {
		ok, eof := c.wait()
		if eof {
			break
		}
		if !ok {
			return
		}
		c.piece(int64(c.up.Buffered()), toChunks)
		if c.clientErr != nil {
			return
		}
	}
	if toChunks {
		c.b = append(c.b, "0\r\n\r\n"...)
	}
	c.flush()
}
