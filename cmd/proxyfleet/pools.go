package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

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

// poolsComponent is a pool controller on nc, its metrics on reg; ready
// says whether it is ready.
func poolsComponent(nc *nats.Conn, c *config.Config, id string, log *slog.Logger, reg prometheus.Registerer) (component, func() error, error) {
	pc := poolsConfig(c, id, log)
	pc.Registry, pc.Hook = reg, poolCrashHook(log)
	ctl, err := pool.New(nc, pc)
	if err != nil {
		return component{}, nil, err
	}
	return component{"pools", ctl.Run}, ctl.Ready, nil
}

// runPools runs the pool controller alone.
func runPools(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, nf, lf := roleFlags("pools", stderr)
	cfgPath := fs.String("config", "", "config file (YAML); required (the hosts and images pools may use)")
	id := fs.String("id", "", "this controller's id in the lease (default hostname-pid)")
	httpAddr := fs.String("http", "", "address of /metrics, /healthz and /readyz (default from config pools.http; none if empty)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs)
	}
	if err := checkID(*id); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	log = log.With("role", "pools", "pid", os.Getpid())
	c, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if *httpAddr != "" {
		c.Pools.HTTP = *httpAddr
	}
	if err := nf.resolve(c); err != nil {
		return err
	}
	nf.ensureURL()
	nc, err := nf.connect("proxyfleet-pools", inboxPools, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry("pools")
	p, ready, err := poolsComponent(nc, c, *id, log, reg)
	if err != nil {
		return err
	}
	comps := []component{p}
	if c.Pools.HTTP != "" {
		ln, err := net.Listen("tcp", c.Pools.HTTP)
		if err != nil {
			return fmt.Errorf("--http: %w", err)
		}
		comps = append(comps, opsComponent(ln, opsHandler(reg, ready), log))
	}
	return runAll(ctx, log, comps...)
}
