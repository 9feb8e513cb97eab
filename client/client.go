package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"proxyfleet/messages"
)

// ErrNotFound is returned (wrapped) by Get for a proxy that has neither a
// desired record nor a state event.
var ErrNotFound = errors.New("not found")

// Client talks to a proxyfleet deployment over one NATS connection. It is
// safe for concurrent use.
type Client struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	subj     messages.Subjects
	onResult func(messages.Result)
	rescan   time.Duration // first interval between reads of PROXY_RESULTS while waiting

	permOnce        sync.Once
	desiredReadable bool // whether this user may read PROXY_DESIRED
}

// Bounds of the interval between reads of PROXY_RESULTS while waiting.
const (
	firstRescan = 2 * time.Second
	maxRescan   = 30 * time.Second
)

// Option configures a Client.
type Option func(*Client)

// WithOnResult calls f with every result of a waited-for command as it
// arrives, intermediate ones (accepted) included, so a CLI can print
// progress. f runs on the caller's goroutine, inside Create or Delete.
func WithOnResult(f func(messages.Result)) Option {
	return func(c *Client) { c.onResult = f }
}

// WithJetStream uses js instead of jetstream.New(nc), e.g. for a JetStream
// domain or API prefix. js must be built on the same connection.
func WithJetStream(js jetstream.JetStream) Option {
	return func(c *Client) { c.js = js }
}

// New returns a client on nc for the subjects under prefix (empty means
// messages.DefaultPrefix). Streams and buckets are bound when first used, so
// New succeeds before the topology exists.
func New(nc *nats.Conn, prefix string, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, errors.New("client: nil NATS connection")
	}
	if prefix != "" && !messages.ValidPrefix(prefix) {
		return nil, fmt.Errorf("client: %q is not a valid subject prefix", prefix)
	}
	c := &Client{nc: nc, subj: messages.NewSubjects(prefix), rescan: firstRescan}
	for _, o := range opts {
		o(c)
	}
	if c.js == nil {
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, fmt.Errorf("client: jetstream: %w", err)
		}
		c.js = js
	}
	return c, nil
}

// Subjects returns the subjects the client uses.
func (c *Client) Subjects() messages.Subjects { return c.subj }

// Conn returns the NATS connection the client uses, for a program that
// follows the rotation (package rotation) on the same connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Outcome is what became of one command.
type Outcome struct {
	ID        string `json:"id"`
	Op        string `json:"op"`
	CommandID string `json:"command_id"`
	// Sequence is the command's PROXY_CMDS stream sequence.
	Sequence uint64 `json:"sequence"`
	// Duplicate says JetStream had already stored a command with this
	// command id (within its dedupe window): this publish added nothing,
	// and Sequence is the earlier command's.
	Duplicate bool `json:"duplicate,omitempty"`
	// Results are the results of this command seen while waiting, in
	// arrival order (for a duplicate, those already recorded come first).
	Results []messages.Result `json:"results,omitempty"`
	// Final is the final result (done, failed, rejected or superseded);
	// nil when the command was not waited for or the wait ended first.
	Final *messages.Result `json:"final,omitempty"`
}

// Failed reports whether the command's final outcome is a failure
// (rejected or failed), the case in which a CLI should exit non-zero.
func (o Outcome) Failed() bool { return o.Final != nil && IsFailure(o.Final.Outcome) }

// IsFinal reports whether outcome ends a command: done, failed, rejected or
// superseded. Accepted is intermediate.
func IsFinal(outcome string) bool {
	switch outcome {
	case messages.OutcomeDone, messages.OutcomeFailed, messages.OutcomeRejected, messages.OutcomeSuperseded:
		return true
	}
	return false
}

// IsFailure reports whether outcome is rejected or failed. Superseded is not
// a failure: a newer command decides the proxy's end state.
func IsFailure(outcome string) bool {
	return outcome == messages.OutcomeRejected || outcome == messages.OutcomeFailed
}

// Create publishes cmd (V defaults to messages.Version) with commandID as its
// Nats-Msg-Id, or a fresh id when commandID is empty. With wait it returns
// once the command has a final outcome, or with an error (and the results
// seen so far) when ctx ends first. It waits on a core subscription to
// <prefix>.result.<id>, made before publishing, and also reads PROXY_RESULTS
// (at once for a duplicate, whose answers are not published again; then now
// and then, in case the subscription missed an answer).
//
// The body is checked only as far as it must be to reach intake (the id has
// to be a single subject token); everything else is intake's to judge, so a
// bad command is answered rejected with its field named, like any client's.
func (c *Client) Create(ctx context.Context, cmd messages.CreateCommand, commandID string, wait bool) (Outcome, error) {
	if cmd.V == 0 {
		cmd.V = messages.Version
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return Outcome{}, fmt.Errorf("encode create: %w", err)
	}
	return c.send(ctx, messages.OpCreate, cmd.ID, body, commandID, wait)
}

// Delete publishes a delete of id, like Create.
func (c *Client) Delete(ctx context.Context, id, commandID string, wait bool) (Outcome, error) {
	body, err := json.Marshal(messages.DeleteCommand{V: messages.Version, ID: id})
	if err != nil {
		return Outcome{}, fmt.Errorf("encode delete: %w", err)
	}
	return c.send(ctx, messages.OpDelete, id, body, commandID, wait)
}

// checkToken refuses an id that cannot be one subject token; intake
// validates the rest.
func checkToken(id string) error {
	if id == "" {
		return &messages.FieldError{Field: "id", Reason: "missing"}
	}
	if strings.ContainsAny(id, ".*> \t\r\n") {
		return &messages.FieldError{Field: "id", Reason: fmt.Sprintf("%q cannot be a subject token", id)}
	}
	return nil
}

func (c *Client) send(ctx context.Context, op, id string, body []byte, commandID string, wait bool) (Outcome, error) {
	if err := checkToken(id); err != nil {
		return Outcome{}, err
	}
	return c.sendTo(ctx, target{op: op, id: id, subject: c.subj.Command(op, id), result: c.subj.Result(id), stream: messages.StreamCommands},
		body, commandID, wait)
}

// target is where a command goes and where it is answered: a proxy's
// command to PROXY_CMDS, answered on <prefix>.result.<id>; a pool's to
// PROXY_POOLCMDS, answered on <prefix>.result.pool.<name>.
type target struct {
	op, id          string
	subject, result string
	stream          string
}

func (c *Client) sendTo(ctx context.Context, tg target, body []byte, commandID string, wait bool) (Outcome, error) {
	op, id := tg.op, tg.id
	if commandID == "" {
		commandID = nuid.Next()
	}
	out := Outcome{ID: id, Op: op, CommandID: commandID}

	var sub *nats.Subscription
	if wait {
		// Subscribe before publishing, so no answer can slip past.
		var err error
		if sub, err = c.nc.SubscribeSync(tg.result); err != nil {
			return out, fmt.Errorf("subscribe to results of %s: %w", id, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		// A large backlog on one id must not drop our answer.
		_ = sub.SetPendingLimits(-1, -1)
	}

	m := nats.NewMsg(tg.subject)
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, commandID)
	ack, err := c.js.PublishMsg(ctx, m, jetstream.WithExpectStream(tg.stream))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return out, fmt.Errorf("publish %s of %s: no stream answered (is %s there: has `proxyfleet setup` run?): %w", op, id, tg.stream, err)
	}
	if err != nil {
		return out, fmt.Errorf("publish %s of %s: %w", op, id, err)
	}
	out.Sequence, out.Duplicate = ack.Sequence, ack.Duplicate
	if !wait {
		return out, nil
	}

	seen := map[string]bool{}
	var reused error
	take := func(r messages.Result) bool {
		if r.CommandID != commandID || seen[r.Outcome] {
			return false
		}
		if r.Op != "" && r.Op != op {
			// JetStream dedupes on the command id alone: this id was
			// used for another command of this proxy, and ours was dropped.
			reused = fmt.Errorf("command id %s was already used for a %s of %s (sequence %d): this %s was dropped as a duplicate; use a fresh command id",
				commandID, r.Op, id, out.Sequence, op)
			return true
		}
		seen[r.Outcome] = true
		out.Results = append(out.Results, r)
		if c.onResult != nil {
			c.onResult(r)
		}
		if IsFinal(r.Outcome) && out.Final == nil {
			out.Final = &r
			return true
		}
		return false
	}

	if out.Duplicate {
		// The command was stored before: its answers may be on record
		// already and will not be published again.
		past, err := c.pastResults(ctx, tg.result, id)
		if err != nil {
			return out, err
		}
		for _, r := range past {
			if take(r) {
				return out, reused
			}
		}
	}
	// Answers come on the subscription. A core message can be lost, though
	// (a reconnect while waiting, interest not yet known across a
	// cluster), while PROXY_RESULTS keeps every answer: read it now and
	// then, less often as the wait goes on.
	rescan := c.rescan
	for {
		wctx, cancel := context.WithTimeout(ctx, rescan)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			if past, err := c.pastResults(ctx, tg.result, id); err == nil {
				for _, r := range past {
					if take(r) {
						return out, reused
					}
				}
			}
			rescan = min(2*rescan, maxRescan)
			continue
		}
		if err != nil {
			last := "none yet"
			if n := len(out.Results); n > 0 {
				last = out.Results[n-1].Outcome
			}
			hint := ""
			if out.Duplicate {
				hint = "; JetStream had already stored a command with this id, whose answers may have aged out or be another proxy's"
			}
			return out, fmt.Errorf("waiting for the outcome of %s %s (command %s, last outcome: %s%s): %w", op, id, commandID, last, hint, err)
		}
		var r messages.Result
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			continue // not ours to judge; keep waiting for a readable answer
		}
		if take(r) {
			return out, reused
		}
	}
}

// pastResults reads every result on record for id (on subject) from
// PROXY_RESULTS.
func (c *Client) pastResults(ctx context.Context, subject, id string) ([]messages.Result, error) {
	var out []messages.Result
	err := c.readStream(ctx, messages.StreamResults, subject, jetstream.DeliverAllPolicy, func(m jetstream.Msg) {
		var r messages.Result
		if json.Unmarshal(m.Data(), &r) == nil {
			out = append(out, r)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read past results of %s: %w", id, err)
	}
	return out, nil
}
