// Package topology is the streams, buckets and consumers of a fleet as its
// config wants them, and how they are made so and kept so.
//
// Topology sizes them: Streams and Buckets are the configurations of every
// stream and KV bucket; IntakeConsumerConfig and WorkConsumerConfig those of
// the worker's consumers, with their names (IntakeConsumer, WorkConsumer,
// PriorityGroup). Setup creates each stream and bucket that is missing and
// updates, in place, each setting that differs, naming it (Change, Diff);
// a setting the server will not change in place is a *RefusedError. It
// needs an admin credential: `proxyfleet setup` runs it, and `serve` on its
// embedded server. A Repairer is set-up kept running: it recreates any
// stream or bucket that is deleted, above the sequences it saw.
//
// Every role waits for the streams and buckets it needs with an Awaiter,
// which says at error level what is missing, again every MissingLogEvery.
// The worker creates and updates its own consumers with EnsureConsumer and
// compares the streams it finds with DiffStream and DiffBucket, reporting a
// difference as a *MismatchError; it never creates a stream or a bucket.
// This package serves every role, so it imports none of them: only the wire
// contract (messages) and JetStream.
//
// # Lifecycle
//
// A Repairer runs as one call, Run(ctx) error: it checks every Interval
// until ctx is done, then returns nil; it fails when its NATS connection is
// closed for good. The defaults of Topology and RepairerConfig are the
// constants of package topology/defaults (config fills a file's gaps with
// them too), applied by their WithDefaults; worker.Config takes those of the settings it
// shares with its consumers (AckWait, MaxAttempts, PinnedTTL) from
// Topology.WithDefaults.
//
// # Files
//
// topology.go is Topology, the names and the configurations; defaults.go
// the defaults; setup.go is Setup, EnsureConsumer and their errors; diff.go
// the settings compared and how each is shown; repair.go the Repairer;
// await.go the Awaiter.
package topology
