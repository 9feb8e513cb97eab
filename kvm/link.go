package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// Budgets are the time limits of one host's links. Zero fields take the
// defaults below.
type Budgets struct {
	// Call bounds one libvirt call on the shared link; default 30s.
	Call time.Duration
	// Connect bounds a dial: TCP, SSH handshake, socket forward and the
	// libvirt connect-open; default 15s.
	Connect time.Duration
	// TransferStall is how long a transfer may move no bytes before its
	// dedicated link is killed; default 30s.
	TransferStall time.Duration
	// Close bounds Close and the close of a dedicated link; default 5s.
	Close time.Duration
}

// DefaultBudgets are used for the zero fields of Budgets.
var DefaultBudgets = Budgets{
	Call:          30 * time.Second,
	Connect:       15 * time.Second,
	TransferStall: 30 * time.Second,
	Close:         5 * time.Second,
}

func (b Budgets) withDefaults() Budgets {
	if b.Call <= 0 {
		b.Call = DefaultBudgets.Call
	}
	if b.Connect <= 0 {
		b.Connect = DefaultBudgets.Connect
	}
	if b.TransferStall <= 0 {
		b.TransferStall = DefaultBudgets.TransferStall
	}
	if b.Close <= 0 {
		b.Close = DefaultBudgets.Close
	}
	return b
}

// LinkConfig configures the links to one host.
type LinkConfig struct {
	// SSH says how to reach the host. Its ConnectTimeout, if zero, is
	// Budgets.Connect.
	SSH SSHConfig
	// URI is the libvirt URI opened on the host's daemon; empty means
	// qemu:///system.
	URI string
	// Budgets are the time limits.
	Budgets Budgets
	// NewBackOff makes the redial policy: after a failed dial the link
	// refuses to dial again (failing calls at once, transient, or
	// permanent if the dial's error was) until the policy's next interval
	// has passed; a successful dial resets it. nil
	// means exponential from 500ms to 30s with jitter, never giving up.
	// backoff.Stop from the policy is read as its longest wait, 30s.
	NewBackOff func() backoff.BackOff
	// Now is the clock the redial policy is measured on; nil is time.Now.
	Now func() time.Time
	// Dial opens the transport to the host's libvirt socket; nil means
	// DialSSH with SSH. It must return once ctx is done.
	Dial func(ctx context.Context) (net.Conn, error)
}

// maxRedialWait is the wait used when the policy says backoff.Stop.
const maxRedialWait = 30 * time.Second

// ErrLinkDead is matched by errors.Is on every error from a call that failed
// because its link died (killed over a budget, dropped by the network, a
// failed keepalive, closed) or a transfer whose dedicated link was cut
// (stalled, cancelled). Such errors are transient.
var ErrLinkDead = errors.New("libvirt link dead")

// ErrLinkClosed is the reason given when the Link itself was closed.
var ErrLinkClosed = errors.New("link closed")

// deadError says which host's link died and why.
type deadError struct {
	host   string
	reason error
}

func (e *deadError) Error() string {
	return fmt.Sprintf("libvirt link to %s dead: %v", e.host, e.reason)
}

func (e *deadError) Unwrap() []error { return []error{ErrLinkDead, e.reason} }

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
}

func newConn(host string, t net.Conn) *conn {
	return &conn{
		host: host,
		dead: make(chan struct{}),
		kill: func() { _ = t.Close() },
	}
}

// markDead declares the conn dead for reason and kills its transport.
//
// The order is the fix for review finding H1 and must stay as it is:
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

// dialing is a dial in progress; done is closed when err is set.
type dialing struct {
	done chan struct{}
	err  error
}

// Link is the shared connection to one host's libvirtd, for calls. It dials
// on first use, redials a dead connection on the next use (no more often
// than its backoff allows), runs each call under a budget, and opens
// dedicated connections for transfers. Its methods are safe for concurrent
// use.
type Link struct {
	cfg  LinkConfig
	name string
	dial func(ctx context.Context) (net.Conn, error)
	now  func() time.Time

	ctx    context.Context // cancelled by Close: aborts dials
	cancel context.CancelFunc

	mu        sync.Mutex
	cur       *conn
	dialer    *dialing // the dial in progress, or nil
	bo        backoff.BackOff
	retryAt   time.Time
	lastErr   error
	dedicated map[*conn]struct{} // open transfer links
	closed    bool

	// wg counts every goroutine the link starts: calls, dials, watchers,
	// transfers, closes. Add happens under mu while !closed, from a
	// goroutine already counted, or in Close before its Wait.
	wg sync.WaitGroup
}

// NewLink checks cfg and returns a link that dials on first use.
func NewLink(cfg LinkConfig) (*Link, error) {
	cfg.Budgets = cfg.Budgets.withDefaults()
	if cfg.SSH.ConnectTimeout <= 0 {
		cfg.SSH.ConnectTimeout = cfg.Budgets.Connect
	}
	cfg.SSH = cfg.SSH.withDefaults()
	if cfg.URI == "" {
		cfg.URI = string(libvirt.QEMUSystem)
	}
	if cfg.Dial == nil {
		var missing []string
		for _, f := range []struct{ name, v string }{
			{"address", cfg.SSH.Address}, {"user", cfg.SSH.User},
			{"key_file", cfg.SSH.KeyFile}, {"known_hosts", cfg.SSH.KnownHostsFile},
		} {
			if f.v == "" {
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 {
			return nil, fleet.Permanent(fmt.Errorf("host %s: ssh config lacks %v", cfg.SSH.name(), missing))
		}
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = func() backoff.BackOff {
			b := backoff.NewExponentialBackOff()
			b.InitialInterval = 500 * time.Millisecond
			b.MaxInterval = maxRedialWait
			b.MaxElapsedTime = 0
			return b
		}
	}
	k := &Link{
		cfg:       cfg,
		name:      cfg.SSH.name(),
		dial:      cfg.Dial,
		now:       cfg.Now,
		bo:        cfg.NewBackOff(),
		dedicated: map[*conn]struct{}{},
	}
	if k.dial == nil {
		ssh := cfg.SSH
		k.dial = func(ctx context.Context) (net.Conn, error) { return DialSSH(ctx, ssh) }
	}
	if k.now == nil {
		k.now = time.Now
	}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	return k, nil
}

// spawn runs f in a goroutine counted by the link, unless the link is
// closed.
func (k *Link) spawn(f func()) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		f()
	}()
	return true
}

func (k *Link) closedErr() error {
	return fleet.Transient(&deadError{host: k.name, reason: ErrLinkClosed})
}

// call runs fn on the shared link under budget (0 means Budgets.Call).
//
// go-libvirt calls take no context, so fn runs in a goroutine of its own
// while call waits for it, the budget, ctx and the link's death.
//
// A budget overrun kills the link: fn's call can be stopped no other way,
// and a call that overran is a link that cannot be trusted. Every other
// call in flight on the link then fails transient too, and the next call
// redials.
//
// A done ctx does not: the link is shared by every call on the host, and
// one caller giving up (an observation pass over its interval, a ready
// timeout) says nothing about the link. The caller stops waiting and gets a
// transient error wrapping ctx.Err(); its call is abandoned, not stopped: fn
// keeps running in its goroutine, still counted by the link and still under
// its budget, which a watcher goroutine (also counted) keeps enforcing, so an
// abandoned call that overruns kills the link as any other would. What fn
// writes after its caller left is nobody's: a caller must not read what fn
// captured once call returned an error.
//
// The error is classified (see Classify); fn should wrap its errors with
// short context ("define domain p1: %w").
func (k *Link) call(ctx context.Context, budget time.Duration, fn func(l *libvirt.Libvirt) error) error {
	if budget <= 0 {
		budget = k.cfg.Budgets.Call
	}
	if err := ctx.Err(); err != nil {
		return fleet.Transient(fmt.Errorf("libvirt %s: %w", k.name, err))
	}
	c, err := k.get(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	if !k.spawn(func() { done <- fn(c.l) }) {
		return k.closedErr()
	}
	timer := time.NewTimer(budget)
	select {
	case err := <-done:
		timer.Stop()
		return k.result(c, err)
	case <-c.dead:
		timer.Stop()
		return k.deadResult(c, done)
	case <-timer.C:
		c.markDead(overrun(budget))
		return c.deadErr()
	case <-ctx.Done():
	}
	// Abandoned: the budget still holds, watched by a goroutine of the
	// link's. If the link is closing, spawn refuses, and Close kills the
	// conn, which ends fn.
	if !k.spawn(func() { k.watchAbandoned(c, done, timer, budget) }) {
		timer.Stop()
	}
	return fleet.Transient(fmt.Errorf("libvirt %s: call abandoned by its caller: %w", k.name, ctx.Err()))
}

// watchAbandoned waits for an abandoned call to end, and kills the link if
// it overruns its budget, as call would have. A transport failure it
// returns marks the conn dead (result), so the next call redials.
func (k *Link) watchAbandoned(c *conn, done <-chan error, timer *time.Timer, budget time.Duration) {
	defer timer.Stop()
	select {
	case err := <-done:
		_ = k.result(c, err)
	case <-c.dead:
	case <-timer.C:
		c.markDead(overrun(budget))
	}
}

func overrun(budget time.Duration) error {
	return fmt.Errorf("call over its %s budget", budget)
}

// deadResult is what a caller gets when the conn died while its call was in
// flight: the call's own result if it finished meanwhile, else the conn's
// death.
func (k *Link) deadResult(c *conn, done <-chan error) error {
	select {
	case err := <-done: // it finished as the link died
		return k.result(c, err)
	default:
	}
	return c.deadErr()
}

// result classifies fn's error; a transport failure marks the conn dead so
// the next call redials.
func (k *Link) result(c *conn, err error) error {
	if err == nil {
		return nil
	}
	if isTransport(err) {
		if c.markDead(err) {
			return c.deadErr()
		}
		// Someone else killed the link first: say why, and what this
		// call saw.
		return fleet.Transient(fmt.Errorf("%w (%w)", c.deadErr(), err))
	}
	return Classify(err)
}

// get returns the live shared conn, dialing one if there is none. Concurrent
// callers share one dial. After a failed dial, callers fail at once until
// the backoff allows the next dial.
func (k *Link) get(ctx context.Context) (*conn, error) {
	for {
		k.mu.Lock()
		if k.closed {
			k.mu.Unlock()
			return nil, k.closedErr()
		}
		if c := k.cur; c != nil {
			if !c.isDead() {
				k.mu.Unlock()
				return c, nil
			}
			k.cur = nil
		}
		d := k.dialer
		if d == nil {
			if wait := k.retryAt.Sub(k.now()); wait > 0 {
				err := fmt.Errorf("libvirt %s: link down, next dial in %s: %w",
					k.name, wait.Round(time.Millisecond), k.lastErr)
				k.mu.Unlock()
				if fleet.ClassOf(err) == fleet.ClassPermanent {
					// The last dial was refused for good (a host key
					// that does not match, a login refused): a call
					// in the window gets that answer, not a retry.
					return nil, err
				}
				return nil, fleet.Transient(err)
			}
			d = &dialing{done: make(chan struct{})}
			k.dialer = d
			k.wg.Add(1)
			go k.redial(d)
		}
		k.mu.Unlock()
		select {
		case <-d.done:
			if d.err != nil {
				return nil, d.err
			}
		case <-ctx.Done():
			return nil, fleet.Transient(fmt.Errorf("libvirt %s: waiting for a dial: %w", k.name, ctx.Err()))
		}
	}
}

// redial dials the shared conn. It runs in its own goroutine, bounded by
// the connect budget, so a caller giving up does not abort a dial that
// others wait for.
func (k *Link) redial(d *dialing) {
	defer k.wg.Done()
	c, err := k.connect(k.ctx)
	k.mu.Lock()
	k.dialer = nil
	closed := k.closed
	switch {
	case err != nil:
		k.lastErr = err
		next := k.bo.NextBackOff()
		if next == backoff.Stop {
			next = maxRedialWait
		}
		k.retryAt = k.now().Add(next)
	case closed:
		err = k.closedErr()
	default:
		k.cur = c
		k.bo.Reset()
		k.retryAt = time.Time{}
		k.lastErr = nil
	}
	d.err = err
	k.mu.Unlock()
	if c != nil && closed {
		c.markDead(ErrLinkClosed)
	}
	close(d.done)
}

// connect dials the transport and opens libvirt on it, within the connect
// budget and parent. It must run in a goroutine counted by k.wg.
func (k *Link) connect(parent context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(parent, k.cfg.Budgets.Connect)
	defer cancel()
	t, err := k.dial(ctx)
	if err != nil {
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
	c := newConn(k.name, t)
	gate := make(chan struct{})
	c.l = libvirt.NewWithDialer(&onceDialer{t: &gatedConn{Conn: t, gate: gate}})
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
		return nil, Classify(fmt.Errorf("connect %s: open %s: %w", k.name, k.cfg.URI, err))
	}
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

// Close closes the shared link and every dedicated one, and waits for the
// link's goroutines, all within Budgets.Close. Calls in flight fail
// transient. Close is idempotent.
func (k *Link) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	c := k.cur
	k.cur = nil
	dedicated := make([]*conn, 0, len(k.dedicated))
	for d := range k.dedicated {
		dedicated = append(dedicated, d)
	}
	k.mu.Unlock()
	k.cancel()

	budget := k.cfg.Budgets.Close
	deadline := time.Now().Add(budget)
	var errs []error
	for _, d := range dedicated {
		d.markDead(ErrLinkClosed)
	}
	if c != nil {
		// The polite close gets three quarters of the budget; if it
		// overruns, the kill leaves the rest for the link's goroutines
		// to end, which a kill makes them do at once.
		errs = append(errs, k.closeConn(c, budget*3/4))
	}
	waited := make(chan struct{})
	go func() { // ends with the last of the link's goroutines
		k.wg.Wait()
		close(waited)
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-waited:
	case <-timer.C:
		errs = append(errs, fleet.Transient(fmt.Errorf("close %s: goroutines still running after %s", k.name, budget)))
	}
	return errors.Join(errs...)
}

// transfer runs fn on a dedicated link of its own, never the shared one,
// with src wrapped in a no-progress watchdog: if no bytes are read from src
// for Budgets.TransferStall, the dedicated link is killed (which unblocks a
// stalled network write) and src is closed if it is an io.Closer (which
// unblocks a stalled source), and transfer returns a transient error. A
// slow transfer never costs the shared link, and a stalled one is cut
// within the stall window. The dedicated link is closed before transfer
// returns.
//
// A source that can block forever must be an io.Closer whose Close
// unblocks its Read (an HTTP body is), or go-libvirt's stream sender stays
// parked in Read until it returns.
func (k *Link) transfer(ctx context.Context, src io.Reader, fn func(l *libvirt.Libvirt, r io.Reader) error) error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return k.closedErr()
	}
	k.wg.Add(1)
	k.mu.Unlock()
	defer k.wg.Done()

	if err := ctx.Err(); err != nil {
		return fleet.Transient(fmt.Errorf("transfer on %s: %w", k.name, err))
	}
	// The dedicated link's dial is this caller's alone: it ends with the
	// caller's ctx as well as with the link.
	dialCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(k.ctx, cancel)
	c, err := k.connect(dialCtx)
	stop()
	cancel()
	if err != nil {
		return fmt.Errorf("transfer link: %w", err)
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		c.markDead(ErrLinkClosed)
		return k.closedErr()
	}
	k.dedicated[c] = struct{}{}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.dedicated, c)
		k.mu.Unlock()
	}()

	w := &watchReader{r: src}
	done := make(chan error, 1)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		done <- fn(c.l, w)
	}()

	stall := k.cfg.Budgets.TransferStall
	tick := time.NewTicker(max(stall/10, time.Millisecond))
	defer tick.Stop()
	last, lastMove := w.n.Load(), time.Now()
	for {
		select {
		case err := <-done:
			if err != nil {
				first := c.markDead(err) // the stream's state is unknown: never reuse it
				if isTransport(err) {
					if first {
						return fmt.Errorf("transfer: %w", c.deadErr())
					}
					return fleet.Transient(fmt.Errorf("transfer: %w (%w)", c.deadErr(), err))
				}
				return Classify(fmt.Errorf("transfer: %w", err))
			}
			// The upload is complete (libvirtd acknowledged the
			// stream's end); a failing polite close of the dedicated
			// link cannot undo that, and closeConn kills it anyway.
			_ = k.closeConn(c, k.cfg.Budgets.Close)
			return nil
		case <-c.dead:
			w.stop(src)
			select {
			case err := <-done:
				if err == nil {
					return nil // it finished as the link died
				}
			default:
			}
			return fmt.Errorf("transfer: %w", c.deadErr())
		case <-ctx.Done():
			c.markDead(fmt.Errorf("transfer abandoned: %w", context.Cause(ctx)))
			w.stop(src)
			return fleet.Transient(fmt.Errorf("transfer on %s: %w", k.name, ctx.Err()))
		case <-tick.C:
			if n := w.n.Load(); n != last {
				last, lastMove = n, time.Now()
				continue
			}
			if time.Since(lastMove) >= stall {
				c.markDead(fmt.Errorf("transfer stalled: no progress for %s after %d bytes", stall, last))
				w.stop(src)
				return fmt.Errorf("transfer: %w", c.deadErr())
			}
		}
	}
}

// errTransferStopped is what the watched reader returns once the watchdog
// has cut its transfer.
var errTransferStopped = errors.New("transfer stopped")

// watchReader counts the bytes read through it for the watchdog.
type watchReader struct {
	r       io.Reader
	n       atomic.Int64
	stopped atomic.Bool
	once    sync.Once
}

func (w *watchReader) Read(p []byte) (int, error) {
	if w.stopped.Load() {
		return 0, errTransferStopped
	}
	n, err := w.r.Read(p)
	w.n.Add(int64(n))
	if w.stopped.Load() {
		return 0, errTransferStopped
	}
	return n, err
}

// stop makes later reads fail and closes src if it can be closed, which is
// how a Read blocked in a stalled source is released.
func (w *watchReader) stop(src io.Reader) {
	w.stopped.Store(true)
	w.once.Do(func() {
		if cl, ok := src.(io.Closer); ok {
			_ = cl.Close()
		}
	})
}
