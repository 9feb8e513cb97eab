package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/config"
	"proxyfleet/gateway"
	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// The gateway (`proxyfleet gateway`, or in `serve` when gateway.listen or
// gateway.socks_listen is set): package rotation follows the rotation, and
// package gateway serves on top of it. It runs as the client role of NATS
// (it reads the rotation and publishes reports).

// gatewayEnabled says whether the config asks for a gateway.
func gatewayEnabled(c *config.Config) bool {
	return c.Gateway.Listen != "" || c.Gateway.SocksListen != ""
}

// gatewaySpec follows the rotation and serves the gateway over it; its
// metrics go to env.reg. Its ready reports whether it serves: the
// rotation caught up and the listeners bound; its stats is /stats.
func gatewaySpec() *roleSpec {
	return &roleSpec{
		name: "gateway", inbox: inboxClient,
		configUsage: "config file (YAML); required", secrets: true,
		httpUsage: "address of /metrics, /healthz, /readyz and /stats (default from config gateway.http; none if empty)",
		httpAddr:  func(c *config.Config) *string { return &c.Gateway.HTTP },
		ops:       true, pprof: true,
		enabled:  gatewayEnabled,
		required: "gateway.listen (or gateway.socks_listen) is required for the gateway role",
		build:    buildGateway,
		// The gateway's reasons name it.
		serveReady: func(ready func() error) func() error { return ready },
	}
}

func buildGateway(_ context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
	log, reg := env.log, env.reg
	if err := c.LoadGatewaySecrets(); err != nil {
		return roleParts{}, err
	}
	rot, err := rotation.New(nc, rotation.Config{
		Subjects: messages.NewSubjects(c.NATS.Prefix),
		User:     c.Proxy.Auth.User, Password: c.Proxy.Auth.Password.Reveal(),
		Strategy: rotation.Strategy(c.Gateway.Strategy),
		Cooldown: c.Gateway.Cooldown,
		Logger:   log,
	})
	if err != nil {
		return roleParts{}, fmt.Errorf("gateway: %w", err)
	}
	if err := registerRotationMetrics(reg, rot); err != nil {
		return roleParts{}, err
	}
	denied, err := c.Gateway.DenyList()
	if err != nil {
		return roleParts{}, fmt.Errorf("gateway: %w", err)
	}
	rules, err := c.Gateway.CompiledRules()
	if err != nil {
		return roleParts{}, fmt.Errorf("gateway: %w", err)
	}
	gc := gatewayConfig(c)
	gc.Deny, gc.Rules, gc.Bans = &denied, rules, rot
	gc.Logger, gc.Registry = log, reg
	gw, err := gateway.New(rot, gc)
	if err != nil {
		return roleParts{}, fmt.Errorf("gateway: %w", err)
	}
	ready := func() error {
		select {
		case <-rot.Ready():
		default:
			return errors.New("gateway: following the rotation: not caught up yet")
		}
		select {
		case <-gw.Started():
			return nil
		default:
			return errors.New("gateway: not listening yet")
		}
	}
	// The follower and the gateway run side by side, the gateway
	// serving once the follower has caught up: a gateway that answered
	// before it had read the rotation would send 503s for proxies that
	// are there.
	follow := func(ctx context.Context) error {
		if err := rot.Run(ctx); err != nil {
			return fmt.Errorf("gateway: follow the rotation: %w", err)
		}
		return nil
	}
	serve := func(ctx context.Context) error {
		select {
		case <-rot.Ready():
		case <-ctx.Done():
			return nil
		}
		log.Info("gateway: the rotation is read", "proxies", rot.Len())
		return gw.Run(ctx)
	}
	return roleParts{
		runs:  []component{{"gateway", follow}, {"gateway", serve}},
		ready: ready, stats: gw.StatsHandler(),
	}, nil
}

// registerRotationMetrics exports what the gateway's follower of the
// rotation counts: its size and version, and the times it read the
// rotation whole again.
func registerRotationMetrics(reg prometheus.Registerer, rot *rotation.Rotation) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "proxyfleet_gateway_rotation_size", Help: "Proxies in the rotation as the gateway follows it."},
			func() float64 { return float64(rot.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "proxyfleet_gateway_rotation_version", Help: "Version of the rotation the gateway holds (health's proxyfleet_rotation_version when it is current)."},
			func() float64 { return float64(rot.Stats().Version) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "proxyfleet_gateway_rotation_restarts_total", Help: "Times the gateway's follower read the rotation whole again after the first: a gap in the feed, or a new publisher (a takeover of health's lease)."},
			func() float64 { return float64(rot.Stats().Restarts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "proxyfleet_gateway_report_errors_total", Help: "Reports of failing proxies the gateway could not publish."},
			func() float64 { return float64(rot.Stats().ReportErrors) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	return nil
}

// gatewayConfig is the file's gateway settings (and proxy.auth) as
// gateway.Config takes them; the deny list, rules, bans, logger and
// registry are the caller's to set.
func gatewayConfig(c *config.Config) gateway.Config {
	g := c.Gateway
	gc := gateway.Config{
		Listen: g.Listen, SocksListen: g.SocksListen,
		UpstreamUser: c.Proxy.Auth.User, UpstreamPassword: c.Proxy.Auth.Password.Reveal(),
		Retries: offOrSet(g.Retries), ConnectTimeout: g.ConnectTimeout, ResponseTimeout: g.ResponseTimeout,
		FirstByteTimeout: g.FirstByteTimeout, IdleTimeout: g.IdleTimeout,
		RetryAfter: g.RetryAfter, DrainTimeout: g.DrainTimeout,
		HandshakeTimeout: g.HandshakeTimeout, KeepAliveTimeout: g.KeepAliveTimeout,
		AuthFailures:   g.AuthFailures,
		MaxHeaderBytes: g.MaxHeaderBytes, MaxHeaderFields: g.MaxHeaderFields,
		HeaderTimeout: g.HeaderTimeout, MaxUnauthenticated: g.MaxUnauthenticated,
		BodyPeek: g.BodyPeek, RetryBodyBytes: offOrSet(g.RetryBodyBytes),
	}
	for _, u := range g.Users {
		gc.Users = append(gc.Users, gateway.User{Name: u.Name, Password: u.Password.Reveal(), MaxConns: u.MaxConns})
	}
	return gc
}

// offOrSet is a setting of the file whose 0 turns its feature off
// (gateway.retries, gateway.retry_body_bytes) as gateway.Config takes
// it: there 0 asks for the default and a negative value for none. nil
// (never, once the file is read): the default.
func offOrSet(v *int) int {
	switch {
	case v == nil:
		return 0
	case *v == 0:
		return -1
	}
	return *v
}
