package gateway

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tunnelBufSize is the buffer a tunnel's burst is read into.
const tunnelBufSize = 32 << 10

// tunnelBufs are the tunnels' read buffers: one is taken when bytes are
// there to read and given back once they are written, so an idle tunnel
// holds none.
var tunnelBufs = sync.Pool{New: func() any { b := make([]byte, tunnelBufSize); return &b }}

// pipeSize is the capacity asked of a splice pipe (the most a burst
// moves): the default bound of an unprivileged pipe (fs.pipe-max-size).
const pipeSize = 1 << 20

// splicePipe is a pipe a bulk burst is spliced through; it is empty
// whenever it is not in use (one that kept bytes is closed, not given
// back), and its descriptors are closed once the pool drops it.
type splicePipe struct {
	r, w    int
	cleanup runtime.Cleanup
}

// pipes are the empty splice pipes not in use: one is taken when bytes
// are there to read and given back once they are written, so an idle
// tunnel holds none.
var pipes sync.Pool

// getPipe takes a pipe from pipes or makes one; nil if none can be
// made (out of descriptors).
func getPipe() *splicePipe {
	if p, ok := pipes.Get().(*splicePipe); ok {
		return p
	}
	var fds [2]int
	if unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK) != nil {
		return nil
	}
	// A smaller pipe works too, with more splices.
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	p := &splicePipe{r: fds[0], w: fds[1]}
	p.cleanup = runtime.AddCleanup(p, func(fds [2]int) {
		unix.Close(fds[0])
		unix.Close(fds[1])
	}, fds)
	return p
}

// close closes a pipe that is not given back.
func (p *splicePipe) close() {
	p.cleanup.Stop()
	unix.Close(p.r)
	unix.Close(p.w)
}

// errNoSplice: this burst cannot be spliced (no pipe could be made, or
// the socket does not splice); nothing was read.
var errNoSplice = errors.New("no splice")

// pump copies src to dst until src's EOF, storing the time (unix ns)
// in seen after every burst. Between two *net.TCPConn it waits for src
// in the poller and reads what is queued into a pooled buffer in the
// same step (a read a burst, and one that finds nothing before each
// wait), then writes it to dst: a burst costs a read and a write. Once
// a burst fills the buffer (bulk bytes: more is queued), the direction
// splices instead: what is queued, up to pipeSize, moves into a pooled
// pipe and on to dst in the kernel (a splice each way, no copy through
// the buffer). An idle tunnel holds its two sockets and nothing else
// (no buffer, no pipe).
//
// rc and wc are src's and dst's raw connections when the caller has
// them (nil: taken here).
func pump(dst, src net.Conn, rc, wc syscall.RawConn, seen *atomic.Int64) (int64, error) {
	s, ok := src.(*net.TCPConn)
	d, ok2 := dst.(*net.TCPConn)
	if !ok || !ok2 {
		return io.Copy(dst, seenReader{src, seen})
	}
	var err error
	if rc == nil {
		if rc, err = s.SyscallConn(); err != nil {
			return io.Copy(dst, seenReader{src, seen})
		}
	}
	if wc == nil {
		if wc, err = d.SyscallConn(); err != nil {
			return io.Copy(dst, seenReader{src, seen})
		}
	}
	b := burstsPool.Get().(*bursts)
	b.rc, b.wc = rc, wc
	defer b.put()
	var total int64
	bulk := false
	for {
		if bulk {
			n, err := b.splice()
			if n > 0 {
				seen.Store(time.Now().UnixNano())
				total += int64(n)
			}
			switch {
			case errors.Is(err, errNoSplice):
				bulk = false
				continue
			case err != nil:
				return total, err
			case n == 0:
				return total, nil // EOF
			}
			continue
		}
		bp, n, err := b.read()
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil // EOF
		}
		seen.Store(time.Now().UnixNano())
		k, err := dst.Write((*bp)[:n])
		tunnelBufs.Put(bp)
		total += int64(k)
		if err != nil {
			return total, err
		}
		bulk = n == tunnelBufSize
	}
}

// bursts moves one direction's bursts from the socket of rc to that of
// wc with raw reads, writes and splices. Its callbacks are made once
// (it is pooled), so neither a burst nor a tunnel allocates them.
type bursts struct {
	rc, wc              syscall.RawConn
	bp                  *[]byte     // the burst's buffer (read)
	p                   *splicePipe // the burst's pipe (splice)
	n                   int         // what the read or splice in brought
	left                int         // what is still in the pipe
	err                 error       // the syscall's error
	readFn, inFn, outFn func(fd uintptr) bool
}

// burstsPool holds the bursts of the directions not running, their
// callbacks made.
var burstsPool = sync.Pool{New: func() any {
	b := &bursts{}
	b.readFn, b.inFn, b.outFn = b.readFD, b.spliceIn, b.spliceOut
	return b
}}

// put gives b back to burstsPool, holding no connection.
func (b *bursts) put() {
	b.rc, b.wc, b.bp, b.p, b.err = nil, nil, nil, nil, nil
	burstsPool.Put(b)
}

// read waits until the socket has something to read (or its EOF, n 0)
// and reads it into a buffer of tunnelBufs, which the caller gives
// back; no buffer is held while it waits.
func (b *bursts) read() (bp *[]byte, n int, err error) {
	b.bp, b.n, b.err = nil, 0, nil
	err = b.rc.Read(b.readFn)
	if err == nil {
		err = b.err
	}
	bp, n = b.bp, b.n
	b.bp = nil
	if err != nil || n <= 0 {
		if bp != nil {
			tunnelBufs.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, nil
}

func (b *bursts) readFD(fd uintptr) bool {
	b.bp = tunnelBufs.Get().(*[]byte)
	for {
		b.n, b.err = unix.Read(int(fd), *b.bp)
		if b.err != unix.EINTR {
			break
		}
	}
	if b.err == unix.EAGAIN {
		tunnelBufs.Put(b.bp)
		b.bp = nil
		return false
	}
	return true
}

// splice waits until the socket of rc has something to read (or its
// EOF: n 0) and splices what is queued, up to pipeSize, into a pipe of
// pipes in the same step, then from the pipe to the socket of wc
// (waiting while it is full); n is what reached it. No pipe is held
// while it waits for rc. errNoSplice: nothing was read, the burst is to
// be read instead.
func (b *bursts) splice() (n int, err error) {
	b.p, b.n, b.err = nil, 0, nil
	err = b.rc.Read(b.inFn)
	if err == nil && b.err != nil {
		err = b.err
		if !errors.Is(err, errNoSplice) {
			err = os.NewSyscallError("splice", err)
		}
	}
	p := b.p
	b.p = nil
	if err != nil || b.n <= 0 {
		if p != nil {
			pipes.Put(p) // nothing went in
		}
		return 0, err
	}
	b.p, b.left, b.err = p, b.n, nil
	err = b.wc.Write(b.outFn)
	b.p = nil
	if err == nil && b.err != nil {
		err = os.NewSyscallError("splice", b.err)
	}
	if b.left > 0 {
		p.close() // the bytes that did not go stay in it
	} else {
		pipes.Put(p)
	}
	return b.n - b.left, err
}

func (b *bursts) spliceIn(fd uintptr) bool {
	if b.p = getPipe(); b.p == nil {
		b.err = errNoSplice
		return true
	}
	var n int64
	for {
		n, b.err = unix.Splice(int(fd), nil, b.p.w, nil, pipeSize, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if b.err != unix.EINTR {
			break
		}
	}
	b.n = int(n)
	switch b.err {
	case unix.EAGAIN:
		pipes.Put(b.p)
		b.p = nil
		return false
	case unix.EINVAL, unix.ENOSYS, unix.EOPNOTSUPP:
		b.err = errNoSplice
	}
	return true
}

func (b *bursts) spliceOut(fd uintptr) bool {
	for b.left > 0 {
		k, err := unix.Splice(b.p.r, nil, int(fd), nil, b.left, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch err {
		case nil:
			b.left -= int(k)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			b.err = err
			return true
		}
	}
	return true
}

// peek looks at rc without waiting and without taking a byte (buf: one
// byte of the caller's, so nothing is allocated for it).
func peek(rc syscall.RawConn, buf []byte) peekResult {
	res := peekError
	if rc.Control(func(fd uintptr) { res = peekFD(fd, buf) }) != nil {
		return peekError
	}
	return res
}

// waitReadable waits (in the poller, with the connection's read
// deadline) until rc has something to read, or its EOF, and says which;
// peekError when the deadline passed or the connection failed.
func waitReadable(rc syscall.RawConn, buf []byte) peekResult {
	res := peekError
	err := rc.Read(func(fd uintptr) bool {
		res = peekFD(fd, buf)
		return res != peekNothing
	})
	if err != nil {
		return peekError
	}
	return res
}

func peekFD(fd uintptr, buf []byte) peekResult {
	n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	switch {
	case errno == unix.EAGAIN:
		return peekNothing
	case errno != 0:
		return peekError
	case n == 0:
		return peekEOF
	}
	return peekData
}
