package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/client"
)

// User is one user of the console. Admin users may act; the others only
// look.
type User struct {
	Name     string
	Password string
	Admin    bool
}

// Config is the console's: where it listens, its users, and what it
// reads the fleet through.
type Config struct {
	// Listen is the address (host:port) Run serves on.
	Listen string
	// Users may log in; at least one (the console is never open).
	Users []User
	// SessionTTL is how long a session lasts after its login (default
	// DefaultSessionTTL).
	SessionTTL time.Duration
	// MaxSessions bounds the sessions held at once (default
	// DefaultMaxSessions); a login beyond it ends the oldest.
	MaxSessions int
	// ViewRefresh is how often, at least, the proxies page's view is
	// read afresh for what the state events do not carry (health's
	// verdicts, labels, results; default DefaultViewRefresh).
	ViewRefresh time.Duration
	// Gateways are the gateways' ops listeners (http://host:port) whose
	// /metrics the traffic page reads; none: the page says so.
	Gateways []string
	// GatewayInterval is how often each gateway is read (default
	// DefaultGatewayInterval).
	GatewayInterval time.Duration
	Logger          *slog.Logger
	// Registry, if set, gets the console's metrics.
	Registry prometheus.Registerer
}

// Defaults of Config.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultMaxSessions = 1024
)

// Server is the console. New makes it; Run serves it until its context
// ends; Handler serves it on a listener of the caller's.
type Server struct {
	cl       *client.Client
	cfg      Config
	log      *slog.Logger
	users    map[string]User
	sessions *sessions
	throttle *throttle
	hub      *hub
	view     *proxyView
	chart    *rotationChart
	traffic  *traffic
	metrics  *metrics
	mux      http.Handler
	started  chan struct{}
	once     sync.Once
}

// New checks cfg and makes a console reading the fleet through cl.
func New(cl *client.Client, cfg Config) (*Server, error) {
	if cl == nil {
		return nil, errors.New("console: no client")
	}
	if len(cfg.Users) == 0 {
		return nil, errors.New("console: no users: the console is never open to anyone")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.ViewRefresh <= 0 {
		cfg.ViewRefresh = DefaultViewRefresh
	}
	if cfg.GatewayInterval <= 0 {
		cfg.GatewayInterval = DefaultGatewayInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{cl: cl, cfg: cfg, log: cfg.Logger, users: map[string]User{}, started: make(chan struct{})}
	for _, u := range cfg.Users {
		if u.Name == "" || u.Password == "" {
			return nil, fmt.Errorf("console: user %q: a name and a password are needed", u.Name)
		}
		if _, dup := s.users[u.Name]; dup {
			return nil, fmt.Errorf("console: user %q is named twice", u.Name)
		}
		s.users[u.Name] = u
	}
	s.sessions = newSessions(cfg.SessionTTL, cfg.MaxSessions, time.Now)
	s.throttle = newThrottle(time.Now)
	s.view = newProxyView(cl, s.log, cfg.ViewRefresh)
	s.hub = newHub(cl, s.log)
	s.hub.view = s.view
	m, err := newMetrics(cfg.Registry, s.sessions.count)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	if s.chart, err = newRotationChart(cl, s.log, time.Now); err != nil {
		return nil, err
	}
	if s.traffic, err = newTraffic(cfg.Gateways, cfg.GatewayInterval, s.log, time.Now, cfg.Registry); err != nil {
		return nil, err
	}
	s.mux = s.routes()
	return s, nil
}

// Handler serves the console. The live stream (/events) needs RunFeed
// running to carry anything; Run runs both.
func (s *Server) Handler() http.Handler { return s.mux }

// Started is closed once Run listens.
func (s *Server) Started() <-chan struct{} { return s.started }

// RunFeed follows the proxies' state events for the live stream, keeps
// the proxies page's view current, follows the rotation for its chart
// and reads the gateways' traffic until ctx ends; a watch that breaks is
// opened again after a pause.
func (s *Server) RunFeed(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	parts := []func(context.Context) error{s.view.run, s.chart.run, s.traffic.run}
	done := make(chan error, len(parts))
	for _, run := range parts {
		go func() { done <- run(ctx) }()
	}
	err := s.hub.run(ctx)
	cancel() // the hub ended (with ctx): so do the others
	for range parts {
		if perr := <-done; err == nil {
			err = perr
		}
	}
	return err
}

// Run listens on Config.Listen and serves the console, with its live
// feed, until ctx ends; then it closes the live streams and waits for
// the requests in flight (at most 5s).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on a listener of the caller's, which it closes.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	feedDone := make(chan error, 1)
	go func() { feedDone <- s.RunFeed(ctx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()
	s.once.Do(func() { close(s.started) })
	s.log.Info("console: listening", "addr", ln.Addr().String())
	var err error
	select {
	case <-ctx.Done():
	case err = <-serveDone:
		serveDone = nil
	case err = <-feedDone:
		feedDone = nil
	}
	cancel() // ends the live streams, whose requests' contexts derive from ctx
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		_ = srv.Close()
	}
	if serveDone != nil {
		if serr := <-serveDone; err == nil && !errors.Is(serr, http.ErrServerClosed) {
			err = serr
		}
	}
	if feedDone != nil {
		if ferr := <-feedDone; err == nil && ferr != nil && !errors.Is(ferr, context.Canceled) {
			err = ferr
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
