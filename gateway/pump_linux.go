package gateway

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pump copies src to dst until src's EOF, storing the time (unix ns)
// in seen after every burst. Between two *net.TCPConn it
// splices (io.CopyN between them does), but only what src holds at the
// moment: Go's splice takes a pipe (two descriptors, and its kernel
// buffer) from a pool for as long as one copy lasts, so an io.Copy over
// a whole tunnel would hold two pipes per idle tunnel. Waiting for data
// in the poller first and splicing exactly what is queued gives the
// pipe back after every burst: an idle tunnel holds its two sockets and
// nothing else.
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
		avail, err := queued(rc)
		if err != nil {
			return total, err
		}
		if avail == 0 {
			return total, nil // EOF
		}
		n, err := io.CopyN(dst, src, int64(avail))
		total += n
		seen.Store(time.Now().UnixNano())
		if err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
	}
}

// queued waits until the socket has something to read and says how many
// bytes are queued (0: the peer's EOF).
func queued(rc syscall.RawConn) (int, error) {
	var avail int
	var ferr error
	err := rc.Read(func(fd uintptr) bool {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			ferr = err
			return true
		}
		if n > 0 {
			avail = n
			return true
		}
		// Nothing queued: EOF, an error, or wait for the poller.
		var b [1]byte
		m, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return false
		case err != nil:
			ferr = err
		case m > 0:
			avail = m // arrived just now
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return avail, ferr
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
