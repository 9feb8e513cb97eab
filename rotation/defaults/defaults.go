// Package defaults holds the defaults of a rotation's settings, as
// constants: rotation.New fills a Config's zero values with them and
// package config the gateway section's gaps (gateway.strategy,
// gateway.cooldown), so a gateway started from a file and a program that
// follows the rotation agree. It imports nothing but time, so that
// config, which may not lean on NATS, can read it.
package defaults

import "time"

const (
	// Strategy is how Pick chooses among the matching proxies: each in
	// turn (rotation.RoundRobin).
	Strategy = "round-robin"
	// Cooldown is how long a proxy this process reported is passed over
	// while another matches.
	Cooldown = 10 * time.Second
	// MaxCooldown is the longest cooldown a config file may set: a
	// reported proxy passed over for longer is better banned or removed.
	MaxCooldown = time.Hour
	// CheckInterval is how long the feed may be silent before the
	// publisher is asked for its version.
	CheckInterval = 5 * time.Second
	// RetryMax bounds the backoff between attempts to read the
	// rotation's pages.
	RetryMax = 5 * time.Second
)
