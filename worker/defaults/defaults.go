// Package defaults holds the defaults of the worker's settings, as
// constants: worker.Config.WithDefaults fills a Config's zero values with
// them and package config a file's gaps, so a worker started from a file
// and one started from code agree. It imports nothing but time, so that
// config, which may not lean on NATS, can read it. The settings the worker
// shares with its consumers (ack wait, attempts, pinned TTL) are
// topology's (proxyfleet/topology/defaults).
package defaults

import "time"

const (
	// ReadyTimeout bounds a create's wait for its proxy to run.
	ReadyTimeout = 5 * time.Minute
	// PollInterval is the longest pause between reads of a booting proxy.
	PollInterval = 2 * time.Second
	// DrainTimeout bounds the whole stop.
	DrainTimeout = 30 * time.Second
	// CheckInterval is how often consumers are checked and a missing
	// stream or bucket looked for again.
	CheckInterval = 5 * time.Second
	// DeletedTTL is how long a "deleted" event stays in PROXY_EVENTS.
	DeletedTTL = 24 * time.Hour
	// ObserveInterval is how often a host's owner re-reads its proxies.
	ObserveInterval = 30 * time.Second
	// ObservePasses is how many observation passes of its hosts a worker
	// runs at once.
	ObservePasses = 4
	// SweepGrace: a volume nothing used for this long is removed.
	SweepGrace = 10 * time.Minute
	// ProgressEvery is the least time between two progress events of a
	// create.
	ProgressEvery = 2 * time.Second
	// Heartbeat is how often a worker renews its record in PROXY_WORKERS.
	Heartbeat = 2 * time.Second
	// LivenessHeartbeats is how many heartbeats old a record may be and
	// its worker still count as live (Liveness = LivenessHeartbeats ×
	// Heartbeat).
	LivenessHeartbeats = 3
	// Concurrency is the work items run at once per host: a KVM host's
	// default room, so a burst that fills it boots at once.
	Concurrency = 20
	// ProxyPort is the port a proxy listens on.
	ProxyPort = 3128
	// Quarantine: QuarantineFailures transient failures within
	// QuarantineWindow quarantine a host for QuarantineCoolDown, doubled by
	// each failed probe up to QuarantineMaxCoolDown.
	QuarantineFailures    = 5
	QuarantineWindow      = time.Minute
	QuarantineCoolDown    = 5 * time.Second
	QuarantineMaxCoolDown = 5 * time.Minute
	// BackoffInitial and BackoffMax bound the delays of the retries.
	BackoffInitial = time.Second
	BackoffMax     = 2 * time.Minute
)
