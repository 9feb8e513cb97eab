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
			fs.DurationVar(&timeout, "timeout", 30*time.Second, "give up on set-up after this long")
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
	log := env.log
	js, err := jetstream.New(nc)
	if err != nil {
		return roleParts{}, err
	}
	rep := topology.NewRepairer(js, topologyOf(c), topology.RepairerConfig{Interval: c.NATS.RepairInterval, Logger: log})
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	changes, err := rep.Setup(sctx)
	// Run once, set-up reports to its caller in text; with --repair it is
	// a daemon (proxyfleet-setup.service, the setup Deployment) whose
	// output is its log: JSON there, a line per change, like serve's.
	report := func(msg string) { fmt.Fprintln(env.stdout, msg) }
	if repair {
		report = func(msg string) { log.Info("set-up: " + msg) }
	}
	for _, ch := range changes {
		report(ch.String())
	}
	if err != nil {
		var re *topology.RefusedError
		if errors.As(err, &re) {
			fmt.Fprintln(env.stderr, "a setting JetStream cannot change in place has to be changed by hand (or the stream recreated, losing its messages):")
		}
		return roleParts{}, fmt.Errorf("set-up: %w", err)
	}
	if len(changes) == 0 {
		report("every stream and bucket is as configured")
	}
	if !repair {
		return roleParts{}, nil
	}
	log.Info("repairing: recreating any stream or bucket that is deleted", "interval", c.NATS.RepairInterval)
	return roleParts{runs: []component{repairerComponent(rep, log)}}, nil
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
