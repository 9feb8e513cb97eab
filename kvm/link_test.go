package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
)

// version is a cheap RPC.
func version(l *libvirt.Libvirt) error {
	v, err := l.ConnectGetLibVersion()
	if err != nil {
		return err
	}
	if v == 0 {
		return errors.New("lib version 0")
	}
	return nil
}

func TestLink_roundTrip(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	var v uint64
	start := time.Now()
	err := k.call(context.Background(), 5*time.Second, func(l *libvirt.Libvirt) error {
		var err error
		v, err = l.ConnectGetLibVersion()
		return err
	})
	if err != nil {
		t.Fatalf("ConnectGetLibVersion: %v", err)
	}
	t.Logf("libvirt %d.%d.%d, dial and first call in %s", v/1000000, v/1000%1000, v%1000, time.Since(start))
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	err = k.call(context.Background(), time.Second, version)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("call after Close = %v (class %q), want transient ErrLinkClosed", err, fleet.ClassOf(err))
	}
}

// A call whose link stalls (no RST, no FIN: bytes just stop) ends in a
// transient error within its budget, not after TCP retransmission, and the
// next call redials and succeeds.
func TestLink_stallMidCallIsTransientWithinBudget(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, p.Addr())})
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatal(err)
	}
	before := k.current(t)

	const budget = 2 * time.Second
	start := time.Now()
	err := k.call(context.Background(), budget, func(l *libvirt.Libvirt) error {
		p.Stall()
		return version(l)
	})
	took := time.Since(start)
	t.Logf("stalled call: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) {
		t.Fatalf("stalled call = %v (class %q), want transient ErrLinkDead", err, fleet.ClassOf(err))
	}
	if took < budget || took > 10*time.Second {
		t.Fatalf("stalled call took %s, want about its %s budget", took, budget)
	}
	if !before.isDead() {
		t.Fatal("the link that overran is not dead")
	}

	p.Pass()
	start = time.Now()
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the stall: %v", err)
	}
	t.Logf("redial and call after the stall: %s", time.Since(start))
	if k.current(t) == before {
		t.Fatal("the call after the stall did not redial")
	}
}

// A reset (RST) under a call fails it at once, not at its budget, and the
// next call redials.
func TestLink_resetFailsAtOnceAndRedials(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, p.Addr())})
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatal(err)
	}
	before := k.current(t)

	start := time.Now()
	err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		p.Reset()
		return version(l)
	})
	took := time.Since(start)
	t.Logf("reset call: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) {
		t.Fatalf("reset call = %v (class %q), want transient ErrLinkDead", err, fleet.ClassOf(err))
	}
	if took > 2*time.Second {
		t.Fatalf("reset call took %s, want it to fail at once", took)
	}
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the reset: %v", err)
	}
	if k.current(t) == before {
		t.Fatal("the call after the reset did not redial")
	}
}

// One call overrunning its budget fails every other call in flight on the
// link, at once and transient.
func TestLink_overrunFailsEveryCallInFlight(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	c := k.current(t)

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	inFlight := make(chan struct{})
	other := make(chan error, 1)
	go func() {
		other <- k.call(context.Background(), time.Minute, func(l *libvirt.Libvirt) error {
			close(inFlight)
			<-release
			return nil
		})
	}()
	<-inFlight

	err := k.call(context.Background(), 200*time.Millisecond, func(l *libvirt.Libvirt) error {
		<-release
		return nil
	})
	if fleet.ClassOf(err) != fleet.ClassTransient || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("overrunning call = %v, want transient over budget", err)
	}
	err = within(t, 2*time.Second, "the other call in flight", func() error { return <-other })
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) {
		t.Fatalf("other call in flight = %v, want transient ErrLinkDead", err)
	}
	if !c.isDead() {
		t.Fatal("link not dead after an overrun")
	}
}

// Issue 7, case 4: a caller whose ctx is cancelled stops waiting at once,
// transient, and abandons its call; it never kills the shared link that the
// host's other calls use. A call in flight beside it finishes on the same
// conn, and nothing redials.
func TestLink_cancelledCallSparesTheSharedLink(t *testing.T) {
	s := startSSHD(t)
	var dials atomic.Int32
	sshCfg := s.sshConfig(t, s.addr)
	k := newTestLink(t, LinkConfig{SSH: sshCfg, Dial: func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		return DialSSH(ctx, sshCfg)
	}})
	c := k.current(t)

	// B: a real call in flight, held between two RPCs.
	releaseB, inB, doneB := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		doneB <- k.call(context.Background(), time.Minute, func(l *libvirt.Libvirt) error {
			if err := version(l); err != nil {
				return err
			}
			close(inB)
			<-releaseB
			return version(l)
		})
	}()
	<-inB

	// A: in flight on the same conn when its caller cancels.
	releaseA, inA, doneA := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		doneA <- k.call(ctx, time.Minute, func(l *libvirt.Libvirt) error {
			close(inA)
			<-releaseA
			return version(l)
		})
	}()
	<-inA
	cancel()
	err := within(t, 2*time.Second, "the cancelled call", func() error { return <-doneA })
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call = %v (class %q), want transient context.Canceled", err, fleet.ClassOf(err))
	}
	if c.isDead() {
		t.Fatalf("a cancelled call killed the shared link: %v", c.deadErr())
	}

	close(releaseB)
	if err := within(t, 10*time.Second, "the call in flight beside it", func() error { return <-doneB }); err != nil {
		t.Fatalf("the call in flight beside a cancelled one failed: %v", err)
	}
	close(releaseA) // the abandoned call finishes on its own
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the cancelled one: %v", err)
	}
	if k.current(t) != c || c.isDead() || dials.Load() != 1 {
		t.Fatalf("after a cancelled call: %d dials, same conn %v; want 1 dial and the same live conn", dials.Load(), k.current(t) == c)
	}

	// A call whose ctx is done before it starts does not touch the link.
	err = k.call(ctx, time.Minute, version)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.Canceled) {
		t.Fatalf("call with a done ctx = %v, want transient context.Canceled", err)
	}
	if c.isDead() {
		t.Fatal("a call with a done ctx killed the link")
	}
}

// An abandoned call is still bound by its budget: when it overruns after
// its caller left, the link is killed as for any overrun, and the next call
// redials. Its goroutines end with it (goleak in TestMain, and Close waits
// for them within its budget: newTestLink's cleanup fails on a leftover).
func TestLink_abandonedCallStillBoundByItsBudget(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	c := k.current(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the link's Close (cleanups run last first)

	const budget = 500 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	in, done := make(chan struct{}), make(chan error, 1)
	start := time.Now()
	go func() {
		done <- k.call(ctx, budget, func(l *libvirt.Libvirt) error {
			close(in)
			<-release // stuck as a call on a wedged daemon would be
			return nil
		})
	}()
	<-in
	cancel()
	err := within(t, time.Second, "the cancelled call", func() error { return <-done })
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call = %v, want transient context.Canceled", err)
	}
	if c.isDead() {
		t.Fatalf("the cancel killed the link; only the budget may: %v", c.deadErr())
	}
	select {
	case <-c.dead:
	case <-time.After(10 * time.Second):
		t.Fatal("an abandoned call overran its budget and the link still lives")
	}
	took := time.Since(start)
	if took < budget {
		t.Fatalf("link killed after %s, before the %s budget", took, budget)
	}
	if err := c.deadErr(); !strings.Contains(err.Error(), "budget") {
		t.Fatalf("dead link's reason = %v, want the overrun", err)
	}
	t.Logf("abandoned call's overrun killed the link after %s", took)
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the overrun: %v", err)
	}
	if k.current(t) == c {
		t.Fatal("the call after the overrun did not redial")
	}
}

// libvirtd's own errors come back classified and leave the link alive.
func TestLink_libvirtErrorIsClassifiedAndLinkLives(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	c := k.current(t)
	err := k.call(context.Background(), 5*time.Second, func(l *libvirt.Libvirt) error {
		_, err := l.DomainLookupByName("proxyfleet-test-no-such-domain")
		if err != nil {
			return errors.New("look up domain proxyfleet-test-no-such-domain: " + err.Error())
		}
		return nil
	})
	// A message-only wrap loses the code: permanent (unknown).
	if fleet.ClassOf(err) != fleet.ClassPermanent {
		t.Fatalf("string-wrapped lookup error class = %q, want permanent", fleet.ClassOf(err))
	}
	err = k.call(context.Background(), 5*time.Second, func(l *libvirt.Libvirt) error {
		_, err := l.DomainLookupByName("proxyfleet-test-no-such-domain")
		if err != nil {
			return fmt.Errorf("look up domain %s: %w", "proxyfleet-test-no-such-domain", err)
		}
		return nil
	})
	if fleet.ClassOf(err) != fleet.ClassNotFound {
		t.Fatalf("lookup of a missing domain = %v (class %q), want not_found", err, fleet.ClassOf(err))
	}
	if !strings.HasPrefix(err.Error(), "look up domain proxyfleet-test-no-such-domain: ") {
		t.Fatalf("error %q lacks its context", err)
	}
	if c.isDead() || k.current(t) != c {
		t.Fatal("a libvirt error killed the link")
	}
}

// A kill that blocks (as closing a channel behind a stalled writer does,
// for as long as the kernel retransmits) must not hold up anyone but the
// killer: the link is seen dead at once by a call parked on it, a second
// markDead returns at once, and a new call redials without waiting.
func TestMarkDead_slowKillDoesNotBlockCallers(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	c := k.current(t)

	releaseKill := make(chan struct{})
	c.mu.Lock()
	realKill := c.kill
	c.kill = func() { <-releaseKill; realKill() }
	c.mu.Unlock()
	releaseFn := make(chan struct{})
	t.Cleanup(func() { close(releaseFn) })
	t.Cleanup(func() { close(releaseKill) }) // runs first: unblocks the kill

	// A caller genuinely parked inside a call on the link, not refused on
	// the way in.
	inFlight := make(chan struct{})
	parked := make(chan error, 1)
	go func() {
		parked <- k.call(context.Background(), time.Minute, func(l *libvirt.Libvirt) error {
			close(inFlight)
			<-releaseFn
			return nil
		})
	}()
	<-inFlight

	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		c.markDead(errors.New("test: slow kill"))
	}()

	select {
	case err := <-parked:
		if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) {
			t.Fatalf("parked call = %v, want transient ErrLinkDead", err)
		}
		if !strings.Contains(err.Error(), "test: slow kill") {
			t.Fatalf("parked call = %v, want the kill's reason", err)
		}
	case <-time.After(time.Second):
		t.Fatal("link not signalled dead while its kill is still running")
	}
	within(t, time.Second, "a second markDead during a slow kill", func() bool {
		return c.markDead(errors.New("second"))
	})
	err := within(t, 5*time.Second, "a new call during a slow kill", func() error {
		return k.call(context.Background(), 5*time.Second, version)
	})
	if err != nil {
		t.Fatalf("new call during a slow kill: %v", err)
	}
	select {
	case <-killerDone:
		t.Fatal("the kill returned before it was released: the test did not test anything")
	default:
	}
}

// An idle link whose network stalls is killed by the SSH keepalive, without
// any call noticing, and the next call redials.
func TestKeepalive_killsStalledIdleLink(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	cfg := s.sshConfig(t, p.Addr())
	cfg.KeepaliveInterval = 100 * time.Millisecond
	cfg.KeepaliveTimeout = 300 * time.Millisecond
	var dialed atomic.Pointer[SSHConn] // the link's SSH connection, for its count of replies
	k := newTestLink(t, LinkConfig{SSH: cfg, Dial: func(ctx context.Context) (net.Conn, error) {
		sc, err := DialSSH(ctx, cfg)
		if err != nil {
			return nil, err
		}
		dialed.Store(sc)
		return sc, nil
	}})
	c := k.current(t)
	sc := dialed.Load()
	// Keepalives get replies while the network is fine: the link
	// outlives five answered ones (half a second of them, longer than
	// their timeout).
	poll.Until(t, "five keepalives answered, or the link dead", 10*time.Second, func() bool {
		return sc.keepaliveReplies.Load() >= 5 || c.isDead()
	})
	if c.isDead() {
		t.Fatalf("healthy idle link died after %d keepalives answered: %v", sc.keepaliveReplies.Load(), c.deadErr())
	}

	p.Stall()
	start := time.Now()
	select {
	case <-c.dead:
	case <-time.After(5 * time.Second):
		t.Fatal("stalled idle link still alive after 5s")
	}
	t.Logf("keepalive killed the stalled link after %s: %v", time.Since(start), c.deadErr())
	mustBe(t, c.deadErr(), ErrKeepalive, "dead link's reason")

	p.Pass()
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after keepalive kill: %v", err)
	}
}

// After a failed dial the link does not dial again until its backoff allows;
// calls meanwhile fail at once, transient, with the dial's error. A
// successful dial resets the backoff.
func TestLink_redialBackoff(t *testing.T) {
	s := startSSHD(t)
	var dials atomic.Int32
	var refuse atomic.Bool
	refuse.Store(true)
	now := time.Unix(1_000_000, 0)
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	bo := &recordingBackOff{next: time.Hour}
	cfg := LinkConfig{
		SSH:        s.sshConfig(t, s.addr),
		NewBackOff: func() backoff.BackOff { return bo },
		Now:        func() time.Time { return *clock.Load() },
	}
	sshCfg := cfg.SSH
	closed := freeAddr(t) // nothing listens there
	cfg.Dial = func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		c := sshCfg
		if refuse.Load() {
			c.Address = closed
		}
		return DialSSH(ctx, c)
	}
	k := newTestLink(t, cfg)

	err := k.call(context.Background(), time.Second, version)
	if fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("call with the host refusing = %v (class %q), want transient", err, fleet.ClassOf(err))
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("dials = %d, want 1", n)
	}
	refuse.Store(false)
	err = k.call(context.Background(), time.Second, version)
	if fleet.ClassOf(err) != fleet.ClassTransient || !strings.Contains(err.Error(), "next dial in 1h0m0s") {
		t.Fatalf("call inside the backoff = %v, want transient 'next dial in 1h0m0s'", err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("dials inside the backoff = %d, want still 1", n)
	}
	later := now.Add(time.Hour)
	clock.Store(&later)
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call after the backoff: %v", err)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("dials after the backoff = %d, want 2", n)
	}
	if next, resets := bo.counts(); next != 1 || resets != 1 {
		t.Fatalf("backoff: %d intervals asked, %d resets; want 1 and 1 (one failed dial, one success)", next, resets)
	}
}

// recordingBackOff is a constant backoff that counts what was asked of it.
type recordingBackOff struct {
	next time.Duration

	mu     sync.Mutex
	asked  int
	resets int
}

func (b *recordingBackOff) NextBackOff() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked++
	return b.next
}

func (b *recordingBackOff) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resets++
}

func (b *recordingBackOff) counts() (asked, resets int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.asked, b.resets
}

// The link reaches the project's own test host the way a worker does: its
// sshd inside the test host's network namespace, with the key and
// known_hosts that `make testhost` wrote.
func TestLink_projectTesthost(t *testing.T) {
	requireHost(t)
	env := testhostEnv(t)
	k := newTestLink(t, LinkConfig{SSH: SSHConfig{
		Host:           "testhost",
		Address:        env["TESTHOST_SSH_ADDR"],
		User:           env["TESTHOST_SSH_USER"],
		KeyFile:        env["TESTHOST_SSH_KEY"],
		KnownHostsFile: env["TESTHOST_KNOWN_HOSTS"],
	}})
	start := time.Now()
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatalf("call on the project test host: %v", err)
	}
	t.Logf("dial and first call on %s: %s", env["TESTHOST_SSH_ADDR"], time.Since(start))
}

// A dial that hangs (the network stalls during the handshake) is bounded by
// the connect budget and fails transient.
func TestLink_connectBudgetBoundsADial(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	p.Stall()
	cfg := s.sshConfig(t, p.Addr())
	cfg.ConnectTimeout = 0 // from the budget
	k := newTestLink(t, LinkConfig{SSH: cfg, Budgets: Budgets{Connect: 500 * time.Millisecond}})
	start := time.Now()
	err := k.call(context.Background(), 10*time.Second, version)
	took := time.Since(start)
	t.Logf("dial through a stalled network: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("dial through a stalled network = %v (class %q), want transient", err, fleet.ClassOf(err))
	}
	if took > 3*time.Second {
		t.Fatalf("dial through a stalled network took %s, want about its 500ms budget", took)
	}
}

// Close of a link whose network stalled returns within its close budget,
// says so, and leaves no goroutine (goleak, TestMain).
func TestLink_closeBudgetOnAStalledLink(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	k, err := NewLink(LinkConfig{SSH: s.sshConfig(t, p.Addr()), Budgets: Budgets{Close: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.call(context.Background(), 5*time.Second, version); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	start := time.Now()
	err = within(t, 3*time.Second, "Close of a stalled link", k.Close)
	took := time.Since(start)
	t.Logf("Close of a stalled link: %v after %s", err, took)
	if err == nil || !strings.Contains(err.Error(), "budget") || strings.Contains(err.Error(), "still running") {
		t.Fatalf("Close of a stalled link = %v, want an over-budget polite close and every goroutine ended", err)
	}
	if took > time.Second {
		t.Fatalf("Close of a stalled link took %s, want its 500ms budget", took)
	}
}
