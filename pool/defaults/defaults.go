// Package defaults holds the defaults of the pool controller's settings,
// as constants: pool.Config.WithDefaults fills a Config's zero values with
// them and package config a file's gaps, so a controller started from a
// file and one started from code agree. It imports nothing but time, so
// that config, which may not lean on NATS, can read it.
package defaults

import "time"

const (
	// Interval is the time between two passes of the active controller.
	Interval = time.Second
	// LeaseTTL: a standby controller takes over this long after the
	// active one's last renewal.
	LeaseTTL = 15 * time.Second
	// BackoffInitial and BackoffMax pace the creations of a pool whose
	// failures reached size+surge: one create after BackoffInitial,
	// doubling with each further failure up to BackoffMax.
	BackoffInitial = 5 * time.Second
	BackoffMax     = 5 * time.Minute
	// CheckInterval is how often a missing stream or bucket is looked for
	// again, and the consumer checked.
	CheckInterval = 5 * time.Second
)
