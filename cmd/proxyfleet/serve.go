package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/config"
	"proxyfleet/health"
	healthdef "proxyfleet/health/defaults"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// serve runs everything in one process: an embedded nats-server with
// JetStream unless --nats-url names a cluster, set-up and a repairer of the
// streams and buckets (with the embedded server, or --repair), then the
// role specs (health, worker, pools, and the gateway and the console when
// the config asks for them), each built on its own connection into one
// lifecycle: when one part fails, the others stop and serve returns its
// error.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return serveWith(ctx, args, stdout, stderr, serveHooks{})
}

// serveHooks let a test reach into serve.
type serveHooks struct {
	// embedded, if set, is handed the embedded server once it is ready.
	embedded func(*server.Server)
}

func serveWith(ctx context.Context, args []string, stdout, stderr io.Writer, hooks serveHooks) error {
	var (
		dataDir, listen string
		repair          bool
		repairSet       bool
	)
	spec := &roleSpec{
		name: "serve", allRoles: true, configUsage: "config file (YAML); required", secrets: true,
		idUsage:   "the worker's id, stable and readable (default hostname-pid)",
		httpUsage: "health HTTP address (default from config, " + healthdef.HTTPAddr + ")",
		httpAddr:  func(c *config.Config) *string { return &c.Health.HTTP },
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&dataDir, "data-dir", "./data", "JetStream store of the embedded server")
			fs.StringVar(&listen, "listen", "127.0.0.1:4222", "client address of the embedded server")
			fs.BoolVar(&repair, "repair", false, "run set-up at start and recreate deleted streams and buckets while serving (default: on with the embedded server; with --server it needs an admin credential)")
		},
	}
	r, err := spec.start(args, stdout, stderr)
	if err != nil {
		return err
	}
	c, log, nf := r.c, r.log, r.nf
	r.fs.Visit(func(f *flag.Flag) { repairSet = repairSet || f.Name == "repair" })
	lc := &lifecycle{log: log}
	defer lc.close()
	// One registry; health's listener serves it, and its /readyz asks
	// the other roles too.
	reg := newRegistry("serve")
	if nf.url == "" {
		s, err := embedded(listen, dataDir, log)
		if err != nil {
			return err
		}
		// Closed last: the other roles drain through it.
		lc.onClose(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		if hooks.embedded != nil {
			hooks.embedded(s)
		}
		lc.add(watchEmbedded(s))
		nf.url = s.ClientURL()
		if !repairSet {
			repair = true
		}
	}
	if repair {
		alog := log.With("role", "setup")
		nc, err := lc.connect(nf, "proxyfleet-serve-setup", inboxAdmin, alog)
		if err != nil {
			return err
		}
		rep, err := setupRepairer(ctx, nc, c, alog, reg)
		if err != nil {
			return err
		}
		lc.add(rep)
	}
	// Set before anything runs; health's /readyz asks them in turn.
	var readies []func() error
	others := func() error {
		for _, ready := range readies {
			if err := ready(); err != nil {
				return err
			}
		}
		return nil
	}
	for _, rs := range []*roleSpec{healthSpec(), workerSpec(), poolsSpec(), gatewaySpec(), consoleSpec()} {
		if rs.enabled != nil && !rs.enabled(c) {
			continue
		}
		if rs.prepare != nil {
			if err := rs.prepare(c); err != nil {
				return err
			}
		}
		rlog := log.With("role", rs.name)
		nc, err := lc.connect(nf, "proxyfleet-serve-"+rs.name, rs.inbox, rlog)
		if err != nil {
			return err
		}
		// serve's one listener is health's: no /stats there.
		p, err := lc.build(ctx, rs, nc, c, roleEnv{id: r.id, log: rlog, reg: reg, stdout: stdout, stderr: stderr, ready: others})
		if err != nil {
			return err
		}
		if rs.serveReady != nil {
			readies = append(readies, rs.serveReady(p.ready))
		}
	}
	log.Info("proxyfleet serving", "nats", nf.url, "http", c.Health.HTTP, "hosts", c.HostNames(), "repair", repair,
		"gateway", c.Gateway.Listen, "gateway_socks", c.Gateway.SocksListen, "console", c.Console.Listen)
	return lc.run(ctx)
}

// healthSpec is the health process: it waits for the stream and buckets
// it binds (set-up's to create: `proxyfleet setup`, or serve), then
// runs, serving its own HTTP listener: reg on /metrics, and the rotation;
// env.ready, if set, must pass too for /readyz. Without --config it runs
// on the defaults.
func healthSpec() *roleSpec {
	return &roleSpec{
		name: "health", inbox: inboxHealth, gcPercent: healthGCPercent,
		configUsage: "config file (YAML); optional", secrets: true,
		defaults: func() *config.Config {
			c := &config.Config{Hosts: []config.Host{{Name: "none", Driver: "sim", Sim: config.Sim{Dir: "/nonexistent"}}}}
			c.SetDefaults()
			return c
		},
		httpUsage: "HTTP address (default from config, " + healthdef.HTTPAddr + ")",
		httpAddr:  func(c *config.Config) *string { return &c.Health.HTTP },
		build:     buildHealth,
	}
}

func buildHealth(_ context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return roleParts{}, err
	}
	hc := healthConfig(c, env.log)
	hc.Registry, hc.ReadyCheck = env.reg, env.ready
	h, err := health.New(js, hc)
	if err != nil {
		return roleParts{}, err
	}
	return roleParts{runs: []component{{"health", func(ctx context.Context) error {
		await := topology.Awaiter{Interval: c.Worker.CheckInterval, Log: env.log}
		if err := await.AwaitAll(ctx, js, messages.StreamEvents,
			topology.BucketStream(messages.BucketRotation), topology.BucketStream(messages.BucketLeases)); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting
			}
			return err
		}
		return h.Run(ctx)
	}}}}, nil
}

// healthConfig maps the config onto a health process's.
func healthConfig(c *config.Config, log *slog.Logger) health.Config {
	return health.Config{
		Subjects: messages.NewSubjects(c.NATS.Prefix),
		HTTPAddr: c.Health.HTTP,
		Logger:   log,
		Grace:    c.Health.Grace,

		Target:          c.Health.Target,
		Expect:          c.Health.Expect,
		ProbeListen:     c.Health.ProbeListen,
		TargetIPv6:      c.Health.TargetIPv6,
		ProbeListenIPv6: c.Health.ProbeListenIPv6,
		Interval:        c.Health.Interval,
		Timeout:         c.Health.Timeout,
		Rise:            c.Health.Rise,
		Fall:            c.Health.Fall,
		Concurrency:     c.Health.Concurrency,
		LeaseTTL:        c.Health.LeaseTTL,

		// The proxies' credential (read by LoadSecrets): probes carry
		// it, and check that a request without it is refused.
		ProxyUser:         c.Proxy.Auth.User,
		ProxyPassword:     c.Proxy.Auth.Password.Reveal(),
		OpenCheckInterval: c.Health.OpenCheckInterval,
		ReportInterval:    c.Health.ReportInterval,
		ReportRate:        c.Health.ReportRate,
		SnapshotInterval:  c.Health.SnapshotInterval,
		SnapshotMaxBytes:  c.Health.SnapshotMaxBytes,
		SnapshotRate:      c.Health.SnapshotRate,
	}
}
