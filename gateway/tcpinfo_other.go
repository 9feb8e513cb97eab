//go:build !linux

package gateway

import (
	"net"
	"time"
)

// tcpState cannot read a socket's TCP state here: ok is false, and no
// connection is judged silent or dead by it (a dead proxy is then left
// by the rotation's change, or waited for up to ResponseTimeout).
func tcpState(net.Conn) (unacked bool, quiet time.Duration, ok bool) { return false, 0, false }
