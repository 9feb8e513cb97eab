package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Pools: commands to PROXY_POOLCMDS, answered by the pool controllers on
// <prefix>.result.pool.<name>, and the pools' records in PROXY_POOLS.

// PoolSet publishes cmd (V defaults to messages.Version) like Create: with
// wait it returns once the set is answered done (the pool is at its size,
// in the rotation), failed (the pool is degraded: its creations keep
// failing) or rejected.
func (c *Client) PoolSet(ctx context.Context, cmd messages.PoolSet, commandID string, wait bool) (Outcome, error) {
	if cmd.V == 0 {
		cmd.V = messages.Version
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode pool set: %w", err)
	}
	return c.sendPool(ctx, messages.OpPoolSet, cmd.Name, body, commandID, wait)
}

// PoolDelete publishes a pool delete of name: with wait it returns once
// every member is deleted and the record gone (done).
func (c *Client) PoolDelete(ctx context.Context, name, commandID string, wait bool) (Outcome, error) {
	body, err := json.Marshal(messages.PoolDelete{V: messages.Version, Name: name})
	if err != nil {
		return Outcome{}, fmt.Errorf("encode pool delete: %w", err)
	}
	return c.sendPool(ctx, messages.OpPoolDelete, name, body, commandID, wait)
}

// PoolRecycle publishes a pool recycle: with wait it returns once every
// member it named was replaced and deleted (done).
func (c *Client) PoolRecycle(ctx context.Context, cmd messages.PoolRecycle, commandID string, wait bool) (Outcome, error) {
	if cmd.V == 0 {
		cmd.V = messages.Version
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode pool recycle: %w", err)
	}
	return c.sendPool(ctx, messages.OpPoolRecycle, cmd.Name, body, commandID, wait)
}

func (c *Client) sendPool(ctx context.Context, op, name string, body []byte, commandID string, wait bool) (Outcome, error) {
	if err := checkToken(name); err != nil {
		fe, _ := messages.AsFieldError(err)
		return Outcome{}, &messages.FieldError{Field: "name", Reason: fe.Reason}
	}
	return c.sendTo(ctx, target{op: op, id: name, subject: c.subj.PoolCommand(op, name), result: c.subj.PoolResult(name),
		stream: messages.StreamPoolCommands}, body, commandID, wait)
}

// PoolStatus is a pool's record with its members counted (Summary) and,
// per member, whether it is in the rotation now.
type PoolStatus struct {
	Record  messages.PoolRecord  `json:"record"`
	Summary messages.PoolSummary `json:"summary"`
	// InRotation lists the members in the rotation now.
	InRotation map[string]bool `json:"in_rotation,omitempty"`
}

// ErrPoolNotFound is returned (wrapped) by Pool for a pool with no record.
var ErrPoolNotFound = errors.New("pool not found")

// Pools returns every pool's status, sorted by name.
func (c *Client) Pools(ctx context.Context) ([]PoolStatus, error) {
	kv, err := c.bucket(ctx, messages.BucketPools)
	if err != nil {
		return nil, err
	}
	var recs []messages.PoolRecord
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		var r messages.PoolRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return fmt.Errorf("decode pool %s: %w", e.Key(), err)
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketPools, err)
	}
	in, err := c.rotationIDs(ctx, len(recs) > 0)
	if err != nil {
		return nil, err
	}
	out := make([]PoolStatus, 0, len(recs))
	now := time.Now()
	for _, r := range recs {
		out = append(out, poolStatus(r, in, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Record.Name < out[j].Record.Name })
	return out, nil
}

// Pool returns the status of pool name, or an error wrapping
// ErrPoolNotFound.
func (c *Client) Pool(ctx context.Context, name string) (PoolStatus, error) {
	if !messages.ValidPoolName(name) {
		return PoolStatus{}, &messages.FieldError{Field: "name", Reason: fmt.Sprintf("%q is not a valid pool name", name)}
	}
	kv, err := c.bucket(ctx, messages.BucketPools)
	if err != nil {
		return PoolStatus{}, err
	}
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return PoolStatus{}, fmt.Errorf("pool %s: %w", name, ErrPoolNotFound)
	}
	if err != nil {
		return PoolStatus{}, fmt.Errorf("read pool %s: %w", name, err)
	}
	var r messages.PoolRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return PoolStatus{}, fmt.Errorf("decode pool %s: %w", name, err)
	}
	in, err := c.rotationIDs(ctx, true)
	if err != nil {
		return PoolStatus{}, err
	}
	return poolStatus(r, in, time.Now()), nil
}

func poolStatus(r messages.PoolRecord, in map[string]bool, now time.Time) PoolStatus {
	st := PoolStatus{Record: r, Summary: r.Summary(now, func(id string) bool { return in[id] })}
	for _, m := range r.Members {
		if in[m.ID] {
			if st.InRotation == nil {
				st.InRotation = map[string]bool{}
			}
			st.InRotation[m.ID] = true
		}
	}
	return st
}

// rotationIDs are the ids in PROXY_ROTATION (none read unless need).
func (c *Client) rotationIDs(ctx context.Context, need bool) (map[string]bool, error) {
	in := map[string]bool{}
	if !need {
		return in, nil
	}
	kv, err := c.bucket(ctx, messages.BucketRotation)
	if err != nil {
		return nil, err
	}
	if err := readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error { in[e.Key()] = true; return nil }); err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketRotation, err)
	}
	return in, nil
}
