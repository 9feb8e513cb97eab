package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/bans"
	"proxyfleet/deny"
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
	transport    *http.Transport // the slow path's
	track        *tracker
	pool         *pool         // the lean path's connections to proxies
	flights      *flights      // attempts in flight, watched (failover.go)
	tunnels      *tunnelSet    // open tunnels by proxy (failover.go)
	slow         *chanListener // where the lean path hands connections to the slow one
	draining     atomic.Bool   // Run is stopping: no connection is kept alive
	turns        turns         // egress-rotate's counters
	authThrottle *throttle     // failed credentials by source address
	unauth       *unauthGate   // connections not yet authenticated
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
	}
	if g.bans == nil {
		g.bans = newLocalBans(cfg.Now)
	}
	g.dialer = net.Dialer{KeepAliveConfig: keepalive}
	if cfg.UpstreamUser != "" {
		g.upstreamAuth = basicAuth(cfg.UpstreamUser, cfg.UpstreamPassword)
	}
	g.hard, g.hardCancel = context.WithCancel(context.Background())
	g.transport = &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) {
			u, _ := r.Context().Value(proxyURLKey{}).(*url.URL)
			if u == nil {
				return nil, errors.New("no proxy picked")
			}
			return u, nil
		},
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return g.dial(ctx, addr)
		},
		// The client's Accept-Encoding goes as it is, and the answer
		// comes back as the target sent it.
		DisableCompression:    true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   cfg.ConnectTimeout,
		ResponseHeaderTimeout: cfg.ResponseTimeout,
		ExpectContinueTimeout: time.Second,
	}
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

// proxyURLKey carries a plain request's proxy URL to the transport.
type proxyURLKey struct{}

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
	var lc net.ListenConfig
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

	// The lean path serves httpLn and hands what it does not take to
	// srv (the slow path) through g.slow.
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: g.cfg.HeaderTimeout,
		// net/http takes a head of up to MaxHeaderBytes plus 4 KiB (its
		// read-ahead): so a head of at most cfg.MaxHeaderBytes passes;
		// larger, it answers 431 and closes.
		MaxHeaderBytes: g.cfg.MaxHeaderBytes - 4096,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, s http.ConnState) {
			if pc, ok := c.(*prefixConn); ok && (s == http.StateClosed || s == http.StateHijacked) {
				pc.unauth.release()
			}
		},
		IdleTimeout: g.cfg.KeepAliveTimeout,
		ErrorLog:    slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		BaseContext: func(net.Listener) context.Context { return g.hard },
		// OPTIONS * is a server's; to the handler (which refuses it).
		DisableGeneralOptionsHandler: true,
	}
	// One request a connection: its head passed the lean parser; a next
	// one would be read by net/http's alone, which takes what the lean
	// one refuses (obs-fold, bare LF line ends).
	srv.SetKeepAlivesEnabled(false)
	errc := make(chan error, 3)
	var serving sync.WaitGroup
	stop := make(chan struct{})
	if httpLn != nil {
		g.slow = newChanListener(httpLn.Addr())
		serving.Go(func() {
			if err := srv.Serve(g.slow); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("gateway: serve HTTP (slow path): %w", err)
			}
		})
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
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		_ = srv.Shutdown(drain)
	}()
	select {
	case <-shut:
	case <-drain.Done():
	}
	select {
	case <-g.track.wait():
	case <-drain.Done():
	}
	if drain.Err() != nil {
		g.log.Warn("gateway: drain timed out, closing what is left", "timeout", g.cfg.DrainTimeout)
	}
	g.hardCancel()
	g.track.closeAll()
	_ = srv.Close()
	<-shut
	serving.Wait()
	g.background.Wait()
	<-g.track.wait()
	g.transport.CloseIdleConnections()
	g.log.Info("gateway stopped")
	return runErr
}
