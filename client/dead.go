package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// DeadEntry is one dead letter of PROXY_DEAD: a command that ran out of
// attempts, and where it is stored.
type DeadEntry struct {
	// Sequence is the dead letter's PROXY_DEAD stream sequence.
	Sequence uint64 `json:"sequence"`
	messages.DeadLetter
}

// ErrNotReplayable is returned (wrapped) by Replay for a dead letter that
// holds no command body, or whose proxy has had a later command.
var ErrNotReplayable = errors.New("not replayable")

// DeadLetters returns every dead letter, oldest first. Reading PROXY_DEAD
// takes a user that may (admin in deploy/nats/accounts.conf).
func (c *Client) DeadLetters(ctx context.Context) ([]DeadEntry, error) {
	var (
		out  []DeadEntry
		derr error
	)
	err := c.readStream(ctx, messages.StreamDead, c.subj.DeadAll(), jetstream.DeliverAllPolicy, func(m jetstream.Msg) {
		var e DeadEntry
		if err := json.Unmarshal(m.Data(), &e.DeadLetter); err != nil {
			derr = errors.Join(derr, fmt.Errorf("decode dead letter on %s: %w", m.Subject(), err))
			return
		}
		if meta, err := m.Metadata(); err == nil {
			e.Sequence = meta.Sequence.Stream
		}
		out = append(out, e)
	})
	if err != nil {
		return nil, err
	}
	return out, derr
}

// Replay publishes the command of dead letter e again as a new command
// (commandID, or a fresh one) and, once it is stored, removes the dead
// letter from PROXY_DEAD, so a replay happens once. Unless force is set,
// it refuses (ErrNotReplayable) a dead letter whose proxy's latest result
// is for another command: a later command decided that proxy, and
// replaying the older one would undo it. With wait it waits for the new
// command's final result, like Create.
func (c *Client) Replay(ctx context.Context, e DeadEntry, commandID string, wait, force bool) (Outcome, error) {
	if len(e.Command) == 0 {
		return Outcome{ID: e.ID, Op: e.Op}, fmt.Errorf("dead letter %d of %s: %w: no command body stored", e.Sequence, e.ID, ErrNotReplayable)
	}
	if !force {
		var last *messages.Result
		if err := lastOn(ctx, c, messages.StreamResults, c.subj.Result(e.ID), &last); err != nil {
			return Outcome{ID: e.ID, Op: e.Op}, fmt.Errorf("read latest result of %s: %w", e.ID, err)
		}
		if last != nil && last.CommandID != e.CommandID {
			return Outcome{ID: e.ID, Op: e.Op}, fmt.Errorf("dead letter %d of %s: %w: a later command (%s %s, %s) decided the proxy",
				e.Sequence, e.ID, ErrNotReplayable, last.Op, last.CommandID, last.Outcome)
		}
	}
	body, err := replayBody(e)
	if err != nil {
		return Outcome{ID: e.ID, Op: e.Op}, err
	}
	out, err := c.send(ctx, e.Op, e.ID, body, commandID, wait)
	if out.Sequence == 0 {
		return out, err // not stored: the dead letter stays
	}
	// Stored: the dead letter goes, even if the wait ended first.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st, derr := c.stream(dctx, messages.StreamDead)
	if derr == nil {
		derr = st.DeleteMsg(dctx, e.Sequence)
	}
	if derr != nil && !errors.Is(derr, jetstream.ErrMsgNotFound) {
		derr = fmt.Errorf("replayed %s %s as command %s, but remove its dead letter %d: %w", e.Op, e.ID, out.CommandID, e.Sequence, derr)
		return out, errors.Join(err, derr)
	}
	return out, err
}

// replayBody is the command to publish for dead letter e. A dead letter
// of intake holds the command as sent; one of the executor holds the
// proxy's desired record, which has the same fields for the spec (and the
// host it was placed on, which the new command keeps).
func replayBody(e DeadEntry) ([]byte, error) {
	var d messages.Desired
	if err := json.Unmarshal(e.Command, &d); err != nil {
		return nil, fmt.Errorf("dead letter %d of %s: %w: decode its command: %v", e.Sequence, e.ID, ErrNotReplayable, err)
	}
	switch e.Op {
	case messages.OpCreate:
		return json.Marshal(messages.CreateCommand{V: messages.Version, ID: e.ID, Host: d.Host, Image: d.Image,
			CPUs: d.CPUs, MemoryMiB: d.MemoryMiB, Labels: d.Labels})
	case messages.OpDelete:
		return json.Marshal(messages.DeleteCommand{V: messages.Version, ID: e.ID})
	}
	return nil, fmt.Errorf("dead letter %d of %s: %w: unknown op %q", e.Sequence, e.ID, ErrNotReplayable, e.Op)
}

// PrintDeadLetters writes one row per dead letter.
func PrintDeadLetters(w io.Writer, es []DeadEntry) error {
	tw := newTab(w)
	fmt.Fprintln(tw, "SEQ\tID\tOP\tCOMMAND\tATTEMPTS\tAT\tLAST ERROR")
	for _, e := range es {
		at := ""
		if !e.At.IsZero() {
			at = e.At.Format(time.RFC3339)
		}
		last := oneLine(e.LastError)
		if e.Class != "" && last != "" && !strings.HasSuffix(last, "("+e.Class+")") {
			last += " (" + e.Class + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Sequence, e.ID, e.Op, e.CommandID, e.Attempts, dash(at), dash(last))
	}
	return tw.Flush()
}
