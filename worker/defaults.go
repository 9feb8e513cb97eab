package worker

import (
	"cmp"
	"log/slog"
	"time"

	"proxyfleet/messages"
)

// The defaults of Config live here and only here; those of the settings
// it shares with its consumers (AckWait, MaxAttempts, PinnedTTL) are the
// Topology's (topology.Topology.WithDefaults). Package config takes its own
// defaults from WithDefaults, so a worker started from a file and one
// started from code agree.

// defaultSweepGrace: a volume nothing used for this long is removed.
const defaultSweepGrace = 10 * time.Minute

// WithDefaults returns cfg with every zero value filled with its default.
// AckWait, MaxAttempts and PinnedTTL are the worker's and its consumers'
// (Topology's): set in one only, the other takes it; set in neither, both
// take the Topology's default.
func (cfg Config) WithDefaults() Config {
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	t := &cfg.Topology
	t.Subjects = cfg.Subjects
	t.AckWait = cmp.Or(t.AckWait, cfg.AckWait)
	t.MaxAttempts = cmp.Or(t.MaxAttempts, cfg.MaxAttempts)
	t.PinnedTTL = cmp.Or(t.PinnedTTL, cfg.PinnedTTL)
	*t = t.WithDefaults()
	cfg.AckWait = cmp.Or(cfg.AckWait, t.AckWait)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, t.MaxAttempts)
	cfg.PinnedTTL = cmp.Or(cfg.PinnedTTL, t.PinnedTTL)

	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, 5*time.Minute)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 2*time.Second)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, 30*time.Second)
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, 5*time.Second)
	cfg.DeletedTTL = cmp.Or(cfg.DeletedTTL, 24*time.Hour)
	cfg.ObserveInterval = cmp.Or(cfg.ObserveInterval, 30*time.Second)
	cfg.SweepGrace = cmp.Or(cfg.SweepGrace, defaultSweepGrace)
	cfg.ProgressEvery = cmp.Or(cfg.ProgressEvery, 2*time.Second)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, 2*time.Second)
	cfg.Liveness = cmp.Or(cfg.Liveness, 3*cfg.Heartbeat)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 20) // a KVM host's default room: a burst that fills it boots at once
	cfg.ProxyPort = cmp.Or(cfg.ProxyPort, 3128)
	cfg.QuarantineFailures = cmp.Or(cfg.QuarantineFailures, 5)
	cfg.QuarantineWindow = cmp.Or(cfg.QuarantineWindow, time.Minute)
	cfg.QuarantineCoolDown = cmp.Or(cfg.QuarantineCoolDown, 5*time.Second)
	cfg.QuarantineMaxCoolDown = cmp.Or(cfg.QuarantineMaxCoolDown, 5*time.Minute)
	cfg.QuarantineMaxCoolDown = max(cfg.QuarantineMaxCoolDown, cfg.QuarantineCoolDown)
	if cfg.Backoff == nil {
		cfg.Backoff = ExpBackoff{Initial: time.Second, Max: 2 * time.Minute}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}
