// Package pool is the pool controller: it keeps each pool of PROXY_POOLS
// at its size in the rotation by publishing ordinary create and delete
// commands, replaces its members by age without a gap, and replaces the
// broken ones without looping on a spec that does not work.
//
// # Commands and records
//
// A client publishes <prefix>.cmd.pool.set.<name> (messages.PoolSet),
// .delete.<name> or .recycle.<name> to the work queue PROXY_POOLCMDS.
// Every controller, active or standing by, takes them from the shared
// durable consumer "pools", one at a time, so they are applied in the
// order they were stored: each is validated (a rejection names the field,
// as intake's do), checked against the config (the image and the hosts
// exist), applied to the pool's record in PROXY_POOLS with
// compare-and-set, and answered accepted on <prefix>.result.pool.<name>.
// A set or delete older than the recorded one is superseded; a command
// delivered again finds its sequence applied and is only answered again.
// The record (messages.PoolRecord) holds the pool's spec, every member the
// controller made and the commands waiting for their final answer.
//
// # The active controller
//
// One controller at a time runs passes: the holder of the "pools" lease in
// PROXY_LEASES (renewed every third of Config.LeaseTTL with
// compare-and-set; a standby takes over when its revision has not moved
// for the TTL). A pass runs every Config.Interval and soon after the
// rotation or a record changes. For each pool it observes every member
// (in the rotation or not, from package rotation; the last state event of
// one that is not), decides (plan.go, a pure function), writes the record
// with compare-and-set and only then publishes what it decided: a new
// member is in the record, with a command id derived from its id, before
// its create is published, so a standby that takes over knows it and a
// create published again is a duplicate. Nothing a standby needs is kept
// only in memory.
//
// What a pass decides, per pool:
//
//   - Members that failed (their create's state event is failed), that
//     were deleted behind the pool's back, that never entered the rotation
//     within ready_timeout of being made, or that left it for
//     ready_timeout, are deleted and replaced. Each counts as a failure;
//     a member entering the rotation ends the count. Creations not yet
//     proven and failures together never exceed size+surge: a pool whose
//     creates keep failing makes size+surge of them, then one at a time,
//     each after Config.BackoffInitial doubled per further failure (up to
//     Config.BackoffMax), and is degraded meanwhile: its state says so,
//     with the last reason, once, at warn level, and in its metrics.
//   - Members older than max_age (less a jitter of up to 10% each, drawn
//     when it is made), named by a recycle, or burned (their egress
//     addresses banned on recycle_after_bans distinct sites at once, from
//     the bans the rotation follows; marked in the record, so they stay
//     due when the bans end) are replaced make-before-break:
//     at most size+surge members are live at once; an old member goes only
//     once a fresh one in the rotation fills its place, and only if the
//     pool keeps min_ready members in the rotation.
//   - A pool larger than its size deletes the members not in the rotation
//     first, then the oldest; a deleted pool deletes every member, then
//     its record.
//   - New members go to the hosts of spec.hosts (or any configured host)
//     that are not quarantined and have room (PROXY_HOSTS), those with
//     the fewest members of the pool first, then the most free room.
//
// # Lifecycle
//
// A Controller runs as one call, Run(ctx) error: it waits for set-up's
// streams and buckets, follows the rotation, watches PROXY_POOLS, consumes
// the commands and runs the lease and the passes until ctx ends; then it
// releases the lease and returns nil. It fails when its NATS connection is
// closed for good, or when the server refuses to update its consumer.
//
// Of proxyfleet it imports messages (the contract), rotation (the
// rotation's consumer library) and topology (its consumer's name and
// settings).
//
// # Files
//
// controller.go is the Controller, its loop and its view of the pools;
// commands.go the commands; plan.go the decisions; place.go the choice of
// hosts; pass.go what a pass reads, writes and publishes; metrics.go the
// metrics. The lease is package internal/lease's, on key "pools".
package pool
