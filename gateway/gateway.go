package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/bans"
	"proxyfleet/deny"
	"proxyfleet/rotation"
)

// Gateway is the fleet's clients' one address: an HTTP forward proxy and
// a SOCKS5 server in front of the proxies a Picker chooses.
type Gateway struct {
	cfg          Config
	log          *slog.Logger
	picker       Picker
	users        users
	m            *metrics
	retries      int
	upstreamAuth string // the Proxy-Authorization value of the fleet's credential
	dialer       net.Dialer
	track        *tracker
	pool         *pool                 // kept-alive connections to proxies
	flights      *flights              // attempts in flight, watched (failover.go)
	tunnels      *tunnelSet            // open tunnels by proxy (failover.go)
	draining     atomic.Bool           // Run is stopping: no connection is kept alive
	turns        turns                 // egress-rotate's counters
	families     *rotation.FamilyCache // target names' address families
	authThrottle *throttle             // failed credentials by source address
	unauth       *unauthGate           // connections not yet authenticated
	// deny is Config.Deny, with the addresses Run listens on once it
	// does (set before anything is served: read without a lock).
	deny deny.List
	// bans are Config.Bans (or the gateway's own), rules Config.Rules.
	bans  Bans
	rules *bans.Rules
	// stats count requests by site (/stats).
	stats *siteStats
	// background are the requests that store bans; Run waits for them.
	background sync.WaitGroup

	// hard ends when the drain ran out: what is in flight stops.
	hard       context.Context
	hardCancel context.CancelFunc

	started  chan struct{}
	mu       sync.Mutex
	httpLn   net.Listener
	socksLn  net.Listener
	runCalls int
}

// New makes a gateway over picker. It refuses a config without users
// (never an open proxy); its errors never hold a password.
func New(picker Picker, cfg Config) (*Gateway, error) {
	if picker == nil {
		return nil, errors.New("gateway: no picker")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	unauth := &unauthGate{max: int64(cfg.MaxUnauthenticated)}
	m, err := newMetrics(reg, func() float64 { return float64(unauth.n.Load()) })
	if err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	g := &Gateway{
		cfg:          cfg,
		log:          cfg.Logger.With("component", "gateway"),
		picker:       picker,
		users:        newUsers(cfg.Users),
		m:            m,
		retries:      max(cfg.Retries, 0),
		track:        newTracker(),
		pool:         newPool(),
		flights:      newFlights(),
		tunnels:      newTunnelSet(),
		authThrottle: newThrottle(cfg.AuthFailures, authFailWindow, maxAuthSources),
		unauth:       unauth,
		started:      make(chan struct{}),
		deny:         *cfg.Deny,
		bans:         cfg.Bans,
		rules:        cfg.Rules,
		stats:        newSiteStats(cfg.Now),
		families:     rotation.NewFamilyCache(cfg.LookupNetIP, cfg.Now),
	}
	if g.bans == nil {
		g.bans = newLocalBans(cfg.Now)
	}
	g.dialer = net.Dialer{KeepAliveConfig: keepalive}
	if cfg.UpstreamUser != "" {
		g.upstreamAuth = basicAuth(cfg.UpstreamUser, cfg.UpstreamPassword)
	}
	g.hard, g.hardCancel = context.WithCancel(context.Background())
	return g, nil
}

// denyWithOwn is d with the addresses of the listeners, those that are
// not unspecified (a client must not reach the gateway's own host
// through the fleet); d itself when it is empty (nothing refused).
func denyWithOwn(d deny.List, lns ...net.Listener) deny.List {
	if d.Len() == 0 {
		return d
	}
	var own []netip.Addr
	for _, ln := range lns {
		if ln == nil {
			continue
		}
		ta, ok := ln.Addr().(*net.TCPAddr)
		if !ok {
			continue
		}
		if a, ok := netip.AddrFromSlice(ta.IP); ok && !a.Unmap().IsUnspecified() {
			own = append(own, a)
		}
	}
	return d.With(own...)
}

// Started is closed once Run listens.
func (g *Gateway) Started() <-chan struct{} { return g.started }

// Addr is the HTTP proxy's address once started ("" before or without).
func (g *Gateway) Addr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.httpLn == nil {
		return ""
	}
	return g.httpLn.Addr().String()
}

// SocksAddr is the SOCKS5 server's address once started ("" before or
// without).
func (g *Gateway) SocksAddr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.socksLn == nil {
		return ""
	}
	return g.socksLn.Addr().String()
}

// Run listens and serves until ctx ends; then it stops accepting, closes
// idle connections, lets requests and tunnels in flight end for up to
// DrainTimeout, closes what is left, and returns nil once every
// goroutine of its own has ended. It returns an error if it cannot
// listen, or the one that ended a listener.
func (g *Gateway) Run(ctx context.Context) error {
	g.mu.Lock()
	g.runCalls++
	if g.runCalls > 1 {
		g.mu.Unlock()
		return errors.New("gateway: Run called twice")
	}
	g.mu.Unlock()
	// The clients' connections carry no TCP keepalive: every wait on
	// one is bounded (HeaderTimeout, HandshakeTimeout, KeepAliveTimeout,
	// IdleTimeout).
	lc := net.ListenConfig{KeepAlive: -1}
	var httpLn, socksLn net.Listener
	var err error
	if g.cfg.Listen != "" {
		if httpLn, err = lc.Listen(ctx, "tcp", g.cfg.Listen); err != nil {
			return fmt.Errorf("gateway.listen: %w", err)
		}
	}
	if g.cfg.SocksListen != "" {
		if socksLn, err = lc.Listen(ctx, "tcp", g.cfg.SocksListen); err != nil {
			if httpLn != nil {
				httpLn.Close()
			}
			return fmt.Errorf("gateway.socks_listen: %w", err)
		}
	}
	g.mu.Lock()
	g.httpLn, g.socksLn = httpLn, socksLn
	g.mu.Unlock()
	g.deny = denyWithOwn(*g.cfg.Deny, httpLn, socksLn)

	errc := make(chan error, 3)
	var serving sync.WaitGroup
	stop := make(chan struct{})
	if httpLn != nil {
		serving.Go(func() {
			if err := g.serveHTTP(httpLn, stop); err != nil {
				errc <- fmt.Errorf("gateway: serve HTTP: %w", err)
			}
		})
		serving.Go(func() {
			t := time.NewTicker(idleConnTimeout / 3)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					g.pool.sweep(now)
				}
			}
		})
	}
	serving.Go(func() { g.watch(stop) })
	if socksLn != nil {
		serving.Go(func() {
			if err := g.serveSocks(socksLn, stop); err != nil {
				errc <- fmt.Errorf("gateway: serve SOCKS5: %w", err)
			}
		})
	}
	g.log.Info("gateway listening", "http", g.Addr(), "socks", g.SocksAddr(), "users", len(g.users))
	close(g.started)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}

	// Stop accepting, close idle, drain for DrainTimeout, then close.
	close(stop)
	for _, ln := range []net.Listener{httpLn, socksLn} {
		if ln != nil {
			ln.Close()
		}
	}
	g.draining.Store(true)
	g.track.closeIdle()
	g.pool.close()
	drain, cancel := context.WithTimeout(context.Background(), g.cfg.DrainTimeout)
	defer cancel()
	select {
	case <-g.track.wait():
	case <-drain.Done():
	}
	if drain.Err() != nil {
		g.log.Warn("gateway: drain timed out, closing what is left", "timeout", g.cfg.DrainTimeout)
	}
	g.hardCancel()
	g.track.closeAll()
	serving.Wait()
	g.background.Wait()
	<-g.track.wait()
	g.log.Info("gateway stopped")
	return runErr
}
