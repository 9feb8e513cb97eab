package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Topology sizes the streams, consumers and buckets. See
// docs/ARCHITECTURE.md for why each setting is what it is.
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

func (t Topology) withDefaults() Topology {
	if t.Subjects.Prefix == "" {
		t.Subjects = messages.NewSubjects("")
	}
	if t.Replicas == 0 {
		t.Replicas = 1
	}
	if t.DuplicateWindow == 0 {
		t.DuplicateWindow = 2 * time.Minute
	}
	if t.ResultsMaxAge == 0 {
		t.ResultsMaxAge = 24 * time.Hour
	}
	if t.DeadMaxAge == 0 {
		t.DeadMaxAge = 30 * 24 * time.Hour
	}
	if t.CommandIDMaxAge == 0 {
		t.CommandIDMaxAge = 7 * 24 * time.Hour
	}
	if t.AckWait == 0 {
		t.AckWait = 30 * time.Second
	}
	if t.MaxAttempts == 0 {
		t.MaxAttempts = 8
	}
	if t.PinnedTTL == 0 {
		t.PinnedTTL = 15 * time.Second
	}
	if t.MaxAckPending == 0 {
		t.MaxAckPending = 256
	}
	return t
}

// maxDeliver is the server's backstop: the worker gives up after
// MaxAttempts on its own (failing and dead-lettering the command); the
// server stops redelivering only well after that, in case a handler crashes
// before it can.
func (t Topology) maxDeliver() int { return 2*t.MaxAttempts + 5 }

func (t Topology) streams() []jetstream.StreamConfig {
	s := t.Subjects
	return []jetstream.StreamConfig{{
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
	}}
}

func (t Topology) buckets() []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{
		{Bucket: messages.BucketDesired, Description: "desired state per proxy", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketCommands, Description: "command ids seen, for effect-once", History: 1, TTL: t.CommandIDMaxAge, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketRotation, Description: "the rotation: proxy id to ip:port", History: 1, Storage: jetstream.FileStorage, Replicas: t.Replicas},
		{Bucket: messages.BucketLeases, Description: "leases", History: 1, TTL: time.Minute, Storage: jetstream.FileStorage, Replicas: t.Replicas},
	}
}

func (t Topology) intakeConsumer() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       IntakeConsumer,
		Description:   "validates commands into desired state",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       t.AckWait,
		MaxDeliver:    t.maxDeliver(),
		MaxAckPending: 1024,
	}
}

func (t Topology) workConsumer(host string) jetstream.ConsumerConfig {
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
	}
}

// Ensure creates what is missing and binds what exists. It never updates an
// existing stream or consumer: set-up happens once, and many workers racing
// to rewrite one consumer is a known way to lose its state. A create that
// loses a race to another process binds the winner's.
func (t Topology) Ensure(ctx context.Context, js jetstream.JetStream, hosts []string) error {
	t = t.withDefaults()
	if err := t.EnsureStreams(ctx, js); err != nil {
		return err
	}
	if err := ensureConsumer(ctx, js, messages.StreamCommands, t.intakeConsumer()); err != nil {
		return err
	}
	for _, h := range hosts {
		if err := ensureConsumer(ctx, js, messages.StreamWork, t.workConsumer(h)); err != nil {
			return err
		}
	}
	return nil
}

// EnsureStreams is Ensure without the consumers: what a process that only
// reads and publishes (health) needs to be able to start first.
func (t Topology) EnsureStreams(ctx context.Context, js jetstream.JetStream) error {
	t = t.withDefaults()
	for _, sc := range t.streams() {
		if err := ensureStream(ctx, js, sc); err != nil {
			return err
		}
	}
	for _, kc := range t.buckets() {
		if err := ensureBucket(ctx, js, kc); err != nil {
			return err
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig) error {
	for range 3 {
		_, err := js.Stream(ctx, sc.Name)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("look up stream %s: %w", sc.Name, err)
		}
		_, err = js.CreateStream(ctx, sc)
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			continue // bind what now exists
		}
		return fmt.Errorf("create stream %s: %w", sc.Name, err)
	}
	return fmt.Errorf("stream %s: could not create or bind", sc.Name)
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig) error {
	for range 3 {
		_, err := js.KeyValue(ctx, kc.Bucket)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("look up bucket %s: %w", kc.Bucket, err)
		}
		_, err = js.CreateKeyValue(ctx, kc)
		if err == nil || errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			continue
		}
		return fmt.Errorf("create bucket %s: %w", kc.Bucket, err)
	}
	return fmt.Errorf("bucket %s: could not create or bind", kc.Bucket)
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig) error {
	for range 3 {
		_, err := js.Consumer(ctx, stream, cc.Durable)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("look up consumer %s on %s: %w", cc.Durable, stream, err)
		}
		_, err = js.CreateConsumer(ctx, stream, cc)
		if err == nil || errors.Is(err, jetstream.ErrConsumerExists) {
			continue
		}
		return fmt.Errorf("create consumer %s on %s: %w", cc.Durable, stream, err)
	}
	return fmt.Errorf("consumer %s on %s: could not create or bind", cc.Durable, stream)
}
