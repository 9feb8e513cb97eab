package worker

import (
	"cmp"
	"log/slog"
	"time"

	"proxyfleet/messages"
	"proxyfleet/worker/defaults"
)

// The defaults of Config are the constants of package worker/defaults,
// which package config fills a file's gaps with too; those of the settings
// the worker shares with its consumers (AckWait, MaxAttempts, PinnedTTL)
// are the Topology's (topology.Topology.WithDefaults).

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

	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, defaults.ReadyTimeout)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, defaults.PollInterval)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, defaults.DrainTimeout)
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, defaults.CheckInterval)
	cfg.DeletedTTL = cmp.Or(cfg.DeletedTTL, defaults.DeletedTTL)
	cfg.ObserveInterval = cmp.Or(cfg.ObserveInterval, defaults.ObserveInterval)
	cfg.ObservePasses = cmp.Or(cfg.ObservePasses, defaults.ObservePasses)
	cfg.SweepGrace = cmp.Or(cfg.SweepGrace, defaults.SweepGrace)
	cfg.ProgressEvery = cmp.Or(cfg.ProgressEvery, defaults.ProgressEvery)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, defaults.Heartbeat)
	cfg.Liveness = cmp.Or(cfg.Liveness, defaults.LivenessHeartbeats*cfg.Heartbeat)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaults.Concurrency)
	cfg.ProxyPort = cmp.Or(cfg.ProxyPort, defaults.ProxyPort)
	cfg.QuarantineFailures = cmp.Or(cfg.QuarantineFailures, defaults.QuarantineFailures)
	cfg.QuarantineWindow = cmp.Or(cfg.QuarantineWindow, defaults.QuarantineWindow)
	cfg.QuarantineCoolDown = cmp.Or(cfg.QuarantineCoolDown, defaults.QuarantineCoolDown)
	cfg.QuarantineMaxCoolDown = cmp.Or(cfg.QuarantineMaxCoolDown, defaults.QuarantineMaxCoolDown)
	cfg.QuarantineMaxCoolDown = max(cfg.QuarantineMaxCoolDown, cfg.QuarantineCoolDown)
	if cfg.Backoff == nil {
		cfg.Backoff = ExpBackoff{Initial: defaults.BackoffInitial, Max: defaults.BackoffMax}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}
