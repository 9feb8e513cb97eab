package topology

import (
	"cmp"
	"log/slog"
	"time"

	"proxyfleet/messages"
)

// The defaults of Topology and RepairerConfig live here and only here.
// AckWait, MaxAttempts and PinnedTTL are the worker's settings as much as
// its consumers': worker.Config takes its defaults for them from
// Topology.WithDefaults, so both sides agree. Package config takes its own
// defaults from WithDefaults, so a process started from a file and one
// started from code agree.

// WithDefaults returns t with every zero value filled with its default.
func (t Topology) WithDefaults() Topology {
	if t.Subjects.Prefix == "" {
		t.Subjects = messages.NewSubjects("")
	}
	t.Replicas = cmp.Or(t.Replicas, 1)
	t.DuplicateWindow = cmp.Or(t.DuplicateWindow, 2*time.Minute)
	t.ResultsMaxAge = cmp.Or(t.ResultsMaxAge, 24*time.Hour)
	t.DeadMaxAge = cmp.Or(t.DeadMaxAge, 30*24*time.Hour)
	t.CommandIDMaxAge = cmp.Or(t.CommandIDMaxAge, 7*24*time.Hour)
	t.AckWait = cmp.Or(t.AckWait, 30*time.Second)
	t.MaxAttempts = cmp.Or(t.MaxAttempts, 8)
	t.PinnedTTL = cmp.Or(t.PinnedTTL, 15*time.Second)
	t.MaxAckPending = cmp.Or(t.MaxAckPending, 256)
	return t
}

// WithDefaults returns cfg with every zero (or negative) value filled with
// its default.
func (cfg RepairerConfig) WithDefaults() RepairerConfig {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = max(cfg.Interval, 5*time.Second)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}
