package health

import (
	"context"
	"net"
)

// TCPProber probes a proxy by a TCP connect to its address, closed at
// once: what health does when no probe target is configured. It proves
// that something listens on the proxy's port, no more (no egress, no
// leak, no open check).
type TCPProber struct{}

// Probe connects to addr and closes the connection.
func (TCPProber) Probe(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// Check is Probe.
func (t TCPProber) Check(ctx context.Context, addr string, _ bool) Findings {
	return Findings{Kind: KindTCP, Err: t.Probe(ctx, addr)}
}

// ChecksOpen is false: a TCP connect carries no request.
func (TCPProber) ChecksOpen() bool { return false }
