package topology

import (
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// HostsConsumer is the durable consumer of PROXY_HOSTCMDS that every
// worker running intake shares.
const HostsConsumer = "hosts"

// hostStreams is PROXY_HOSTCMDS: a work queue of host commands (an
// operator's quarantine and release), which a worker takes one at a time.
// Its dedupe window drops a client's retry with the same Nats-Msg-Id, as
// PROXY_CMDS's does.
func (t Topology) hostStreams() []jetstream.StreamConfig {
	return []jetstream.StreamConfig{{
		Name:        messages.StreamHostCommands,
		Description: "host commands (quarantine, release), a work queue drained by the workers",
		Subjects:    []string{t.Subjects.HostCommandAll()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    t.Replicas,
		Duplicates:  t.DuplicateWindow,
		MaxMsgSize:  1 << 20,
	}}
}

// HostsConsumerConfig is the configuration of the workers' shared consumer
// of PROXY_HOSTCMDS. One command is in flight at a time (MaxAckPending 1),
// so a host's commands are applied in the order they were stored, and a
// command is redelivered before the next one is delivered.
func (t Topology) HostsConsumerConfig() jetstream.ConsumerConfig {
	t = t.WithDefaults()
	return jetstream.ConsumerConfig{
		Durable:       HostsConsumer,
		Description:   "host commands, applied to PROXY_HOSTS",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    t.maxDeliver(),
		MaxAckPending: 1,
	}
}
