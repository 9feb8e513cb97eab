package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Pool commands: every controller, active or standing by, consumes
// PROXY_POOLCMDS through the shared durable consumer "pools", one command
// at a time, and applies each to the pool's record with compare-and-set:
// validated (a rejection names the field), ordered by stream sequence (a
// set or delete older than the recorded one is superseded), answered
// accepted on <prefix>.result.pool.<name>. The final answer (done,
// failed) is the active controller's, from its passes: the command waits
// in the record's Pending until then.

// consumeCommands consumes the pool commands until ctx ends, making the
// consumer anew (with a backoff) when it goes or its consume breaks. A
// consumer whose settings the server refuses to change fails it.
func (c *Controller) consumeCommands(ctx context.Context) error {
	wait := c.cfg.CheckInterval / 10
	for {
		err := c.consumeOnce(ctx)
		c.consuming.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		var re *topology.RefusedError
		if errors.As(err, &re) {
			return fmt.Errorf("pools: %w", err)
		}
		if c.nc.IsClosed() {
			return fmt.Errorf("pools: consume commands: %w", nats.ErrConnectionClosed)
		}
		c.log.Error("consuming pool commands broke: consuming anew", "err", err, "retry_in", wait)
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, c.cfg.CheckInterval)
	}
}

func (c *Controller) consumeOnce(ctx context.Context) error {
	cfg := c.cfg.Topology.PoolsConsumerConfig()
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	cons, diffs, err := topology.EnsureConsumer(octx, c.js, messages.StreamPoolCommands, cfg)
	cancel()
	if err != nil {
		return err
	}
	if len(diffs) > 0 {
		c.log.Info("updated the pools' consumer", "changed", topology.JoinDiffs(diffs))
	}
	broke := make(chan error, 1)
	cc, err := cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrConsumerDeleted),
				errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, nats.ErrConnectionClosed),
				errors.Is(err, jetstream.ErrConnectionClosed):
				select {
				case broke <- err:
				default:
				}
			default:
				c.log.Warn("consuming pool commands", "err", err)
			}
		}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	defer func() {
		cc.Stop()
		t := time.NewTimer(opTimeout)
		defer t.Stop()
		select {
		case <-cc.Closed():
		case <-t.C:
		}
	}()
	c.consuming.Store(true)
	c.startOnce.Do(func() { close(c.started) })
	tick := time.NewTicker(c.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-broke:
			return err
		case <-tick.C:
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			_, err := c.js.Consumer(octx, messages.StreamPoolCommands, topology.PoolsConsumer)
			cancel()
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("consumer %s: %w", topology.PoolsConsumer, err)
			}
		}
	}
}

// reply is one answer to a command.
type reply struct{ outcome, field, reason string }

// handle applies one pool command and answers it.
func (c *Controller) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		c.log.Error("a pool command without metadata", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	op, name, err := c.subj.ParsePoolCommand(msg.Subject())
	if err != nil {
		c.log.Error("not a pool command", "err", err)
		_ = msg.Term()
		return
	}
	seq := meta.Sequence.Stream
	cmdID := msg.Headers().Get(jetstream.MsgIDHeader)
	if cmdID == "" {
		cmdID = "seq-" + strconv.FormatUint(seq, 10)
	}
	hctx, cancel := context.WithTimeout(ctx, 4*opTimeout)
	defer cancel()
	replies, err := c.applyCommand(hctx, op, name, msg.Data(), seq, cmdID)
	if err != nil {
		attempt := int(meta.NumDelivered)
		if attempt >= c.cfg.Topology.MaxAttempts || ctx.Err() != nil {
			if ctx.Err() == nil {
				c.log.Error("pool command: giving up", "op", op, "pool", name, "attempts", attempt, "err", err)
				_ = c.answer(hctx, name, messages.PoolPending{CommandID: cmdID, Op: op, Seq: seq}, messages.OutcomeFailed,
					fmt.Sprintf("gave up after %d attempts: %v", attempt, err), c.cfg.Now())
				_ = msg.Term()
				return
			}
			_ = msg.NakWithDelay(0) // stopping: hand it back
			return
		}
		c.log.Warn("pool command: retrying", "op", op, "pool", name, "attempt", attempt, "err", err)
		_ = msg.NakWithDelay(min(time.Duration(attempt)*time.Second, 30*time.Second))
		return
	}
	for _, r := range replies {
		res := messages.Result{V: messages.Version, ID: name, CommandID: cmdID, Op: op, Outcome: r.outcome, Field: r.field,
			Reason: r.reason, At: c.cfg.Now().UTC()}
		if r.outcome == messages.OutcomeRejected {
			res.Class = "permanent"
		}
		if err := c.publishResult(hctx, res); err != nil {
			c.log.Warn("answer a pool command (handing it back)", "op", op, "pool", name, "err", err)
			_ = msg.NakWithDelay(time.Second)
			return
		}
	}
	if len(replies) > 0 && replies[0].outcome == messages.OutcomeRejected {
		_ = msg.Term()
		return
	}
	_ = msg.Ack()
	c.poke()
}

func (c *Controller) publishResult(ctx context.Context, r messages.Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := c.js.Publish(octx, c.subj.PoolResult(r.ID), b, jetstream.WithMsgID(r.CommandID+"|"+r.Op+"|"+r.Outcome)); err != nil {
		return fmt.Errorf("answer %s of pool %s: %w", r.Op, r.ID, err)
	}
	c.metrics.answered(r.Op, r.Outcome)
	return nil
}

// applyCommand decodes, checks and applies one command; a bad one is
// answered rejected, naming the field. An error is NATS trouble, to retry.
func (c *Controller) applyCommand(ctx context.Context, op, name string, body []byte, seq uint64, cmdID string) ([]reply, error) {
	var apply func(cur *messages.PoolRecord) (*messages.PoolRecord, []reply)
	switch op {
	case messages.OpPoolSet:
		set, err := messages.DecodePoolSet(body, name)
		if err == nil {
			err = c.checkSpec(set.Spec)
		}
		if err != nil {
			return rejected(err), nil
		}
		apply = func(cur *messages.PoolRecord) (*messages.PoolRecord, []reply) {
			return c.applySet(cur, set, seq, cmdID)
		}
	case messages.OpPoolDelete:
		if _, err := messages.DecodePoolDelete(body, name); err != nil {
			return rejected(err), nil
		}
		apply = func(cur *messages.PoolRecord) (*messages.PoolRecord, []reply) { return c.applyDelete(cur, seq, cmdID) }
	default:
		rc, err := messages.DecodePoolRecycle(body, name)
		if err != nil {
			return rejected(err), nil
		}
		apply = func(cur *messages.PoolRecord) (*messages.PoolRecord, []reply) {
			return c.applyRecycle(cur, rc, seq, cmdID)
		}
	}
	for range 16 {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		e, err := c.pools.Get(octx, name)
		cancel()
		var cur *messages.PoolRecord
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("read pool %s: %w", name, err)
		default:
			cur, rev = new(messages.PoolRecord), e.Revision()
			if err := json.Unmarshal(e.Value(), cur); err != nil {
				return nil, fmt.Errorf("decode pool %s: %w", name, err)
			}
		}
		next, replies := apply(cur)
		if next == nil {
			return replies, nil // nothing to write
		}
		next.At = c.cfg.Now().UTC()
		b, _ := json.Marshal(next)
		octx, cancel = context.WithTimeout(ctx, opTimeout)
		if cur == nil {
			rev, err = c.pools.Create(octx, name, b)
		} else {
			rev, err = c.pools.Update(octx, name, b, rev)
		}
		cancel()
		if err == nil {
			c.stored(name, next, rev)
			return replies, nil
		}
		if !isConflict(err) {
			return nil, fmt.Errorf("write pool %s: %w", name, err)
		}
	}
	return nil, fmt.Errorf("write pool %s: lost the race 16 times", name)
}

func rejected(err error) []reply {
	if fe, ok := messages.AsFieldError(err); ok {
		return []reply{{messages.OutcomeRejected, fe.Field, fe.Reason}}
	}
	return []reply{{messages.OutcomeRejected, "body", err.Error()}}
}

// checkSpec checks what needs the config: the image and the hosts exist.
func (c *Controller) checkSpec(s messages.PoolSpec) error {
	switch {
	case s.Image == "" && c.cfg.DefaultImage == "" && len(c.cfg.Images) > 0:
		return &messages.FieldError{Field: "spec.image", Reason: "no image given and no default_image configured"}
	case s.Image != "" && len(c.cfg.Images) > 0 && !slices.Contains(c.cfg.Images, s.Image):
		return &messages.FieldError{Field: "spec.image", Reason: fmt.Sprintf("unknown image %q", s.Image)}
	}
	for _, h := range s.Hosts {
		if !slices.ContainsFunc(c.cfg.Hosts, func(x Host) bool { return x.Name == h }) {
			return &messages.FieldError{Field: "spec.hosts", Reason: fmt.Sprintf("unknown host %q", h)}
		}
	}
	return nil
}

// seen answers a command the record says was applied already (delivered
// again: the controller crashed before its ack).
func seen(cur *messages.PoolRecord, seq uint64) bool { return cur != nil && seq <= cur.Applied }

func (c *Controller) applySet(cur *messages.PoolRecord, set messages.PoolSet, seq uint64, cmdID string) (*messages.PoolRecord, []reply) {
	accepted := []reply{{outcome: messages.OutcomeAccepted}}
	switch {
	case cur != nil && cur.Seq > seq:
		return nil, []reply{{outcome: messages.OutcomeSuperseded, reason: fmt.Sprintf("command %s (sequence %d) is newer", cur.CommandID, cur.Seq)}}
	case seen(cur, seq):
		return nil, accepted
	}
	next := &messages.PoolRecord{V: messages.Version, Name: set.Name, State: messages.PoolFilling, StateSince: c.cfg.Now().UTC()}
	if cur != nil {
		next = ptr(cloneRecord(cur))
	}
	minReady, surge, rt := set.Resolved()
	next.Op, next.Seq, next.CommandID, next.Applied = "set", seq, cmdID, seq
	next.Size, next.MinReady, next.Surge = set.Size, minReady, surge
	next.MaxAge, next.ReadyTimeout, next.Spec = set.MaxAge, messages.Duration(rt), set.Spec
	next.RecycleAfterBans = set.RecycleAfterBans
	if next.RecycleAfterBans == 0 {
		// Off: the members found burned are no longer due for it.
		for i := range next.Members {
			next.Members[i].BannedOn = 0
		}
	}
	if next.Failures > 0 && cur != nil && !sameSpec(cur.Spec, set.Spec) {
		next.Failures = 0 // a new spec starts afresh
	}
	next.Pending = append(next.Pending, messages.PoolPending{CommandID: cmdID, Op: messages.OpPoolSet, Seq: seq})
	return next, accepted
}

func (c *Controller) applyDelete(cur *messages.PoolRecord, seq uint64, cmdID string) (*messages.PoolRecord, []reply) {
	accepted := []reply{{outcome: messages.OutcomeAccepted}}
	switch {
	case cur == nil:
		return nil, append(accepted, reply{outcome: messages.OutcomeDone, reason: "no such pool: nothing to delete"})
	case cur.Seq > seq:
		return nil, []reply{{outcome: messages.OutcomeSuperseded, reason: fmt.Sprintf("command %s (sequence %d) is newer", cur.CommandID, cur.Seq)}}
	case seen(cur, seq):
		return nil, accepted
	}
	next := ptr(cloneRecord(cur))
	next.Op, next.Seq, next.CommandID, next.Applied = messages.OpDelete, seq, cmdID, seq
	next.Pending = append(next.Pending, messages.PoolPending{CommandID: cmdID, Op: messages.OpPoolDelete, Seq: seq})
	return next, accepted
}

func (c *Controller) applyRecycle(cur *messages.PoolRecord, rc messages.PoolRecycle, seq uint64, cmdID string) (*messages.PoolRecord, []reply) {
	accepted := []reply{{outcome: messages.OutcomeAccepted}}
	switch {
	case cur == nil:
		return nil, []reply{{messages.OutcomeRejected, "name", fmt.Sprintf("no pool %s", rc.Name)}}
	case seen(cur, seq):
		return nil, accepted
	case cur.Op == messages.OpDelete:
		return nil, []reply{{messages.OutcomeRejected, "name", fmt.Sprintf("pool %s is being deleted", rc.Name)}}
	}
	next := ptr(cloneRecord(cur))
	for _, id := range rc.IDs {
		if m, ok := next.Member(id); !ok || m.Retired != nil {
			return nil, []reply{{messages.OutcomeRejected, "ids", fmt.Sprintf("%s is not a live member of pool %s", id, rc.Name)}}
		}
	}
	for i := range next.Members {
		m := &next.Members[i]
		if m.Retired == nil && (rc.All || slices.Contains(rc.IDs, m.ID)) {
			m.Recycle = cmdID
		}
	}
	next.Applied = seq
	next.Pending = append(next.Pending, messages.PoolPending{CommandID: cmdID, Op: messages.OpPoolRecycle, Seq: seq})
	return next, accepted
}

func sameSpec(a, b messages.PoolSpec) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func ptr[T any](v T) *T { return &v }
