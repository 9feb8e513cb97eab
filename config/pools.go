package config

import (
	"net"
	"time"

	pooldef "proxyfleet/pool/defaults"
)

// Pools tunes the pool controller (`proxyfleet pools`, and in `serve`),
// which keeps the pools of PROXY_POOLS (`proxyfleet pool set`). The
// pools themselves are commands, not config. The defaults are package
// proxyfleet/pool/defaults's constants.
type Pools struct {
	// Interval is the time between two passes of the active controller
	// (a change of the rotation or of a pool starts one sooner).
	Interval time.Duration `yaml:"interval"`
	// LeaseTTL: a standby controller takes over this long after the
	// active one's last renewal (at most PROXY_LEASES's TTL, 1m).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// A pool whose failures reach size+surge creates one member at a
	// time, BackoffInitial after the last failure, doubling with each
	// further failure up to BackoffMax.
	BackoffInitial time.Duration `yaml:"backoff_initial"`
	BackoffMax     time.Duration `yaml:"backoff_max"`
	// HTTP is where `proxyfleet pools` serves /metrics, /healthz and
	// /readyz (overridden by --http; empty: none). `serve` serves them
	// on health.http.
	HTTP string `yaml:"http"`
}

func (p *Pools) setDefaults() {
	setDur(&p.Interval, pooldef.Interval)
	setDur(&p.LeaseTTL, pooldef.LeaseTTL)
	setDur(&p.BackoffInitial, pooldef.BackoffInitial)
	setDur(&p.BackoffMax, pooldef.BackoffMax)
}

func (p Pools) validate() error {
	for _, d := range []struct {
		f string
		v time.Duration
	}{
		{"pools.interval", p.Interval},
		{"pools.lease_ttl", p.LeaseTTL},
		{"pools.backoff_initial", p.BackoffInitial},
		{"pools.backoff_max", p.BackoffMax},
	} {
		if d.v <= 0 {
			return bad(d.f, "%s is not positive", d.v)
		}
	}
	if p.LeaseTTL > time.Minute {
		return bad("pools.lease_ttl", "%s is longer than the PROXY_LEASES bucket's TTL 1m", p.LeaseTTL)
	}
	if p.BackoffMax < p.BackoffInitial {
		return bad("pools.backoff_max", "%s is less than pools.backoff_initial %s", p.BackoffMax, p.BackoffInitial)
	}
	if p.HTTP != "" {
		if _, _, err := net.SplitHostPort(p.HTTP); err != nil {
			return bad("pools.http", "%v", err)
		}
	}
	return nil
}
