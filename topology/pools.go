package topology

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// The pools' stream, bucket and consumer (see docs/ARCHITECTURE.md,
// "Pools").

// PoolsConsumer is the durable consumer of PROXY_POOLCMDS that every pool
// controller shares.
const PoolsConsumer = "pools"

// PoolsLeaseKey is the key of the active pool controller's lease in
// PROXY_LEASES.
const PoolsLeaseKey = "pools"

// poolStreams is PROXY_POOLCMDS: a work queue of pool commands, which a
// pool controller takes one at a time. Its dedupe window drops a client's
// retry with the same Nats-Msg-Id, as PROXY_CMDS's does.
func (t Topology) poolStreams() []jetstream.StreamConfig {
	return []jetstream.StreamConfig{{
		Name:        messages.StreamPoolCommands,
		Description: "pool commands, a work queue drained by the pool controllers",
		Subjects:    []string{t.Subjects.PoolCommandAll()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    t.Replicas,
		Duplicates:  t.DuplicateWindow,
		MaxMsgSize:  1 << 20,
	}}
}

// poolBuckets is PROXY_POOLS: one record per pool (messages.PoolRecord),
// written with compare-and-set.
func (t Topology) poolBuckets() []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{
		{Bucket: messages.BucketPools, Description: "pools: spec, members, state", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
	}
}

// PoolsConsumerConfig is the configuration of the pool controllers' shared
// consumer of PROXY_POOLCMDS. One command is in flight at a time
// (MaxAckPending 1), so commands are applied in the order they were
// stored, and a command is redelivered before the next one is delivered.
func (t Topology) PoolsConsumerConfig() jetstream.ConsumerConfig {
	t = t.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:       PoolsConsumer,
		Description:   "pool commands, applied to PROXY_POOLS",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    t.maxDeliver(),
		MaxAckPending: 1,
	}
}

// maxPoolSeq is the highest command sequence recorded in PROXY_POOLS (0 if
// it is empty or missing): a PROXY_POOLCMDS made anew starts above it, or
// every later set of a known pool would be answered superseded.
func maxPoolSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	return maxRecordSeq(ctx, js, messages.BucketPools)
}
