package pool

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/messages"
	"proxyfleet/pool/defaults"
	"proxyfleet/topology"
)

// Host is one host the pools may place members on, as the config says.
type Host struct {
	Name string
	// MaxProxies is its room when its record in PROXY_HOSTS does not say
	// (a host no worker wrote yet).
	MaxProxies int
}

// Config configures a Controller. WithDefaults fills its zero values,
// from package proxyfleet/pool/defaults where a default is a constant.
type Config struct {
	Subjects messages.Subjects
	// Topology names and sizes the pools' consumer (its ack wait and
	// attempts).
	Topology topology.Topology
	// ID names this controller in the lease (default hostname-pid).
	ID string
	// Hosts the members may go to; Images and DefaultImage check a set's
	// spec.image, as intake would, so that a pool of an unknown image is
	// rejected instead of failing every create.
	Hosts        []Host
	Images       []string
	DefaultImage string
	// Interval between two passes of the active controller (default 1s);
	// a change of the rotation or of a pool's record starts one sooner.
	Interval time.Duration
	// LeaseTTL: a standby takes over this long after the active
	// controller's last renewal (default 15s, at most PROXY_LEASES's TTL).
	LeaseTTL time.Duration
	// BackoffInitial and BackoffMax pace the creations of a pool whose
	// failures reached size+surge: one create after BackoffInitial,
	// doubling with each further failure up to BackoffMax (defaults 5s and
	// 5m).
	BackoffInitial, BackoffMax time.Duration
	// CheckInterval is how often a missing stream or bucket is looked for
	// again, and the consumer checked (default 5s).
	CheckInterval time.Duration
	// Registry, if set, gets the controller's metrics.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Now and Rand are the clock and the randomness of ids and jitter
	// (defaults time.Now and math/rand/v2).
	Now  func() time.Time
	Rand func() float64
	// Hook, if set, is called at two points of a pass that made members:
	// "after-intent" (the new members are stored in the pool's record,
	// none of their creates published) and "after-publish" (their creates
	// are published, the record does not say so yet). A test seam:
	// cmd/proxyfleet's kill points SIGKILL the process there.
	Hook func(point, pool string, ids []string)
}

// WithDefaults returns cfg with every zero value filled with its default.
func (cfg Config) WithDefaults() Config {
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	if cfg.Topology.Subjects.Prefix == "" {
		cfg.Topology.Subjects = cfg.Subjects
	}
	cfg.Topology = cfg.Topology.WithDefaults()
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("%s-%d", cmp.Or(host, "unknown"), os.Getpid())
	}
	cfg.Interval = cmp.Or(cfg.Interval, defaults.Interval)
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, defaults.LeaseTTL)
	cfg.BackoffInitial = cmp.Or(cfg.BackoffInitial, defaults.BackoffInitial)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, defaults.BackoffMax)
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, defaults.CheckInterval)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

func (cfg Config) validate() error {
	if len(cfg.Hosts) == 0 {
		return errors.New("pool: no hosts")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", cfg.Interval}, {"lease TTL", cfg.LeaseTTL}, {"backoff initial", cfg.BackoffInitial}, {"backoff max", cfg.BackoffMax}} {
		if d.v <= 0 {
			return fmt.Errorf("pool: %s %s is not positive", d.name, d.v)
		}
	}
	if cfg.LeaseTTL > topology.LeasesTTL {
		return fmt.Errorf("pool: lease TTL %s is longer than %s's TTL %s", cfg.LeaseTTL, messages.BucketLeases, topology.LeasesTTL)
	}
	return nil
}
