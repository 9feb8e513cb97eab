// Package faultproxy is a TCP proxy for tests that can stall or reset the
// connections it carries, on command.
//
// A Proxy listens on one address and forwards every accepted connection to a
// target. It has two modes and one action:
//
//   - Pass (the default): bytes flow both ways.
//   - Stall: bytes stop moving in both directions, on current and new
//     connections, without closing anything: no FIN, no RST. To the peers it
//     looks like a host that vanished from the network; only TCP
//     retransmission timers (or their own keepalives and deadlines) would
//     ever notice. Accepted connections are kept but not forwarded.
//   - Reset: every current connection is closed with an RST (SO_LINGER 0)
//     on both sides, at once. The mode goes back to Pass, so connections
//     made after a reset pass.
//
// The proxy is bounded (MaxConns connections; more are refused by closing
// them) and stoppable: Close stops accepting, resets every connection and
// waits for every goroutine it started.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Config configures a Proxy.
type Config struct {
	// Listen is the address to listen on; empty means "127.0.0.1:0".
	Listen string
	// Target is the address every connection is forwarded to.
	Target string
	// MaxConns bounds the connections carried at once; 0 means 64.
	MaxConns int
	// DialTimeout bounds the dial to Target; 0 means 5s.
	DialTimeout time.Duration
}

// Proxy is a fault-injecting TCP proxy. Its methods are safe for concurrent
// use.
type Proxy struct {
	cfg Config
	ln  net.Listener

	mu      sync.Mutex
	stalled bool
	changed chan struct{} // closed and replaced on every mode change
	conns   map[*pair]struct{}
	closed  bool
	wg      sync.WaitGroup // every goroutine the proxy started
}

// pair is one proxied connection: client side and server side.
type pair struct {
	client net.Conn
	done   chan struct{} // closed when the pair is torn down

	mu     sync.Mutex
	server net.Conn // set once the target answered
	torn   bool     // both sides closed
	rst    bool     // and how
}

// New starts a proxy.
func New(cfg Config) (*Proxy, error) {
	if cfg.Target == "" {
		return nil, errors.New("faultproxy: no target")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 64
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen %s: %w", cfg.Listen, err)
	}
	p := &Proxy{
		cfg:     cfg,
		ln:      ln,
		changed: make(chan struct{}),
		conns:   make(map[*pair]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall stops bytes moving on every current and future connection until
// Pass or Reset.
func (p *Proxy) Stall() { p.setStalled(true) }

// Pass lets bytes flow again.
func (p *Proxy) Pass() { p.setStalled(false) }

// Reset closes every current connection with an RST on both sides and
// returns to Pass, so later connections pass.
func (p *Proxy) Reset() {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		pairs = append(pairs, c)
	}
	p.mu.Unlock()
	for _, c := range pairs {
		c.reset()
	}
	p.setStalled(false)
}

// Conns is the number of connections carried now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the proxy: no more connections are accepted, every current one
// is reset, and Close returns once every goroutine of the proxy has ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) setStalled(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == v {
		return
	}
	p.stalled = v
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitPass blocks while the proxy is stalled. It returns false when the pair
// was torn down meanwhile.
func (p *Proxy) waitPass(c *pair) bool {
	for {
		p.mu.Lock()
		stalled, changed := p.stalled, p.changed
		p.mu.Unlock()
		if !stalled {
			select {
			case <-c.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-changed:
		case <-c.done:
			return false
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		p.mu.Lock()
		if p.closed || len(p.conns) >= p.cfg.MaxConns {
			p.mu.Unlock()
			_ = conn.Close()
			continue
		}
		c := &pair{client: conn, done: make(chan struct{})}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

// serve dials the target and runs the two pumps of one pair.
func (p *Proxy) serve(c *pair) {
	defer p.wg.Done()
	defer func() {
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	server, err := d.Dial("tcp", p.cfg.Target)
	if err != nil {
		return
	}
	c.mu.Lock()
	if c.torn { // torn down while dialing
		closeConn(server, c.rst)
		c.mu.Unlock()
		return
	}
	c.server = server
	c.mu.Unlock()
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(c, server, c.client) }()
	go func() { defer pumps.Done(); p.pump(c, c.client, server) }()
	pumps.Wait()
}

// pump copies src to dst until either side fails, holding bytes back while
// the proxy is stalled. When src ends cleanly, dst's write half is closed so
// a FIN travels on; any other end tears the pair down.
func (p *Proxy) pump(c *pair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if !p.waitPass(c) {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitPass(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				c.close()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if !p.waitPass(c) {
					return
				}
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				// The other direction ends on its own; if it is
				// waiting on a stall it ends with the pair.
				return
			}
			c.close()
			return
		}
	}
}

// close tears the pair down with an ordinary close.
func (c *pair) close() { c.teardown(false) }

// reset tears the pair down with an RST on both sides.
func (c *pair) reset() { c.teardown(true) }

// teardown closes both sides once; the first caller decides between an
// ordinary close and an RST.
func (c *pair) teardown(rst bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.torn {
		return
	}
	c.torn = true
	close(c.done)
	c.rst = rst
	closeConn(c.client, rst)
	if c.server != nil {
		closeConn(c.server, rst)
	}
}

func closeConn(conn net.Conn, rst bool) {
	if tc, ok := conn.(*net.TCPConn); ok && rst {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
