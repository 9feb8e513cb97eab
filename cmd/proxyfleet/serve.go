package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/config"
	"proxyfleet/health"
	"proxyfleet/messages"
)

// serve runs everything in one process: an embedded nats-server with
// JetStream unless --nats-url names a cluster, a worker and the health
// consumer.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nf natsFlags
	nf.register(fs, "")
	cfgPath := fs.String("config", "", "config file (YAML)")
	dataDir := fs.String("data-dir", "./data", "JetStream store of the embedded server")
	listen := fs.String("listen", "127.0.0.1:4222", "client address of the embedded server")
	httpAddr := fs.String("http", "", "health HTTP address (default from config, 127.0.0.1:8080)")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	log := newLogger(stderr, level(*debug)).With("pid", os.Getpid())
	c, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	nf.merge(c)
	if *httpAddr != "" {
		c.Health.HTTP = *httpAddr
	}
	if nf.url == "" {
		s, err := embedded(*listen, *dataDir, log)
		if err != nil {
			return err
		}
		defer func() {
			s.Shutdown()
			s.WaitForShutdown()
		}()
		nf.url = s.ClientURL()
	}
	nc, err := nf.connect("proxyfleet-serve", log)
	if err != nil {
		return err
	}
	defer nc.Close()

	stopWorker, err := startWorker(ctx, nc, c, log.With("role", "worker"))
	if err != nil {
		return err
	}
	stopHealth, err := startHealth(ctx, nc, c, log.With("role", "health"))
	if err != nil {
		stopWorker()
		return err
	}
	log.Info("proxyfleet serving", "nats", nf.url, "http", c.Health.HTTP, "hosts", c.HostNames())
	<-ctx.Done()
	log.Info("stopping")
	stopWorker()
	stopHealth()
	return nil
}

func startHealth(ctx context.Context, nc *nats.Conn, c *config.Config, log *slog.Logger) (func(), error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// Create-or-bind the streams and buckets, so a health process may
	// start before any worker.
	subj := messages.NewSubjects(c.NATS.Prefix)
	topo := workerConfig(c, nil, log).Topology
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
	defer tcancel()
	if err := topo.EnsureStreams(tctx, js); err != nil {
		return nil, err
	}
	h, err := health.New(js, health.Config{
		Subjects: subj,
		HTTPAddr: c.Health.HTTP,
		Logger:   log,
		Grace:    c.Health.Grace,

		Target:      c.Health.Target,
		Expect:      c.Health.Expect,
		ProbeListen: c.Health.ProbeListen,
		Interval:    c.Health.Interval,
		Timeout:     c.Health.Timeout,
		Rise:        c.Health.Rise,
		Fall:        c.Health.Fall,
		Concurrency: c.Health.Concurrency,
		LeaseTTL:    c.Health.LeaseTTL,
	})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := h.Start(sctx); err != nil {
		return nil, fmt.Errorf("start health: %w", err)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.Stop(sctx)
	}, nil
}

// runHealth runs the health role alone.
func runHealth(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nf natsFlags
	nf.register(fs, "")
	cfgPath := fs.String("config", "", "config file (YAML); optional")
	httpAddr := fs.String("http", "", "HTTP address (default from config, 127.0.0.1:8080)")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	log := newLogger(stderr, level(*debug)).With("role", "health", "pid", os.Getpid())
	c := &config.Config{Hosts: []config.Host{{Name: "none", Driver: "sim", Sim: config.Sim{Dir: "/nonexistent"}}}}
	if *cfgPath != "" {
		var err error
		if c, err = config.Load(*cfgPath); err != nil {
			return err
		}
	} else {
		c.SetDefaults()
	}
	nf.merge(c)
	if nf.url == "" {
		nf.url = defaultNATSURL
	}
	if *httpAddr != "" {
		c.Health.HTTP = *httpAddr
	}
	nc, err := nf.connect("proxyfleet-health", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	stop, err := startHealth(ctx, nc, c, log)
	if err != nil {
		return err
	}
	<-ctx.Done()
	stop()
	return nil
}
