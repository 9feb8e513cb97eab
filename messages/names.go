package messages

import "time"

// JetStream stream and KV bucket names of the contract.
const (
	StreamCommands = "PROXY_CMDS"    // work queue over <prefix>.cmd.{create,delete}.*
	StreamWork     = "PROXY_WORK"    // work queue over <prefix>.work.<host>.<id>, one message per subject
	StreamResults  = "PROXY_RESULTS" // <prefix>.result.>, kept for a while
	StreamEvents   = "PROXY_EVENTS"  // <prefix>.state.>, the latest event per proxy
	StreamDead     = "PROXY_DEAD"    // <prefix>.dead.>

	BucketDesired  = "PROXY_DESIRED"  // key: proxy id; value: the desired state record
	BucketCommands = "PROXY_CMDIDS"   // key: hash of a command id; value: the command's sequence (effect-once)
	BucketRotation = "PROXY_ROTATION" // key: proxy id; value: ip:port
	BucketLeases   = "PROXY_LEASES"   // leases (the publishing health process)
	BucketWorkers  = "PROXY_WORKERS"  // key: worker id; value: WorkerRecord, a heartbeat that ages out (TTL)
	BucketHosts    = "PROXY_HOSTS"    // per-host records: room reserved against max_proxies, quarantine
	BucketChecks   = "PROXY_CHECKS"   // key: proxy id; value: CheckRecord, what health's probes found (egress, refusals)
	// BucketBans: key: <address>.<site> (package bans, Key); value: a
	// bans.Ban. Each entry carries its own TTL, the ban's length.
	BucketBans = "PROXY_BANS"
)

// BansMarkerTTL is how long PROXY_BANS keeps the marker the server stores
// when a ban's own TTL ends it, or when a ban is removed: long enough for
// every watcher to see the end, then the marker leaves by itself.
const BansMarkerTTL = 10 * time.Minute
