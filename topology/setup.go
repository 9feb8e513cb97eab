package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// Diff is one setting whose value on the server (Have) is not the one the
// config asks for (Want). Field is named as JetStream names it.
type Diff struct {
	Field, Have, Want string
}

func (d Diff) String() string { return d.Field + " " + d.Have + " → " + d.Want }

// JoinDiffs lists ds for a log line or an error: "field have → want, …".
func JoinDiffs(ds []Diff) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ", ")
}

// Change is what Setup did to one stream or bucket.
type Change struct {
	Kind    string // "stream" or "bucket"
	Name    string
	Created bool
	// FirstSeq is the first sequence of a created stream, when set above 1.
	FirstSeq uint64
	// Updated lists the settings changed in place.
	Updated []Diff
}

func (c Change) String() string {
	if c.Created {
		s := "created " + c.Kind + " " + c.Name
		if c.FirstSeq > 1 {
			s += fmt.Sprintf(" (first sequence %d)", c.FirstSeq)
		}
		return s
	}
	return "updated " + c.Kind + " " + c.Name + ": " + JoinDiffs(c.Updated)
}

// RefusedError is a setting the server would not change in place (a stream's
// storage or retention, a consumer's ack policy...).
type RefusedError struct {
	Kind, Name string
	Refused    []Diff
	Err        error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s %s: the server refused to change %s: %v", e.Kind, e.Name, JoinDiffs(e.Refused), e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// MismatchError is a stream, bucket or consumer whose settings are not the
// ones a process's config expects, and which that process may not change.
type MismatchError struct {
	Kind, Name string
	Diffs      []Diff
	Hint       string
}

func (e *MismatchError) Error() string {
	s := fmt.Sprintf("%s %s differs from the config: %s", e.Kind, e.Name, JoinDiffs(e.Diffs))
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// FirstSeqMargin is added above the last sequence a repairer saw of a
// stream or bucket it recreates: messages stored after its last look and
// before the deletion had sequences it did not see, and the sequences of the
// new stream must start above all of them.
const FirstSeqMargin = 1 << 20

// Setup creates every stream and bucket of t that is missing and updates, in
// place, the settings of each that differs from t. It returns what it
// changed. A setting the server refuses to change in place is returned as a
// *RefusedError naming it (joined with any others); Setup goes on with the
// other streams and buckets. It needs an admin credential.
func (t Topology) Setup(ctx context.Context, js jetstream.JetStream) ([]Change, error) {
	return t.setup(ctx, js, nil)
}

// setup is Setup; floors gives, by stream name (KV_<bucket> for a bucket),
// a sequence the first sequence of a stream it creates must be above.
func (t Topology) setup(ctx context.Context, js jetstream.JetStream, floors map[string]uint64) ([]Change, error) {
	t = t.WithDefaults()
	var changes []Change
	var errs []error
	for _, sc := range t.Streams() {
		c, err := setupStream(ctx, js, sc, func() (uint64, error) { return firstSeq(ctx, js, sc.Name, floors[sc.Name]) })
		if c != nil {
			changes = append(changes, *c)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, kc := range t.Buckets() {
		name := BucketStream(kc.Bucket)
		c, err := setupBucket(ctx, js, kc, func() (uint64, error) { return firstSeq(ctx, js, name, floors[name]) })
		if c != nil {
			changes = append(changes, *c)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return changes, errors.Join(errs...)
}

// firstSeq is the first sequence to create stream name with: above floor,
// and for PROXY_CMDS above the sequence of every command recorded in
// PROXY_DESIRED (intake answers a command with a lower sequence than the
// recorded one "superseded", so a new PROXY_CMDS starting at 1 would have
// every later command of a known proxy ignored). 0 means the default.
func firstSeq(ctx context.Context, js jetstream.JetStream, name string, floor uint64) (uint64, error) {
	if name == messages.StreamCommands {
		seq, err := maxDesiredSeq(ctx, js)
		if err != nil {
			return 0, err
		}
		floor = max(floor, seq)
	}
	if name == messages.StreamPoolCommands {
		seq, err := maxPoolSeq(ctx, js)
		if err != nil {
			return 0, err
		}
		floor = max(floor, seq)
	}
	if floor == 0 {
		return 0, nil
	}
	return floor + FirstSeqMargin, nil
}

// maxDesiredSeq is the highest command sequence recorded in PROXY_DESIRED
// (0 if it is empty or missing).
func maxDesiredSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	return maxRecordSeq(ctx, js, messages.BucketDesired)
}

// maxRecordSeq is the highest "seq" (or "applied") of the JSON records in
// bucket (0 if it is empty or missing).
func maxRecordSeq(ctx context.Context, js jetstream.JetStream, bucket string) (uint64, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("bind bucket %s: %w", bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, fmt.Errorf("read bucket %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var top uint64
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return 0, fmt.Errorf("read bucket %s: watcher closed", bucket)
			}
			if e == nil {
				return top, nil
			}
			var d struct {
				Seq     uint64 `json:"seq"`
				Applied uint64 `json:"applied"` // a pool record's
			}
			if json.Unmarshal(e.Value(), &d) == nil {
				top = max(top, d.Seq, d.Applied)
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("read bucket %s: %w", bucket, ctx.Err())
		}
	}
}

// setupStream creates want, or updates what differs. first is asked for the
// first sequence only when the stream is created.
func setupStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, first func() (uint64, error)) (*Change, error) {
	for range 3 {
		st, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			sc := want
			if sc.FirstSeq, err = first(); err != nil {
				return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
			}
			_, err = js.CreateStream(ctx, sc)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				continue // created meanwhile: compare what is there
			}
			if err != nil {
				return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
			}
			return &Change{Kind: "stream", Name: want.Name, Created: true, FirstSeq: sc.FirstSeq}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
		}
		return updateStream(ctx, js, "stream", want.Name, st.CachedInfo().Config, want, streamFields)
	}
	return nil, fmt.Errorf("stream %s: created and deleted under us three times", want.Name)
}

func updateStream(ctx context.Context, js jetstream.JetStream, kind, name string, have, want jetstream.StreamConfig, fields []field[jetstream.StreamConfig]) (*Change, error) {
	fds := diffConfig(fields, &have, &want)
	if len(fds) == 0 {
		return nil, nil
	}
	cur := have
	applied, refused, err := applyDiffs(fds, func(fds []fieldDiff[jetstream.StreamConfig]) error {
		cfg := cur
		for _, fd := range fds {
			fd.f.set(&cfg, &want)
		}
		st, err := js.UpdateStream(ctx, cfg)
		if err == nil {
			cur = st.CachedInfo().Config
		}
		return err
	})
	var c *Change
	if len(applied) > 0 {
		c = &Change{Kind: kind, Name: name, Updated: applied}
	}
	if len(refused) > 0 {
		return c, &RefusedError{Kind: kind, Name: name, Refused: refused, Err: err}
	}
	return c, nil
}

// kvStreamConfig is the stream behind bucket kc, as jetstream's
// CreateKeyValue makes it (so that KeyValue binds it), with first sequence
// first (0: the default).
func kvStreamConfig(kc jetstream.KeyValueConfig, first uint64) jetstream.StreamConfig {
	dup := 2 * time.Minute
	if kc.TTL > 0 && kc.TTL < dup {
		dup = kc.TTL
	}
	return jetstream.StreamConfig{
		Name:              BucketStream(kc.Bucket),
		Description:       kc.Description,
		Subjects:          []string{jsapi.KeysFilter(kc.Bucket)},
		MaxMsgsPerSubject: int64(max(kc.History, 1)),
		MaxBytes:          -1,
		MaxAge:            kc.TTL,
		MaxMsgSize:        -1,
		Storage:           kc.Storage,
		Replicas:          max(kc.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        dup,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
		FirstSeq:          first,
		// A bucket whose keys carry their own TTL (LimitMarkerTTL), as
		// jetstream's CreateKeyValue makes it.
		AllowMsgTTL:            kc.LimitMarkerTTL > 0,
		SubjectDeleteMarkerTTL: kc.LimitMarkerTTL,
	}
}

// setupBucket creates bucket kc, or updates what differs. first is asked
// for the first sequence only when the bucket is created.
func setupBucket(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig, first func() (uint64, error)) (*Change, error) {
	for range 3 {
		st, err := js.Stream(ctx, BucketStream(kc.Bucket))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			seq, err := first()
			if err != nil {
				return nil, fmt.Errorf("create bucket %s: %w", kc.Bucket, err)
			}
			_, err = js.CreateStream(ctx, kvStreamConfig(kc, seq))
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("create bucket %s: %w", kc.Bucket, err)
			}
			return &Change{Kind: "bucket", Name: kc.Bucket, Created: true, FirstSeq: seq}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("look up bucket %s: %w", kc.Bucket, err)
		}
		return updateStream(ctx, js, "bucket", kc.Bucket, st.CachedInfo().Config, BucketStreamConfig(kc), bucketFields)
	}
	return nil, fmt.Errorf("bucket %s: created and deleted under us three times", kc.Bucket)
}

// EnsureConsumer creates want on stream, or updates the settings of the
// existing one that differ. It returns the consumer and what it changed; a
// setting the server refuses to change is a *RefusedError naming it, and
// the consumer is then left as it was.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) (jetstream.Consumer, []Diff, error) {
	for range 3 {
		cons, err := js.Consumer(ctx, stream, want.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			cons, err = js.CreateConsumer(ctx, stream, want)
			if errors.Is(err, jetstream.ErrConsumerExists) {
				continue // another worker made it: compare
			}
			if err != nil {
				if _, lerr := js.Consumer(ctx, stream, want.Durable); lerr == nil {
					continue // lost a race the server reported otherwise ("error creating store")
				}
				return nil, nil, fmt.Errorf("create consumer %s on %s: %w", want.Durable, stream, err)
			}
			return cons, nil, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("look up consumer %s on %s: %w", want.Durable, stream, err)
		}
		have := cons.CachedInfo().Config
		fds := diffConfig(consumerFields, &have, &want)
		if len(fds) == 0 {
			return cons, nil, nil
		}
		cur := have
		applied, refused, err := applyDiffs(fds, func(fds []fieldDiff[jetstream.ConsumerConfig]) error {
			cfg := cur
			for _, fd := range fds {
				fd.f.set(&cfg, &want)
			}
			c, err := js.UpdateConsumer(ctx, stream, cfg)
			if err == nil {
				cons, cur = c, c.CachedInfo().Config
			}
			return err
		})
		if len(refused) > 0 {
			return cons, applied, &RefusedError{Kind: "consumer", Name: stream + " " + want.Durable, Refused: refused, Err: err}
		}
		return cons, applied, nil
	}
	return nil, nil, fmt.Errorf("consumer %s on %s: created and deleted under us three times", want.Durable, stream)
}
