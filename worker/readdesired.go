package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/fleet"
	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// Reads of the desired records. A KV get is a direct get that any replica
// of the bucket may answer, and a replica catching up (a node just back)
// answers with an older record or none. Reads that decide a deletion make
// sure they are not behind: the executor against the sequence its work
// item carries, the orphan sweep through the bucket's stream leader.

// ErrDesiredBehind marks a read of a desired record older than the work
// item that asked for it (see readDesiredSince).
var ErrDesiredBehind = errors.New("desired state is behind its work")

// readDesiredSince reads id's desired record and insists it be at least as
// new as seq, the sequence of the command that dispatched the work (0: no
// such claim). KV reads are direct gets any replica may answer, and a
// replica that is catching up (a node just back) answers with an older
// record, or none. Such a read is tried again for a moment (the replica is
// usually current within milliseconds), then reported as ErrDesiredBehind,
// a transient error the caller retries with backoff.
func (w *Worker) readDesiredSince(ctx context.Context, id string, seq uint64) (*messages.Desired, error) {
	const tries, pause = 20, 50 * time.Millisecond
	for try := 1; ; try++ {
		d, err := w.readDesired(ctx, id)
		behind := (err == nil && d.Seq < seq) || (errors.Is(err, jetstream.ErrKeyNotFound) && seq > 0)
		if !behind {
			return d, err
		}
		if try == tries {
			have := uint64(0)
			if d != nil {
				have = d.Seq
			}
			return nil, fleet.Transient(fmt.Errorf("read desired state of %s: sequence %d, its work says %d: %w", id, have, seq, ErrDesiredBehind))
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// workSeq is the command sequence a work item carries (0 when it has none).
func workSeq(body []byte) uint64 {
	var it workItem
	if json.Unmarshal(body, &it) != nil {
		return 0
	}
	return it.Seq
}

func (w *Worker) readDesired(ctx context.Context, id string) (*messages.Desired, error) {
	e, err := w.desired.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fleet.Transient(fmt.Errorf("read desired state of %s: %w", id, err))
	}
	var d messages.Desired
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return nil, fleet.Permanent(fmt.Errorf("decode desired state of %s: %w", id, err))
	}
	return &d, nil
}

// readDesiredFromLeader reads id's desired record through the bucket
// stream's leader, never a replica that may be behind. ErrKeyNotFound when
// there is none (or it was deleted).
func (w *Worker) readDesiredFromLeader(ctx context.Context, id string) (*messages.Desired, error) {
	v, _, err := jsapi.New(w.js).KeyFromLeader(ctx, w.desired.Bucket(), id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, jetstream.ErrKeyNotFound
	case err != nil:
		return nil, fleet.Transient(fmt.Errorf("read desired state of %s from the leader: %w", id, err))
	}
	var d messages.Desired
	if err := json.Unmarshal(v, &d); err != nil {
		return nil, fleet.Permanent(fmt.Errorf("decode desired state of %s: %w", id, err))
	}
	return &d, nil
}
