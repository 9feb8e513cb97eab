package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// One connection to a host's libvirtd, and how it is opened, closed and
// killed: a kill never blocks a caller (see markDead).

// conn is one connection to a host's libvirtd: a transport and the
// go-libvirt client on it. A conn is never reconnected; a dead one is
// replaced by a new one.
type conn struct {
	host string
	l    *libvirt.Libvirt
	dead chan struct{} // closed once the conn is dead; reason is set first

	mu     sync.Mutex
	reason error
	kill   func() // closes the transport; run once, outside any lock

	obs     Observer    // hears the conn's death
	live    atomic.Bool // it opened: its death is heard, not a failed dial's
	closing atomic.Bool // closed politely: the end it causes is no death
}

func newConn(host string, t net.Conn, obs Observer) *conn {
	return &conn{
		host: host,
		dead: make(chan struct{}),
		kill: func() { _ = t.Close() },
		obs:  obs,
	}
}

// markDead declares the conn dead for reason and kills its transport.
//
// The order is what keeps a kill from blocking callers, and must stay as it
// is (TestMarkDead_slowKillDoesNotBlockCallers):
//
//  1. the reason is set and dead is closed under mu, so every caller
//     parked on the conn, and every caller arriving later, sees it dead at
//     once and returns, whatever the kill does next;
//  2. the kill runs after mu is released, in the goroutine that won the
//     race to mark the conn dead: other callers never wait for it. There is
//     no sync.Once around the kill: Once.Do makes concurrent callers wait
//     until the first call's body returns, which is the queue this avoids.
//
// It reports whether this call was the one that marked the conn dead.
func (c *conn) markDead(reason error) bool {
	c.mu.Lock()
	select {
	case <-c.dead:
		c.mu.Unlock()
		return false
	default:
	}
	c.reason = reason
	close(c.dead)
	kill := c.kill
	c.mu.Unlock()
	kill()
	if c.live.Load() && !c.closing.Load() && !errors.Is(reason, ErrLinkClosed) {
		c.obs.Death(reason)
	}
	return true
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// deadErr is the transient error callers of a dead conn get.
func (c *conn) deadErr() error {
	c.mu.Lock()
	reason := c.reason
	c.mu.Unlock()
	return fleet.Transient(&deadError{host: c.host, reason: reason})
}

// onceDialer hands go-libvirt a transport dialed beforehand (under our own
// deadline and ctx), once. It implements go-libvirt's socket.Dialer.
type onceDialer struct {
	used atomic.Bool
	t    net.Conn
}

func (d *onceDialer) Dial() (net.Conn, error) {
	if d.used.Swap(true) {
		return nil, errors.New("libvirt transport already used")
	}
	return d.t, nil
}

// gatedConn holds back the transport's first read error until the connect
// that opened libvirt on it has stopped waiting for ConnectToURI (gate
// closed).
//
// This works around a data race in the pinned go-libvirt: ConnectToURI
// starts waitAndDisconnect and only then assigns l.disconnected, which that
// goroutine reads once the socket's reader has ended. Nothing orders the two
// when the transport dies from outside (a keepalive, an RST, a kill from a
// goroutine that did not see the connect finish), and the race detector
// says so. Worse, a transport that dies between the connect-open reply and
// that assignment leaves l.disconnected never closed. Holding the reader's
// end until the connect is over orders the two: go-libvirt's socket reader
// returns only after our connect saw ConnectToURI return (or gave up on it).
type gatedConn struct {
	net.Conn
	gate chan struct{}
}

func (g *gatedConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if err != nil {
		<-g.gate
	}
	return n, err
}

// connect dials the transport and opens libvirt on it, within the connect
// budget and parent. It must run in a goroutine counted by k.wg.
func (k *Link) connect(parent context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(parent, k.cfg.Budgets.Connect)
	defer cancel()
	t, err := k.dial(ctx)
	if err != nil {
		k.cfg.Observer.Dial(err)
		return nil, Classify(fmt.Errorf("connect %s: %w", k.name, err))
	}
	var transportDone <-chan struct{}
	transportErr := func() error { return errors.New("transport ended") }
	if sc, ok := t.(interface {
		Done() <-chan struct{}
		Err() error
	}); ok {
		transportDone, transportErr = sc.Done(), sc.Err
	}
	c := newConn(k.name, t, k.cfg.Observer)
	gate := make(chan struct{})
	c.l = libvirt.NewWithDialer(&onceDialer{t: &gatedConn{Conn: timeRPCs(t, k.cfg.Observer), gate: gate}})
	opened := make(chan error, 1)
	k.wg.Add(1) // we are counted, so this Add cannot race a Wait at zero
	go func() {
		defer k.wg.Done()
		opened <- c.l.ConnectToURI(libvirt.ConnectURI(k.cfg.URI))
	}()
	select {
	case err = <-opened:
	case <-transportDone:
		err = fmt.Errorf("transport ended while opening: %w", transportErr())
	case <-ctx.Done():
		err = fmt.Errorf("over the %s connect budget: %w", k.cfg.Budgets.Connect, context.Cause(ctx))
	}
	close(gate)
	if err != nil {
		// Killing the transport also ends a ConnectToURI still
		// waiting; it is counted and need not be waited for here.
		c.markDead(err)
		k.cfg.Observer.Dial(err)
		return nil, Classify(fmt.Errorf("connect %s: open %s: %w", k.name, k.cfg.URI, err))
	}
	c.live.Store(true)
	k.cfg.Observer.Dial(nil)
	// Read go-libvirt's channel here, after ConnectToURI has set it.
	disconnected := c.l.Disconnected()
	k.wg.Add(1)
	go func() { // the conn's watcher: ends when the conn is dead
		defer k.wg.Done()
		select {
		case <-c.dead:
		case <-transportDone:
			c.markDead(transportErr())
		case <-disconnected:
			c.markDead(errors.New("libvirt connection lost"))
		}
	}()
	return c, nil
}

// closeConn closes c politely (libvirt's connect-close, then the transport)
// within budget, and kills it if that overruns.
func (k *Link) closeConn(c *conn, budget time.Duration) error {
	if c.isDead() {
		return nil
	}
	c.closing.Store(true) // the watcher may see the end before we mark it
	done := make(chan error, 1)
	k.wg.Add(1) // callers are counted or hold the only reference after closed
	go func() {
		defer k.wg.Done()
		done <- c.l.Disconnect()
	}()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	var err error
	select {
	case err = <-done:
		if err != nil {
			err = fmt.Errorf("close %s: %w", k.name, err)
		}
	case <-timer.C:
		err = fleet.Transient(fmt.Errorf("close %s: no answer to connect-close within %s of the close budget", k.name, budget))
	}
	c.markDead(ErrLinkClosed)
	return err
}
