package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/config"
	"proxyfleet/topology"
)

// Inbox prefixes, one per role: a role may subscribe to its own replies
// only (deploy/nats/accounts.conf).
const (
	inboxAdmin  = "_INBOX_admin"
	inboxWorker = "_INBOX_worker"
	inboxHealth = "_INBOX_health"
	inboxClient = "_INBOX_client"
)

// topologyOf is the streams, buckets and consumers the config asks for.
func topologyOf(c *config.Config) topology.Topology {
	return workerConfig(c, nil, nil).Topology
}

// setup creates or updates every stream and bucket to the config, printing
// what it changed; with --repair it then keeps recreating what is deleted
// until stopped. It needs an admin credential.
func setup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, nf, lf := roleFlags("setup", stderr)
	cfgPath := fs.String("config", "", "config file (YAML), for the prefix, replicas, max ages and windows; optional")
	repair := fs.Bool("repair", false, "after set-up, keep checking every --interval and recreate any stream or bucket that was deleted, until stopped")
	interval := fs.Duration("interval", 0, "with --repair, time between checks (default: the config's nats.repair_interval, 5s)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up on set-up after this long")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs)
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	log = log.With("role", "setup", "pid", os.Getpid())
	c := &config.Config{}
	if *cfgPath != "" {
		if c, err = config.Load(*cfgPath); err != nil {
			return err
		}
	} else {
		c.SetDefaults()
	}
	if err := nf.resolve(c); err != nil {
		return err
	}
	nf.ensureURL()
	if *interval > 0 {
		c.NATS.RepairInterval = *interval
	}
	nc, err := nf.connect("proxyfleet-setup", inboxAdmin, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	rep := topology.NewRepairer(js, topologyOf(c), topology.RepairerConfig{Interval: c.NATS.RepairInterval, Logger: log})
	sctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	changes, err := rep.Setup(sctx)
	// Run once, set-up reports to its caller in text; with --repair it is
	// a daemon (proxyfleet-setup.service, the setup Deployment) whose
	// output is its log: JSON there, a line per change, like serve's.
	report := func(msg string) { fmt.Fprintln(stdout, msg) }
	if *repair {
		report = func(msg string) { log.Info("set-up: " + msg) }
	}
	for _, ch := range changes {
		report(ch.String())
	}
	if err != nil {
		var re *topology.RefusedError
		if errors.As(err, &re) {
			fmt.Fprintln(stderr, "a setting JetStream cannot change in place has to be changed by hand (or the stream recreated, losing its messages):")
		}
		return fmt.Errorf("set-up: %w", err)
	}
	if len(changes) == 0 {
		report("every stream and bucket is as configured")
	}
	if !*repair {
		return nil
	}
	log.Info("repairing: recreating any stream or bucket that is deleted", "interval", c.NATS.RepairInterval)
	return runAll(ctx, log, repairerComponent(rep, log))
}

// setupRepairer runs set-up on nc, logging what it changed, and returns
// the repairer that keeps it in place: what `serve` does when it has admin
// rights. Its repairs are counted on reg.
func setupRepairer(ctx context.Context, nc *nats.Conn, c *config.Config, log *slog.Logger, reg prometheus.Registerer) (component, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return component{}, err
	}
	rep := topology.NewRepairer(js, topologyOf(c), topology.RepairerConfig{Interval: c.NATS.RepairInterval, Logger: log})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	changes, err := rep.Setup(sctx)
	for _, ch := range changes {
		log.Info("set-up: " + ch.String())
	}
	if err != nil {
		return component{}, fmt.Errorf("set-up: %w", err)
	}
	if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "proxyfleet_topology_repairs_total",
		Help: "Streams and buckets the repairer found deleted and recreated.",
	}, func() float64 { return float64(rep.Repairs()) })); err != nil {
		return component{}, err
	}
	return repairerComponent(rep, log), nil
}

func repairerComponent(rep *topology.Repairer, log *slog.Logger) component {
	return component{"repairer", func(ctx context.Context) error {
		err := rep.Run(ctx)
		log.Info("repairer stopped", "repairs", rep.Repairs())
		return err
	}}
}
