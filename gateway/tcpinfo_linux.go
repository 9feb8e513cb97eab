package gateway

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpState reads c's TCP_INFO: whether bytes sent on it wait for the
// peer's acknowledgement, and how long ago the peer's last
// acknowledgement came. ok false: c is not a TCP socket, or the look
// failed (nothing is judged by it then).
func tcpState(c net.Conn) (unacked bool, quiet time.Duration, ok bool) {
	sc, isSC := c.(syscall.Conn)
	if !isSC {
		return false, 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return false, 0, false
	}
	return info.Unacked > 0, time.Duration(info.Last_ack_recv) * time.Millisecond, true
}
