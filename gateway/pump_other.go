//go:build !linux

package gateway

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
)

// pump copies src to dst until src's EOF, storing the time (unix ns)
// in seen after every read (rc and wc, the raw connections, are not
// used here).
func pump(dst, src net.Conn, _, _ syscall.RawConn, seen *atomic.Int64) (int64, error) {
	return io.Copy(dst, seenReader{src, seen})
}

// peek cannot look without a read here: it says nothing is there (an
// idle connection is taken as usable, a waiting client as present).
func peek(syscall.RawConn, []byte) peekResult { return peekNothing }

// waitReadable cannot wait without a read here: it says the client is
// there.
func waitReadable(syscall.RawConn, []byte) peekResult { return peekData }
