package main

import (
	"context"
	"errors"
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
	"proxyfleet/worker"
)

// serve runs everything in one process: an embedded nats-server with
// JetStream unless --nats-url names a cluster, set-up and a repairer of the
// streams and buckets (with the embedded server, or --repair), a worker and
// the health consumer, each role on its own connection.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nf natsFlags
	nf.register(fs, "")
	cfgPath := fs.String("config", "", "config file (YAML)")
	dataDir := fs.String("data-dir", "./data", "JetStream store of the embedded server")
	listen := fs.String("listen", "127.0.0.1:4222", "client address of the embedded server")
	httpAddr := fs.String("http", "", "health HTTP address (default from config, 127.0.0.1:8080)")
	repair := fs.Bool("repair", false, "run set-up at start and recreate deleted streams and buckets while serving (default: on with the embedded server; with --nats-url it needs an admin credential)")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	repairSet := false
	fs.Visit(func(f *flag.Flag) { repairSet = repairSet || f.Name == "repair" })
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
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		stopRepairer, err := startRepairer(ctx, js, c, alog)
		if err != nil {
			return err
		}
		defer stopRepairer()
	}
	wlog := log.With("role", "worker")
	wnc, err := nf.connect("proxyfleet-serve-worker", inboxWorker, wlog)
	if err != nil {
		return err
	}
	defer wnc.Close()
	stopWorker, err := startWorker(ctx, wnc, c, wlog)
	if err != nil {
		return err
	}
	hlog := log.With("role", "health")
	hnc, err := nf.connect("proxyfleet-serve-health", inboxHealth, hlog)
	if err != nil {
		stopWorker()
		return err
	}
	defer hnc.Close()
	stopHealth, err := startHealth(ctx, hnc, c, hlog)
	if err != nil {
		stopWorker()
		return err
	}
	log.Info("proxyfleet serving", "nats", nf.url, "http", c.Health.HTTP, "hosts", c.HostNames(), "repair", *repair)
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
	// The streams and buckets are set-up's (`proxyfleet setup`, or serve)
	// to create: health waits for them, then binds them.
	if err := awaitStreams(ctx, js, c.Worker.CheckInterval, log, messages.StreamEvents,
		worker.BucketStream(messages.BucketRotation), worker.BucketStream(messages.BucketLeases)); err != nil {
		return nil, err
	}
	h, err := health.New(js, healthConfig(c, log))
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

// healthConfig maps the config onto a health process's.
func healthConfig(c *config.Config, log *slog.Logger) health.Config {
	return health.Config{
		Subjects: messages.NewSubjects(c.NATS.Prefix),
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
	}
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
	nc, err := nf.connect("proxyfleet-health", inboxHealth, log)
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

// awaitStreams waits until every named stream exists, saying at error level
// which is missing (again every 30s), looking every interval.
func awaitStreams(ctx context.Context, js jetstream.JetStream, interval time.Duration, log *slog.Logger, names ...string) error {
	for _, name := range names {
		var since, logged time.Time
		for {
			_, err := js.Stream(ctx, name)
			if err == nil {
				if !since.IsZero() {
					log.Info("stream "+name+" is there now", "waited", time.Since(since).Round(time.Millisecond))
				}
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for stream %s: %w", name, ctx.Err())
			}
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				if since.IsZero() {
					since = time.Now()
				}
				if time.Since(logged) >= 30*time.Second {
					log.Error("stream "+name+" is missing: waiting for set-up to create it (`proxyfleet setup`, or `serve`)",
						"waited", time.Since(since).Round(time.Millisecond))
					logged = time.Now()
				}
			} else {
				log.Warn("look up stream "+name, "err", err)
			}
			t := time.NewTimer(interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("waiting for stream %s: %w", name, ctx.Err())
			case <-t.C:
			}
		}
	}
	return nil
}
