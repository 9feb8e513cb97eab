package gateway

import (
	"io"
	"net"
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

// pump copies src to dst until src's EOF, storing the time (unix ns)
// in seen after every burst. Between two *net.TCPConn it waits for src
// in the poller and reads what is queued into a pooled buffer in the
// same step (a read a burst, and one that finds nothing before each
// wait), then writes it to dst: a burst costs a read and a write (a
// splice would cost a look at what is queued, two splices and a pipe
// taken from a pool). An idle tunnel holds its two sockets and nothing
// else (no buffer, no pipe).
func pump(dst, src net.Conn, seen *atomic.Int64) (int64, error) {
	s, ok := src.(*net.TCPConn)
	if _, ok2 := dst.(*net.TCPConn); !ok || !ok2 {
		return io.Copy(dst, seenReader{src, seen})
	}
	rc, err := s.SyscallConn()
	if err != nil {
		return io.Copy(dst, seenReader{src, seen})
	}
	var total int64
	for {
		bp, n, err := readBurst(rc)
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
	}
}

// readBurst waits until the socket has something to read (or its EOF,
// n 0) and reads it into a buffer of tunnelBufs, which the caller gives
// back; no buffer is held while it waits.
func readBurst(rc syscall.RawConn) (bp *[]byte, n int, err error) {
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		bp = tunnelBufs.Get().(*[]byte)
		for {
			n, rerr = unix.Read(int(fd), *bp)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			tunnelBufs.Put(bp)
			bp = nil
			return false
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil || n <= 0 {
		if bp != nil {
			tunnelBufs.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, nil
}

// peekResult is what a look at a socket without a read found.
type peekResult int

const (
	peekNothing peekResult = iota // nothing to read: open and quiet
	peekData                      // bytes wait to be read
	peekEOF                       // the peer closed
	peekError                     // reset, or the look failed
)

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
