package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"

	"proxyfleet/config"
	"proxyfleet/messages"
	"proxyfleet/pool"
)

// The pool controller (`proxyfleet pools`, and in `serve`): package pool
// keeps the pools of PROXY_POOLS. It runs as the pools role of NATS (its
// own user in deploy/nats/accounts.conf).

// inboxPools is the pools role's inbox prefix.
const inboxPools = "_INBOX_pools"

// poolsConfig maps the config onto a pool controller's.
func poolsConfig(c *config.Config, id string, log *slog.Logger) pool.Config {
	subj := messages.NewSubjects(c.NATS.Prefix)
	pc := pool.Config{
		Subjects: subj, Topology: topologyOf(c), ID: id, DefaultImage: c.DefaultImage,
		Interval: c.Pools.Interval, LeaseTTL: c.Pools.LeaseTTL,
		BackoffInitial: c.Pools.BackoffInitial, BackoffMax: c.Pools.BackoffMax,
		CheckInterval: c.Worker.CheckInterval, Logger: log,
	}
	for _, h := range c.Hosts {
		pc.Hosts = append(pc.Hosts, pool.Host{Name: h.Name, MaxProxies: h.MaxProxies})
	}
	for _, im := range c.Images {
		pc.Images = append(pc.Images, im.Name)
	}
	return pc
}

// poolsSpec is the pool controller, its metrics on env.reg; its ready
// is pool.Controller.Ready.
func poolsSpec() *roleSpec {
	return &roleSpec{
		name: "pools", inbox: inboxPools,
		configUsage: "config file (YAML); required (the hosts and images pools may use)",
		idUsage:     "this controller's id in the lease (default hostname-pid)",
		httpUsage:   "address of /metrics, /healthz and /readyz (default from config pools.http; none if empty)",
		httpAddr:    func(c *config.Config) *string { return &c.Pools.HTTP },
		ops:         true, noArgs: true,
		build: func(_ context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
			pc := poolsConfig(c, env.id, env.log)
			pc.Registry, pc.Hook = env.reg, poolCrashHook(env.log)
			ctl, err := pool.New(nc, pc)
			if err != nil {
				return roleParts{}, err
			}
			return roleParts{runs: []component{{"pools", ctl.Run}}, ready: ctl.Ready}, nil
		},
		// The controller's reasons name it.
		serveReady: func(ready func() error) func() error { return ready },
	}
}
