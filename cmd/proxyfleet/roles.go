package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/config"
	"proxyfleet/kvm"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// loadConfig reads the config, or returns the defaults when path is empty
// and a default is acceptable.
func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return nil, errors.New("--config is required")
	}
	return config.Load(path)
}

// loadRoleConfig reads the config of a role that makes proxies or probes
// them (serve, worker, health), and the secrets it names: a missing or
// empty password file stops the role at start, naming the field.
func loadRoleConfig(path string) (*config.Config, error) {
	c, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	if err := c.LoadSecrets(nil); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// The sim driver sweeps the volumes nothing uses, as kvm does (kvm.go).
var _ worker.Sweeper = (*sim.Driver)(nil)

// providers builds one Provider per configured host; km, if set, hears
// the kvm hosts' links.
func providers(c *config.Config, log *slog.Logger, km *kvmMetrics) (map[string]worker.Provider, error) {
	out := map[string]worker.Provider{}
	for _, h := range c.Hosts {
		var (
			p   worker.Provider
			err error
		)
		switch h.Driver {
		case "sim":
			p, err = sim.New(sim.Config{Host: h.Name, Dir: h.Sim.Dir, Delay: h.Sim.Delay, BootDelay: h.Sim.BootDelay})
		case "kvm":
			var obs kvm.Observer
			if km != nil {
				obs = km.observer(h.Name)
			}
			p, err = newKVMProvider(c, h, log, obs)
		default:
			err = fmt.Errorf("unknown driver %q", h.Driver)
		}
		if err != nil {
			for _, q := range out {
				q.Close()
			}
			return nil, fmt.Errorf("host %s: %w", h.Name, err)
		}
		out[h.Name] = p
	}
	return out, nil
}

func workerConfig(c *config.Config, provs map[string]worker.Provider, log *slog.Logger) worker.Config {
	images := make([]string, len(c.Images))
	for i, im := range c.Images {
		images[i] = im.Name
	}
	subj := messages.NewSubjects(c.NATS.Prefix)
	return worker.Config{
		Subjects: subj,
		Topology: topology.Topology{
			Subjects: subj, Replicas: c.NATS.Replicas, DuplicateWindow: c.NATS.DuplicateWindow,
			ResultsMaxAge: c.NATS.ResultsMaxAge, CommandIDMaxAge: c.NATS.CommandIDMaxAge,
			AckWait: c.Worker.AckWait, MaxAttempts: c.Worker.MaxAttempts, PinnedTTL: c.Worker.PinnedTTL,
		},
		Catalog: worker.Catalog{
			Hosts: c.HostNames(), Images: images, DefaultImage: c.DefaultImage,
			DefaultCPUs: c.Proxy.CPUs, DefaultMemoryMiB: c.Proxy.MemoryMiB, MaxProxies: maxProxies(c), Plans: c.Plans(),
		},
		Providers:       provs,
		AckWait:         c.Worker.AckWait,
		MaxAttempts:     c.Worker.MaxAttempts,
		ReadyTimeout:    c.Worker.ReadyTimeout,
		PollInterval:    c.Worker.PollInterval,
		PinnedTTL:       c.Worker.PinnedTTL,
		Concurrency:     c.Worker.Concurrency,
		DrainTimeout:    c.Worker.DrainTimeout,
		CheckInterval:   c.Worker.CheckInterval,
		ObserveInterval: c.Worker.ObserveInterval,
		ObservePasses:   c.Worker.ObservePasses,
		Heartbeat:       c.Worker.Heartbeat,
		Liveness:        c.Worker.Liveness,
		SweepGrace:      c.Worker.SweepGrace,
		DeletedTTL:      c.NATS.DeletedMaxAge,
		ProxyPort:       c.Proxy.Port,
		Backoff:         worker.ExpBackoff{Initial: c.Worker.BackoffInitial, Max: c.Worker.BackoffMax},
		Logger:          log,

		QuarantineFailures:    c.Worker.QuarantineFailures,
		QuarantineWindow:      c.Worker.QuarantineWindow,
		QuarantineCoolDown:    c.Worker.QuarantineCoolDown,
		QuarantineMaxCoolDown: c.Worker.QuarantineMaxCoolDown,
	}
}

// maxProxies is each host's room.
func maxProxies(c *config.Config) map[string]int {
	out := map[string]int{}
	for _, h := range c.Hosts {
		out[h.Name] = h.MaxProxies
	}
	return out
}

// workerSpec is the worker: intake of commands and execution on the
// config's hosts, named by --id (empty: hostname-pid). Its run waits for
// set-up to have created the streams and buckets, as long as it takes
// (until ctx ends), and drains when ctx ends; its ready is
// worker.Worker.Ready.
func workerSpec() *roleSpec {
	return &roleSpec{
		name: "worker", inbox: inboxWorker, gcPercent: workerGCPercent,
		configUsage: "config file (YAML); required", secrets: true,
		idUsage:   "this worker's id, stable and readable (default hostname-pid)",
		httpUsage: "address of /metrics, /healthz and /readyz (default from config worker.http; none if empty)",
		httpAddr:  func(c *config.Config) *string { return &c.Worker.HTTP },
		ops:       true, pprof: true,
		build: buildWorker,
		// The worker's reasons do not name it; serve's /readyz does.
		serveReady: func(ready func() error) func() error {
			return func() error {
				if err := ready(); err != nil {
					return fmt.Errorf("worker: %w", err)
				}
				return nil
			}
		},
	}
}

func buildWorker(_ context.Context, nc *nats.Conn, c *config.Config, env roleEnv) (roleParts, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return roleParts{}, err
	}
	provs, err := providers(c, env.log, newKVMMetrics(env.reg))
	if err != nil {
		return roleParts{}, err
	}
	closeProviders := func() {
		for _, p := range provs {
			p.Close()
		}
	}
	wc := workerConfig(c, provs, env.log)
	wc.ID = env.id
	wc.Registerer = env.reg
	w, err := worker.New(js, wc)
	if err != nil {
		closeProviders()
		return roleParts{}, err
	}
	return roleParts{
		runs: []component{{"worker", func(ctx context.Context) error {
			err := w.Run(ctx)
			env.log.Info("worker stopped", "stats", w.Stats().Snapshot())
			return err
		}}},
		ready: w.Ready,
		close: closeProviders,
	}, nil
}

// checkID refuses an --id that cannot name a worker.
func checkID(id string) error {
	if id != "" && !worker.ValidID(id) {
		return fmt.Errorf("--id %q: want letters, digits, '.', '_' and '-', starting with a letter or digit", id)
	}
	return nil
}

// embedded runs the in-process nats-server of `serve`.
func embedded(listen, dataDir string, log *slog.Logger) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: bad port", listen)
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	abs, _ := filepath.Abs(dataDir)
	s, err := server.NewServer(&server.Options{
		ServerName: "proxyfleet",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   abs,
		NoSigs:     true,
		NoLog:      true,
		// A single node: flush every write before acknowledging it, as
		// nats.conf does and for the same reason.
		SyncAlways: true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	// Its warnings and errors go to our log (NoLog only stops it
	// configuring a logger of its own).
	s.SetLogger(natsLog{log.With("component", "nats-server")}, false, false)
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats-server on %s: not ready within 15s", listen)
	}
	log.Info("embedded nats-server ready", "url", s.ClientURL(), "store", abs)
	return s, nil
}

// workerGCPercent is the worker process's GOGC unless the environment sets
// one. A worker's live heap is a few MiB even with thousands of proxies
// (its records are read when needed, not held), and most of its time is
// spent waiting on NATS and libvirt, so a heap goal of 1.5 times the live
// heap instead of twice costs little CPU and keeps the burst peak of RSS
// lower (make bench: worker_peak_rss_mib).
const workerGCPercent = 50

// healthGCPercent is the health process's GOGC unless the environment
// sets one. Nearly all of its heap is what it keeps of every proxy (the
// fold, the rotation as published, the check records), which no
// collection frees, and it allocates little beside (an event or a probe
// at a time): a heap goal of 1.75 times that instead of twice lowers its
// peak RSS for a few more collections (make bench:
// fleet_50k_health_rss_mib; docs/DECISIONS.md).
const healthGCPercent = 75

// memProfileOff turns allocation sampling off once (roleGC).
var memProfileOff sync.Once

// roleGC sets a role's GOGC to percent, unless the environment sets one.
// Without pprof nobody can read a heap profile, so the process samples no
// allocations for one either, sparing the profiler's buckets
// (docs/DECISIONS.md, "No allocation sampling without --pprof"). A
// process runs one role; where several run in one process (the tests),
// the first to start decides that, once.
func roleGC(log *slog.Logger, percent int, pprof bool) {
	if !pprof {
		memProfileOff.Do(func() { runtime.MemProfileRate = 0 })
	}
	if os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(percent)
	log.Debug("garbage collector", "gogc", percent)
}
