package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Host commands: every worker running intake consumes PROXY_HOSTCMDS
// through the shared durable consumer "hosts", one command at a time, and
// applies each to the host's record in PROXY_HOSTS through the host's
// writer (compare-and-set on the record's revision, like every change of
// it). The receiver need not own the host: the record is where the
// quarantine lives, placement on every worker skips a quarantined host at
// once (its host view follows the bucket), and the host's owner takes the
// change into its guard from its own view of the record (quarantine.go),
// holding or releasing the host's work. A command is answered accepted,
// then done, on <prefix>.result.host.<host>; a bad one rejected, naming
// the field.

// hostCommands handles the messages of PROXY_HOSTCMDS.
type hostCommands struct{ w *Worker }

func (hc *hostCommands) handle(ctx context.Context, msg jetstream.Msg) {
	w := hc.w
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error("host command without metadata", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	op, host, err := w.subj.ParseHostCommand(msg.Subject())
	if err != nil {
		w.log.Error("not a host command", "err", err)
		_ = msg.Term()
		return
	}
	cmdID := commandID(msg, meta.Sequence.Stream)
	res := messages.Result{V: messages.Version, ID: host, CommandID: cmdID, Op: op}
	cmd, err := messages.DecodeHostCommand(msg.Data(), host)
	if err == nil && !slices.Contains(w.catalog.Hosts, host) {
		err = &messages.FieldError{Field: "host", Reason: fmt.Sprintf("unknown host %q", host)}
	}
	if err != nil {
		res.Outcome, res.Class = messages.OutcomeRejected, "permanent"
		res.Field, res.Reason = "body", err.Error()
		if fe, ok := messages.AsFieldError(err); ok {
			res.Field, res.Reason = fe.Field, fe.Reason
		}
		w.log.Info("host command rejected", "host", host, "op", op, "command_id", cmdID, "field", res.Field, "reason", res.Reason)
		if err := hc.publish(ctx, res); err != nil {
			hc.retry(ctx, msg, meta, err)
			return
		}
		_ = msg.Term()
		return
	}
	res.Outcome = messages.OutcomeAccepted
	if err := hc.publish(ctx, res); err != nil {
		hc.retry(ctx, msg, meta, err)
		return
	}
	note, err := hc.apply(ctx, op, cmd)
	if err != nil {
		hc.retry(ctx, msg, meta, err)
		return
	}
	w.log.Warn("host command applied", "host", host, "op", op, "command_id", cmdID, "result", note, "reason", cmd.Reason, "by", cmd.By)
	res.Outcome, res.Reason = messages.OutcomeDone, note
	if err := hc.publish(ctx, res); err != nil {
		hc.retry(ctx, msg, meta, err)
		return
	}
	_ = msg.Ack()
}

// apply writes cmd into the host's record and says what it did. An
// operator's quarantine has no cool-down (Until zero: no probe ends it);
// a release ends any quarantine, an automatic one too.
func (hc *hostCommands) apply(ctx context.Context, op string, cmd messages.HostCommand) (string, error) {
	w := hc.w
	now := w.now().UTC()
	var note string
	err := w.updateHost(ctx, cmd.Host, func(rec *messages.HostRecord) error {
		switch op {
		case messages.OpHostQuarantine:
			reason := cmd.RecordReason()
			if rec.Manual() && rec.Reason == reason {
				note = "quarantined already"
				return errNoChange
			}
			since := now
			if rec.Manual() {
				since = rec.Since // the same quarantine, its reason changed
			}
			rec.State, rec.Since, rec.Until, rec.CoolDownMS, rec.Reason = messages.HostQuarantined, since, time.Time{}, 0, reason
			note = "quarantined until released"
		default:
			if !rec.Quarantined() {
				note = "not quarantined"
				return errNoChange
			}
			note = "released"
			if !rec.Manual() {
				note = "released from its automatic quarantine"
			}
			rec.State, rec.Since, rec.Until, rec.CoolDownMS, rec.Reason = messages.HostOK, now, time.Time{}, 0, ""
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%s of host %s: %w", op, cmd.Host, err)
	}
	return note, nil
}

// publish answers a host command. The message id makes a redelivered
// command's identical answer a duplicate JetStream drops.
func (hc *hostCommands) publish(ctx context.Context, r messages.Result) error {
	w := hc.w
	r.At = w.now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	pctx, cancel := request(ctx, w.js)
	defer cancel()
	if _, err := w.js.Publish(pctx, w.subj.HostResult(r.ID), b, jetstream.WithMsgID(r.CommandID+"|"+r.Op+"|"+r.Outcome)); err != nil {
		return fmt.Errorf("answer %s of host %s: %w", r.Op, r.ID, err)
	}
	w.metrics.commands.WithLabelValues(opLabel(r.Op), r.Outcome).Inc()
	return nil
}

// retry hands a command back after a NATS failure, with backoff; after
// MaxAttempts it is answered failed and dropped (a host command changes
// no proxy: it has no dead letter).
func (hc *hostCommands) retry(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, cause error) {
	w := hc.w
	attempt := int(meta.NumDelivered)
	if ctx.Err() != nil {
		_ = msg.NakWithDelay(w.cfg.Backoff.Delay(1)) // stopping: hand it back
		return
	}
	if attempt >= w.cfg.MaxAttempts {
		op, host, _ := w.subj.ParseHostCommand(msg.Subject())
		w.log.Error("host command: giving up", "subject", msg.Subject(), "attempts", attempt, "err", cause)
		_ = hc.publish(ctx, messages.Result{V: messages.Version, ID: host, CommandID: commandID(msg, meta.Sequence.Stream), Op: op,
			Outcome: messages.OutcomeFailed, Reason: fmt.Sprintf("gave up after %d attempts: %v", attempt, cause), Class: string(classOf(cause))})
		_ = msg.Term()
		return
	}
	d := w.cfg.Backoff.Delay(attempt)
	w.log.Warn("host command: retrying", "subject", msg.Subject(), "attempt", attempt, "delay", d, "err", cause)
	_ = msg.NakWithDelay(d)
}
