// Package health is proxyfleet's health consumer: it folds the proxies'
// state events into the rotation, the set of proxies clients may use right
// now, and publishes it.
//
// # The fold
//
// Fold is the rotation as a pure function of the events seen so far: no
// NATS, no HTTP, no goroutines, and the time only through an injected
// clock. Each proxy keeps its last event's seq; an event at or below it is
// ignored, so duplicates, redeliveries and late arrivals change nothing,
// and a deleted proxy's seq stays as a tombstone. running with an address
// enters (or moves) a proxy; failed, deleting and deleted take it out;
// provisioning without an address (a restarted guest agent) keeps its last
// address and place for a grace period, after which Tick demotes it.
//
// Keeping the fold pure is what makes it cheap to trust: every rule is a
// table-driven test over plain values, with no server and no sleeps; every
// health process that reads the same events computes the same rotation, so
// a standby can take over publishing without a hand-over; and the I/O
// around it (the consumer, the bucket, the snapshots, HTTP) is a thin,
// replaceable shell that only moves events in and snapshots out.
//
// # The consumer
//
// Health reads PROXY_EVENTS with an ordered consumer that delivers the last
// event of every proxy first (DeliverLastPerSubjectPolicy over
// <prefix>.state.>), so a process that starts late rebuilds the whole
// picture, then follows new events. It publishes nothing until it has
// caught up with what the stream held when it started (a partial picture
// would look like proxies leaving); then it reconciles the bucket
// PROXY_ROTATION with the fold (puts what differs, deletes keys of proxies
// not in the rotation), publishes a snapshot on <prefix>.rotation and, from
// then on, does both on every change. The version grows by one on every
// change; when publishing falls behind, only the latest snapshot is sent, so
// published versions strictly grow but may skip. A failed publish is retried
// after reading the bucket again. It serves GET /rotation (503 until caught
// up), /healthz (503 until caught up or while publishing fails) and /metrics.
//
// Events are decoded leniently about unknown fields (a newer worker may add
// some) and strictly about the version and the id against the subject's.
//
// Open in this first cut: one publisher at a time (a lease in PROXY_LEASES;
// today every health process publishes), snapshot versions across restarts
// (kept in memory, so a new process starts again from 1) and probing.
package health
