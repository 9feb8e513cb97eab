// Package defaults holds the defaults of the health process's settings,
// as constants: health.Config.WithDefaults fills a Config's zero values
// with them and package config a file's gaps, so a health process started
// from a file and one started from code agree. It holds too the rules of
// the probe targets that both check (Targets). It imports only the
// standard library, so that config, which may not lean on NATS, can read
// it.
package defaults

import "time"

const (
	// HTTPAddr is where the health process serves HTTP.
	HTTPAddr = "127.0.0.1:8080"
	// Interval is the time between two probe rounds; a probe's timeout
	// is Timeout(Interval).
	Interval = 2 * time.Second
	// Rise passing probes in a row put a proxy in the rotation; Fall
	// failing ones take it out.
	Rise = 2
	Fall = 3
	// Concurrency bounds the probes in flight.
	Concurrency = 64
	// LeaseTTL is how long the publisher's lease lasts without renewal.
	LeaseTTL = 15 * time.Second
	// OpenCheckInterval is how often a proxy in the rotation is checked
	// again to refuse a request without the credential.
	OpenCheckInterval = time.Minute
	// ReportInterval: a report within this long of one that asked for a
	// probe of the same proxy asks for nothing; ReportRate bounds the
	// probes reports ask for, a second.
	ReportInterval = 5 * time.Second
	ReportRate     = 20
	// SnapshotInterval is the least time between two snapshots of the
	// rotation; SnapshotRate bounds their bytes a second.
	SnapshotInterval = time.Second
	SnapshotRate     = 256 << 10
	// Grace is how long a running proxy that reports provisioning keeps
	// its place, for a file that leaves health.grace out. A Config's zero
	// Grace is no grace: it demotes at once.
	Grace = 30 * time.Second
	// OpTimeout bounds each request to NATS made while publishing;
	// RetryInterval is the wait before publishing again after a failure;
	// CatchUpPoll how often the consumer's info is read while catching
	// up; CheckInterval how often the stream, buckets and consumer are
	// looked at.
	OpTimeout     = 5 * time.Second
	RetryInterval = time.Second
	CatchUpPoll   = 500 * time.Millisecond
	CheckInterval = 2 * time.Second
)

// Timeout is a probe's timeout for probe rounds interval apart: 80% of
// the interval.
func Timeout(interval time.Duration) time.Duration { return interval * 8 / 10 }
