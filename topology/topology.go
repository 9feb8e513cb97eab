package topology

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Topology sizes the streams, consumers and buckets. See
// docs/ARCHITECTURE.md for why each setting is what it is.
//
// Streams and buckets are created and updated by Setup (the `proxyfleet
// setup` verb, and `serve` on its embedded server), which needs an admin
// credential, and kept in place by a Repairer. A worker only creates and
// updates its own consumers, from IntakeConsumerConfig and
// WorkConsumerConfig (see package worker).
type Topology struct {
	Subjects        messages.Subjects
	Replicas        int
	DuplicateWindow time.Duration
	ResultsMaxAge   time.Duration
	DeadMaxAge      time.Duration
	CommandIDMaxAge time.Duration
	AckWait         time.Duration
	MaxAttempts     int
	PinnedTTL       time.Duration
	// MaxAckPending bounds the work items of one host in flight.
	MaxAckPending int
}

// Names of the consumers. Intake is one durable shared by every worker; each
// host has one work consumer, pinned to one worker at a time.
const (
	IntakeConsumer = "intake"
	PriorityGroup  = "owner"
)

// WorkConsumer is the durable name of a host's work consumer.
func WorkConsumer(host string) string { return "work-" + host }

// LeasesTTL is the TTL of the PROXY_LEASES bucket.
const LeasesTTL = time.Minute

// WorkersTTL is the TTL of the PROXY_WORKERS bucket: a worker that stops
// renewing its heartbeat ages out of the membership after it (workers read
// liveness from the record's own time, with their own, shorter, window;
// the TTL only clears records nobody renews).
const WorkersTTL = time.Minute

// maxDeliver is the server's backstop: the worker gives up after
// MaxAttempts on its own (failing and dead-lettering the command); the
// server stops redelivering only well after that, in case a handler crashes
// before it can.
func (t Topology) maxDeliver() int { return 2*t.MaxAttempts + 5 }

// Streams returns the configuration of every stream (KV buckets aside).
func (t Topology) Streams() []jetstream.StreamConfig {
	t = t.WithDefaults()
	s := t.Subjects
	return append([]jetstream.StreamConfig{{
		Name:        messages.StreamCommands,
		Description: "proxy commands, a work queue drained by intake",
		Subjects:    []string{s.CreateAll(), s.DeleteAll()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    t.Replicas,
		Duplicates:  t.DuplicateWindow,
		MaxMsgSize:  1 << 20,
	}, {
		Name:              messages.StreamWork,
		Description:       "per-host work items; one per proxy, newest wins",
		Subjects:          []string{s.WorkAll()},
		Retention:         jetstream.WorkQueuePolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          t.Replicas,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
	}, {
		Name:        messages.StreamResults,
		Description: "answers to commands, kept so a client can read its answer later",
		Subjects:    []string{s.ResultAll()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    t.Replicas,
		MaxAge:      t.ResultsMaxAge,
		Duplicates:  t.DuplicateWindow,
	}, {
		Name:              messages.StreamEvents,
		Description:       "the latest state event of every proxy",
		Subjects:          []string{s.StateAll()},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          t.Replicas,
		MaxMsgsPerSubject: 1,
		AllowMsgTTL:       true,
		AllowDirect:       true,
	}, {
		Name:        messages.StreamDead,
		Description: "commands that ran out of attempts",
		Subjects:    []string{s.DeadAll()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    t.Replicas,
		MaxAge:      t.DeadMaxAge,
		Duplicates:  t.DuplicateWindow,
	}}, append(t.poolStreams(), t.hostStreams()...)...)
}

// Buckets returns the configuration of every KV bucket.
func (t Topology) Buckets() []jetstream.KeyValueConfig {
	t = t.WithDefaults()
	return append([]jetstream.KeyValueConfig{
		{Bucket: messages.BucketDesired, Description: "desired state per proxy", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketCommands, Description: "command ids seen, for effect-once", History: 1, TTL: t.CommandIDMaxAge, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketRotation, Description: "the rotation: proxy id to ip:port", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketLeases, Description: "leases", History: 1, TTL: LeasesTTL, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketWorkers, Description: "worker heartbeats: the membership hosts are shared over", History: 1, TTL: WorkersTTL, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketHosts, Description: "per-host records: room reserved, quarantine", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketChecks, Description: "what health's probes found per proxy: egress, refusals", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
	}, append(t.poolBuckets(), t.banBuckets()...)...)
}

// banBuckets is PROXY_BANS: one entry per ban, which expires by its own
// TTL (JetStream's per-message TTL, nats-server 2.11+), so nothing sweeps
// it; the marker its expiry leaves tells every watcher.
func (t Topology) banBuckets() []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{
		{Bucket: messages.BucketBans, Description: "bans of an egress address for a site, each with its own TTL", History: 1,
			LimitMarkerTTL: messages.BansMarkerTTL, Storage: jetstream.FileStorage, Replicas: t.Replicas},
	}
}

// BucketStream is the name of the stream behind KV bucket b.
func BucketStream(b string) string { return "KV_" + b }

// IntakeConsumerConfig is the configuration of the intake consumer on
// PROXY_CMDS, which every worker running intake shares.
func (t Topology) IntakeConsumerConfig() jetstream.ConsumerConfig {
	t = t.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:       IntakeConsumer,
		Description:   "validates commands into desired state",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    t.maxDeliver(),
		MaxAckPending: 1024,
	}
}

// WorkConsumerConfig is the configuration of host's work consumer on
// PROXY_WORK, pinned to one worker at a time. Its state is kept in memory:
// a file consumer rewrites its state file after every ack, a fifth of the
// server's CPU with 500 hosts, and a consumer made anew after a restart
// delivers exactly the items not done (acked ones leave the work queue).
// Set-up does not compare the storage, which the server cannot change in
// place: a consumer stored on file by an earlier release stays so.
func (t Topology) WorkConsumerConfig(host string) jetstream.ConsumerConfig {
	t = t.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:        WorkConsumer(host),
		Description:    "work of host " + host + ", pinned to one worker",
		FilterSubject:  t.Subjects.WorkHost(host),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        t.AckWait,
		MaxDeliver:     t.maxDeliver(),
		MaxAckPending:  t.MaxAckPending,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      t.PinnedTTL,
		MemoryStorage:  true,
	}
}

// Ensure is Setup followed by creating (or updating) the consumers a worker
// executing hosts would: the whole topology at once, for tests and tools that
// hold an admin credential and want it in place before any worker runs.
// Workers do not call it.
func (t Topology) Ensure(ctx context.Context, js jetstream.JetStream, hosts []string) error {
	if _, err := t.Setup(ctx, js); err != nil {
		return err
	}
	cfgs := []consumerSpec{{messages.StreamCommands, t.IntakeConsumerConfig()}}
	for _, h := range hosts {
		cfgs = append(cfgs, consumerSpec{messages.StreamWork, t.WorkConsumerConfig(h)})
	}
	for _, c := range cfgs {
		if _, _, err := EnsureConsumer(ctx, js, c.stream, c.cfg); err != nil {
			return err
		}
	}
	return nil
}

type consumerSpec struct {
	stream string
	cfg    jetstream.ConsumerConfig
}
