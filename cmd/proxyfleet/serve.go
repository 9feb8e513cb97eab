package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/config"
	"proxyfleet/health"
	healthdef "proxyfleet/health/defaults"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// serve runs everything in one process: an embedded nats-server with
// JetStream unless --nats-url names a cluster, set-up and a repairer of the
// streams and buckets (with the embedded server, or --repair), a worker,
// the health consumer and a pool controller, each role on its own
// connection. Each is a
// component (see runAll): when one fails, the others stop and serve
// returns its error.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return serveWith(ctx, args, stdout, stderr, serveHooks{})
}

// serveHooks let a test reach into serve.
type serveHooks struct {
	// embedded, if set, is handed the embedded server once it is ready.
	embedded func(*server.Server)
}

func serveWith(ctx context.Context, args []string, stdout, stderr io.Writer, hooks serveHooks) error {
	fs, nf, lf := roleFlags("serve", stderr)
	cfgPath := fs.String("config", "", "config file (YAML); required")
	dataDir := fs.String("data-dir", "./data", "JetStream store of the embedded server")
	listen := fs.String("listen", "127.0.0.1:4222", "client address of the embedded server")
	httpAddr := fs.String("http", "", "health HTTP address (default from config, "+healthdef.HTTPAddr+")")
	repair := fs.Bool("repair", false, "run set-up at start and recreate deleted streams and buckets while serving (default: on with the embedded server; with --server it needs an admin credential)")
	id := fs.String("id", "", "the worker's id, stable and readable (default hostname-pid)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if err := checkID(*id); err != nil {
		return err
	}
	repairSet := false
	fs.Visit(func(f *flag.Flag) { repairSet = repairSet || f.Name == "repair" })
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	log = log.With("pid", os.Getpid())
	c, err := loadRoleConfig(*cfgPath)
	if err != nil {
		return err
	}
	if err := nf.resolve(c); err != nil {
		return err
	}
	if *httpAddr != "" {
		c.Health.HTTP = *httpAddr
	}
	// One registry; health's listener serves it, and its /readyz asks
	// the worker too.
	reg := newRegistry("serve")
	var comps []component
	if nf.url == "" {
		s, err := embedded(*listen, *dataDir, log)
		if err != nil {
			return err
		}
		// Shut down last: the other components drain through it.
		defer func() {
			s.Shutdown()
			s.WaitForShutdown()
		}()
		if hooks.embedded != nil {
			hooks.embedded(s)
		}
		comps = append(comps, watchEmbedded(s))
		nf.url = s.ClientURL()
		if !repairSet {
			*repair = true
		}
	}
	if *repair {
		alog := log.With("role", "setup")
		nc, err := nf.connect("proxyfleet-serve-setup", inboxAdmin, alog)
		if err != nil {
			return err
		}
		defer nc.Close()
		rep, err := setupRepairer(ctx, nc, c, alog, reg)
		if err != nil {
			return err
		}
		comps = append(comps, rep)
	}
	var workerReady, poolsReady func() error // set below, before anything runs
	gatewayReady := func() error { return nil }
	hlog := log.With("role", "health")
	hnc, err := nf.connect("proxyfleet-serve-health", inboxHealth, hlog)
	if err != nil {
		return err
	}
	defer hnc.Close()
	h, err := healthComponent(hnc, c, hlog, reg, func() error {
		if err := workerReady(); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		if err := poolsReady(); err != nil {
			return err
		}
		return gatewayReady()
	})
	if err != nil {
		return err
	}
	wlog := log.With("role", "worker")
	wnc, err := nf.connect("proxyfleet-serve-worker", inboxWorker, wlog)
	if err != nil {
		return err
	}
	defer wnc.Close()
	w, workerReady, err := workerComponent(wnc, c, *id, wlog, reg)
	if err != nil {
		return err
	}
	comps = append(comps, w, h)
	plog := log.With("role", "pools")
	pnc, err := nf.connect("proxyfleet-serve-pools", inboxPools, plog)
	if err != nil {
		return err
	}
	defer pnc.Close()
	p, poolsReady, err := poolsComponent(pnc, c, *id, plog, reg)
	if err != nil {
		return err
	}
	comps = append(comps, p)
	if gatewayEnabled(c) {
		glog := log.With("role", "gateway")
		gnc, err := nf.connect("proxyfleet-serve-gateway", inboxClient, glog)
		if err != nil {
			return err
		}
		defer gnc.Close()
		// serve's one listener is health's: no /stats there.
		g, ready, _, err := gatewayComponent(gnc, c, glog, reg)
		if err != nil {
			return err
		}
		gatewayReady = ready
		comps = append(comps, g)
	}
	if consoleEnabled(c) {
		if err := c.LoadConsoleSecrets(); err != nil {
			return err
		}
		klog := log.With("role", "console")
		knc, err := nf.connect("proxyfleet-serve-console", inboxClient, klog)
		if err != nil {
			return err
		}
		defer knc.Close()
		k, _, err := consoleComponent(knc, c, klog, reg)
		if err != nil {
			return err
		}
		comps = append(comps, k)
	}
	log.Info("proxyfleet serving", "nats", nf.url, "http", c.Health.HTTP, "hosts", c.HostNames(), "repair", *repair,
		"gateway", c.Gateway.Listen, "gateway_socks", c.Gateway.SocksListen, "console", c.Console.Listen)
	return runAll(ctx, log, comps...)
}

// healthComponent is a health process on nc: it waits for the stream and
// buckets it binds (set-up's to create: `proxyfleet setup`, or serve),
// then runs. Its listener serves reg on /metrics; readyCheck, if set, must
// pass too for /readyz.
func healthComponent(nc *nats.Conn, c *config.Config, log *slog.Logger, reg *prometheus.Registry, readyCheck func() error) (component, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return component{}, err
	}
	hc := healthConfig(c, log)
	hc.Registry, hc.ReadyCheck = reg, readyCheck
	h, err := health.New(js, hc)
	if err != nil {
		return component{}, err
	}
	return component{"health", func(ctx context.Context) error {
		await := topology.Awaiter{Interval: c.Worker.CheckInterval, Log: log}
		if err := await.AwaitAll(ctx, js, messages.StreamEvents,
			topology.BucketStream(messages.BucketRotation), topology.BucketStream(messages.BucketLeases)); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting
			}
			return err
		}
		return h.Run(ctx)
	}}, nil
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

// runHealth runs the health role alone.
func runHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, nf, lf := roleFlags("health", stderr)
	cfgPath := fs.String("config", "", "config file (YAML); optional")
	httpAddr := fs.String("http", "", "HTTP address (default from config, "+healthdef.HTTPAddr+")")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	log = log.With("role", "health", "pid", os.Getpid())
	roleGC(log, healthGCPercent, false)
	c := &config.Config{Hosts: []config.Host{{Name: "none", Driver: "sim", Sim: config.Sim{Dir: "/nonexistent"}}}}
	if *cfgPath != "" {
		if c, err = loadRoleConfig(*cfgPath); err != nil {
			return err
		}
	} else {
		c.SetDefaults()
	}
	if err := nf.resolve(c); err != nil {
		return err
	}
	nf.ensureURL()
	if *httpAddr != "" {
		c.Health.HTTP = *httpAddr
	}
	nc, err := nf.connect("proxyfleet-health", inboxHealth, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	h, err := healthComponent(nc, c, log, newRegistry("health"), nil)
	if err != nil {
		return err
	}
	return runAll(ctx, log, h)
}
