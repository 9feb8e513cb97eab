package topology

import (
	"cmp"
	"log/slog"

	"proxyfleet/messages"
	"proxyfleet/topology/defaults"
)

// The defaults of Topology and RepairerConfig are the constants of package
// topology/defaults, which package config fills a file's gaps with too.
// AckWait, MaxAttempts and PinnedTTL are the worker's settings as much as
// its consumers': worker.Config takes its defaults for them from
// Topology.WithDefaults, so both sides agree.

// WithDefaults returns t with every zero value filled with its default.
func (t Topology) WithDefaults() Topology {
	if t.Subjects.Prefix == "" {
		t.Subjects = messages.NewSubjects("")
	}
	t.Replicas = cmp.Or(t.Replicas, defaults.Replicas)
	t.DuplicateWindow = cmp.Or(t.DuplicateWindow, defaults.DuplicateWindow)
	t.ResultsMaxAge = cmp.Or(t.ResultsMaxAge, defaults.ResultsMaxAge)
	t.DeadMaxAge = cmp.Or(t.DeadMaxAge, defaults.DeadMaxAge)
	t.CommandIDMaxAge = cmp.Or(t.CommandIDMaxAge, defaults.CommandIDMaxAge)
	t.AckWait = cmp.Or(t.AckWait, defaults.AckWait)
	t.MaxAttempts = cmp.Or(t.MaxAttempts, defaults.MaxAttempts)
	t.PinnedTTL = cmp.Or(t.PinnedTTL, defaults.PinnedTTL)
	t.MaxAckPending = cmp.Or(t.MaxAckPending, defaults.MaxAckPending)
	return t
}

// WithDefaults returns cfg with every zero (or negative) value filled with
// its default.
func (cfg RepairerConfig) WithDefaults() RepairerConfig {
	if cfg.Interval <= 0 {
		cfg.Interval = defaults.RepairInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = max(cfg.Interval, defaults.RepairTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}
