package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// LinkConfig configures the links to one host.
type LinkConfig struct {
	// SSH says how to reach the host. Its ConnectTimeout and
	// KeepaliveInterval, if zero, are Budgets.Connect and
	// Budgets.Keepalive.
	SSH SSHConfig
	// URI is the libvirt URI opened on the host's daemon; empty means
	// DefaultURI.
	URI string
	// Budgets are the time limits; zero fields take DefaultBudgets.
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
	// Observer hears the link's calls, dials, deaths and overruns; nil:
	// nothing hears them.
	Observer Observer
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
	cfg.Budgets = cfg.Budgets.WithDefaults()
	if cfg.SSH.ConnectTimeout <= 0 {
		cfg.SSH.ConnectTimeout = cfg.Budgets.Connect
	}
	if cfg.SSH.KeepaliveInterval == 0 {
		cfg.SSH.KeepaliveInterval = cfg.Budgets.Keepalive
	}
	cfg.SSH = cfg.SSH.withDefaults()
	if cfg.URI == "" {
		cfg.URI = DefaultURI
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
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
		k.cfg.Observer.Overrun()
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
		k.cfg.Observer.Overrun()
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
