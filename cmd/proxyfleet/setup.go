package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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

// setupSpec creates or updates every stream and bucket to the config,
// printing what it changed; with --repair it then keeps recreating what
// is deleted until stopped. It needs an admin credential.
func setupSpec() *roleSpec {
	var (
		repair            bool
		interval, timeout time.Duration
	)
	return &roleSpec{
		name: "setup", inbox: inboxAdmin,
		configUsage: "config file (YAML), for the prefix, replicas, max ages and windows; optional",
		defaults: func() *config.Config {
			c := &config.Config{}
			c.SetDefaults()
			return c
		},
		noArgs: true,
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&repair, "repair", false, "after set-up, keep checking every --interval and recreate any stream or bucket that was deleted, until stopped")
			fs.DurationVar(&interval, "interval", 0, "with --repair, time between checks (default: the config's nats.repair_interval, 5s)")
			fs.DurationVar(&timeout, "timeout", setupTimeout, "give up on set-up after this long")
		},
		build: func(ctx context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
			if interval > 0 {
				c.NATS.RepairInterval = interval
			}
			return buildSetup(ctx, nc, c, env, repair, timeout)
		},
	}
}

// buildSetup runs set-up; with repair, the repairer is the role's run,
// and without, the role is done.
func buildSetup(ctx context.Context, nc *nats.Conn, c *config.Config, env roleEnv, repair bool, timeout time.Duration) (roleParts, error) {
	// Run once, set-up reports to its caller in text; with --repair it is
	// a daemon (proxyfleet-setup.service, the setup Deployment) whose
	// output is its log: JSON there, a line per change, like serve's.
	report := func(msg string) { fmt.Fprintln(env.stdout, msg) }
	if repair {
		report = func(msg string) { env.log.Info("set-up: " + msg) }
	}
	rep, changed, err := setUp(ctx, nc, c, env.log, timeout, report)
	if err != nil {
		var re *topology.RefusedError
		if errors.As(err, &re) {
			fmt.Fprintln(env.stderr, "a setting JetStream cannot change in place has to be changed by hand (or the stream recreated, losing its messages):")
		}
		return roleParts{}, err
	}
	if !changed {
		report("every stream and bucket is as configured")
	}
	if !repair {
		return roleParts{}, nil
	}
	env.log.Info("repairing: recreating any stream or bucket that is deleted", "interval", c.NATS.RepairInterval)
	run, err := repairerComponent(rep, env.log, env.reg)
	if err != nil {
		return roleParts{}, err
	}
	return roleParts{runs: []component{run}}, nil
}

// setupRepairer runs set-up on nc, logging what it changed, and returns
// the repairer that keeps it in place: what `serve` does when it has admin
// rights. Its repairs are counted on reg.
func setupRepairer(ctx context.Context, nc *nats.Conn, c *config.Config, log *slog.Logger, reg prometheus.Registerer) (component, error) {
	rep, _, err := setUp(ctx, nc, c, log, setupTimeout, func(msg string) { log.Info("set-up: " + msg) })
	if err != nil {
		return component{}, err
	}
	return repairerComponent(rep, log, reg)
}

// setupTimeout bounds `serve`'s set-up, as --timeout's default does the
// setup role's.
const setupTimeout = 30 * time.Second

// setUp makes every stream and bucket of c as configured within timeout,
// passing report each change it made, and returns the repairer that keeps
// them in place and whether anything changed.
func setUp(ctx context.Context, nc *nats.Conn, c *config.Config, log *slog.Logger, timeout time.Duration, report func(string)) (*topology.Repairer, bool, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, false, err
	}
	rep := topology.NewRepairer(js, topologyOf(c), topology.RepairerConfig{Interval: c.NATS.RepairInterval, Logger: log})
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	changes, err := rep.Setup(sctx)
	for _, ch := range changes {
		report(ch.String())
	}
	if err != nil {
		return nil, false, fmt.Errorf("set-up: %w", err)
	}
	return rep, len(changes) > 0, nil
}

// repairerComponent runs rep until stopped, its repairs counted on reg
// (if any).
func repairerComponent(rep *topology.Repairer, log *slog.Logger, reg prometheus.Registerer) (component, error) {
	if reg != nil {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "proxyfleet_topology_repairs_total",
			Help: "Streams and buckets the repairer found deleted and recreated.",
		}, func() float64 { return float64(rep.Repairs()) })); err != nil {
			return component{}, err
		}
	}
	return component{"repairer", func(ctx context.Context) error {
		err := rep.Run(ctx)
		log.Info("repairer stopped", "repairs", rep.Repairs())
		return err
	}}, nil
}
