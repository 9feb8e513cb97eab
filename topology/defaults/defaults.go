// Package defaults holds the defaults of the topology's and the
// repairer's settings, as constants: topology's WithDefaults fills zero
// values with them and package config a file's gaps, so a process started
// from a file and one started from code agree. It imports nothing but
// time, so that config, which may not lean on NATS, can read it. AckWait,
// MaxAttempts and PinnedTTL are the worker's settings as much as its
// consumers'.
package defaults

import "time"

const (
	// Replicas of every stream and bucket.
	Replicas = 1
	// DuplicateWindow of PROXY_CMDS, PROXY_RESULTS, PROXY_POOLCMDS and
	// PROXY_HOSTCMDS.
	DuplicateWindow = 2 * time.Minute
	// ResultsMaxAge is how long an answer stays in PROXY_RESULTS.
	ResultsMaxAge = 24 * time.Hour
	// DeadMaxAge is how long a dead letter stays in PROXY_DEAD.
	DeadMaxAge = 30 * 24 * time.Hour
	// CommandIDMaxAge is the TTL of PROXY_CMDIDS.
	CommandIDMaxAge = 7 * 24 * time.Hour
	// AckWait of the intake and work consumers.
	AckWait = 30 * time.Second
	// MaxAttempts of a command before it is dead-lettered.
	MaxAttempts = 8
	// PinnedTTL is how long a host's work consumer stays pinned to a
	// worker that stopped pulling.
	PinnedTTL = 15 * time.Second
	// MaxAckPending of a host's work consumer.
	MaxAckPending = 256
	// RepairInterval is how often the repairer looks for what is deleted;
	// RepairTimeout the least bound of one look (it is at least the
	// interval).
	RepairInterval = 5 * time.Second
	RepairTimeout  = 5 * time.Second
)
