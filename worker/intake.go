package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/messages"
)

// Catalog is what intake checks commands against.
type Catalog struct {
	Hosts            []string
	Images           []string
	DefaultImage     string
	DefaultCPUs      int
	DefaultMemoryMiB int
	// MaxProxies is each host's room: intake places no more proxies on a
	// host than this. A host it does not name gets DefaultMaxProxies.
	MaxProxies map[string]int
	// Plans are the address plans of the hosts that have one, by host
	// name: a proxy placed on such a host holds room and slots of the
	// plan (addrplan), and its create configures the addresses the slots
	// give. A host without a plan leaves its proxies' addresses to its
	// network.
	Plans map[string]*addrplan.Plan
}

// DefaultMaxProxies is the room of a host the catalog gives none.
const DefaultMaxProxies = 1000

// maxProxies is host's room.
func (c Catalog) maxProxies(host string) int {
	if n := c.MaxProxies[host]; n > 0 {
		return n
	}
	return DefaultMaxProxies
}

// planConfig is host's address plan as its record shows it, a copy of
// its own (a record may be decoded into it); nil without one.
func (c Catalog) planConfig(host string) *messages.AddrPlan {
	if p := c.Plans[host]; p != nil {
		pc := p.Config()
		return &pc
	}
	return nil
}

func (c Catalog) hasHost(h string) bool  { return slices.Contains(c.Hosts, h) }
func (c Catalog) hasImage(i string) bool { return slices.Contains(c.Images, i) }

// maxCommandIDLen bounds the Nats-Msg-Id a client may set.
const maxCommandIDLen = 256

// commandID is the Nats-Msg-Id header, or one derived from the command's
// stream sequence.
func commandID(msg jetstream.Msg, streamSeq uint64) string {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	return "seq-" + strconv.FormatUint(streamSeq, 10)
}

// intake turns commands into desired state and work items.
type intake struct {
	w *Worker
}

// handle processes one command message. It never returns without acking,
// terminating or naking msg.
func (in *intake) handle(ctx context.Context, msg jetstream.Msg) {
	w := in.w
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error("intake: message without metadata", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	seq := meta.Sequence.Stream
	cmdID := commandID(msg, seq)
	op, sid, err := w.subj.ParseCommand(msg.Subject())
	if err != nil {
		// The stream is bound to the two command patterns, so this is a
		// message we cannot even answer on a per-proxy subject.
		w.log.Error("intake: unexpected subject", "subject", msg.Subject())
		_ = msg.Term()
		return
	}
	res := messages.Result{V: messages.Version, ID: sid, CommandID: cmdID, Op: op}

	rec, ferr := in.validate(op, sid, cmdID, msg.Data())
	if ferr != nil {
		res.Outcome = messages.OutcomeRejected
		res.Field = ferr.Field
		res.Reason = ferr.Reason
		res.Class = "permanent"
		w.log.Info("command rejected", "id", sid, "op", op, "command_id", cmdID, "field", ferr.Field, "reason", ferr.Reason)
		// Answer first, then terminate: a lost answer is worse than a
		// duplicate one (results are deduplicated on command id+outcome).
		if err := w.publishResult(ctx, res); err != nil {
			in.retry(ctx, msg, meta, err)
			return
		}
		_ = msg.Term()
		w.stats.rejected.Add(1)
		return
	}
	rec.Seq = seq
	outcome, field, reason, err := in.apply(ctx, rec, &res)
	if err != nil {
		in.retry(ctx, msg, meta, err)
		return
	}
	if outcome == messages.OutcomeRejected { // no room
		w.log.Info("command rejected", "id", sid, "op", op, "command_id", cmdID, "field", field, "reason", reason)
	}
	if err := msg.Ack(); err != nil {
		w.log.Warn("intake: ack", "id", sid, "err", err)
	}
	if outcome == messages.OutcomeRejected {
		w.stats.rejected.Add(1)
		return
	}
	w.stats.accepted.Add(1)
}

// validate decodes the body and checks it against the catalog.
func (in *intake) validate(op, sid, cmdID string, body []byte) (*messages.Desired, *messages.FieldError) {
	w := in.w
	if len(cmdID) > maxCommandIDLen {
		return nil, &messages.FieldError{Field: "Nats-Msg-Id", Reason: fmt.Sprintf("longer than %d bytes", maxCommandIDLen)}
	}
	d := &messages.Desired{V: messages.Version, ID: sid, Op: op, CommandID: cmdID, At: w.now().UTC()}
	switch op {
	case messages.OpCreate:
		c, err := messages.DecodeCreate(body, sid)
		if err != nil {
			return nil, asFieldError(err)
		}
		if c.Host != "" && !w.catalog.hasHost(c.Host) {
			return nil, &messages.FieldError{Field: "host", Reason: fmt.Sprintf("unknown host %q", c.Host)}
		}
		d.Host = c.Host
		d.Image = c.Image
		if d.Image == "" {
			d.Image = w.catalog.DefaultImage
		}
		if d.Image == "" {
			return nil, &messages.FieldError{Field: "image", Reason: "no image given and no default_image configured"}
		}
		if !w.catalog.hasImage(d.Image) {
			return nil, &messages.FieldError{Field: "image", Reason: fmt.Sprintf("unknown image %q", d.Image)}
		}
		d.CPUs = c.CPUs
		if d.CPUs == 0 {
			d.CPUs = w.catalog.DefaultCPUs
		}
		d.MemoryMiB = c.MemoryMiB
		if d.MemoryMiB == 0 {
			d.MemoryMiB = w.catalog.DefaultMemoryMiB
		}
		d.Labels = c.Labels
	case messages.OpDelete:
		if _, err := messages.DecodeDelete(body, sid); err != nil {
			return nil, asFieldError(err)
		}
	}
	return d, nil
}

func asFieldError(err error) *messages.FieldError {
	if fe, ok := messages.AsFieldError(err); ok {
		return fe
	}
	return &messages.FieldError{Field: "body", Reason: err.Error()}
}

// apply records rec as the desired state unless a newer command is recorded,
// then dispatches work, and answers the command with res (its outcome,
// field and reason filled in). It is idempotent for one command: a
// redelivery finds its own sequence recorded and only dispatches and
// answers again.
//
// A create with no room is rejected (outcome rejected, with the field and
// reason): it records nothing.
//
// The stored writes that follow one another go out together: the command
// id and desired state are read at once, and once the desired state is
// written, the work item, the answer and the command id record are
// published at once and their acks awaited together. None of those three
// needs another first: a redelivery after any of them failed finds the
// desired state of its own sequence and publishes all three again (the
// answer is deduplicated by its message id, the work item collapses into
// one per subject, the command id record says the same again).
func (in *intake) apply(ctx context.Context, rec *messages.Desired, res *messages.Result) (outcome, field, reason string, err error) {
	w := in.w
	key := commandKey(rec.CommandID)
	type entry struct {
		e   jetstream.KeyValueEntry
		err error
	}
	seen := make(chan entry, 1)
	go func() {
		e, err := w.cmdIDs.Get(ctx, key)
		seen <- entry{e, err}
	}()
	first := true
	var cur *messages.Desired
	named := rec.Host // what the command says; placement fills the rest
	for attempt := 0; ; attempt++ {
		if attempt == 16 {
			return "", "", "", fmt.Errorf("write desired state of %s: lost the race 16 times", rec.ID)
		}
		var rev uint64
		cur = nil
		e, err := w.desired.Get(ctx, rec.ID)
		if first {
			// The command id is checked before anything is decided.
			first = false
			s := <-seen
			if s.err == nil {
				var prev commandRecord
				if json.Unmarshal(s.e.Value(), &prev) == nil && prev.Seq != rec.Seq {
					return in.answer(ctx, res, messages.OutcomeSuperseded, "", fmt.Sprintf("duplicate of command %s (sequence %d): no effect", rec.CommandID, prev.Seq))
				}
			} else if !errors.Is(s.err, jetstream.ErrKeyNotFound) {
				return "", "", "", fmt.Errorf("read command id: %w", s.err)
			}
		}
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return "", "", "", fmt.Errorf("read desired state of %s: %w", rec.ID, err)
		default:
			rev = e.Revision()
			cur = new(messages.Desired)
			if err := json.Unmarshal(e.Value(), cur); err != nil {
				return "", "", "", fmt.Errorf("decode desired state of %s: %w", rec.ID, err)
			}
		}
		if cur != nil && cur.Seq > rec.Seq {
			return in.answer(ctx, res, messages.OutcomeSuperseded, "", fmt.Sprintf("command %s (sequence %d) is newer", cur.CommandID, cur.Seq))
		}
		if cur != nil && cur.Seq == rec.Seq {
			rec = cur // a redelivery of a command already recorded
			break
		}
		rec.Host, rec.PrevHost = named, ""
		ferr, err := in.place(ctx, rec, cur)
		if err != nil {
			return "", "", "", fmt.Errorf("place %s: %w", rec.ID, err)
		}
		if ferr != nil {
			return in.answer(ctx, res, messages.OutcomeRejected, ferr.Field, ferr.Reason)
		}
		b, _ := json.Marshal(rec)
		if rev == 0 {
			_, err = w.desired.Create(ctx, rec.ID, b)
		} else {
			_, err = w.desired.Update(ctx, rec.ID, b, rev)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !isWrongLastSeq(err) {
			return "", "", "", fmt.Errorf("write desired state of %s: %w", rec.ID, err)
		}
	}
	hosts := workHosts(rec)
	errs := make([]error, len(hosts)+2)
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() { errs[i] = w.dispatch(ctx, h, rec.ID, rec.Seq) })
	}
	wg.Go(func() {
		b, _ := json.Marshal(commandRecord{ID: rec.ID, Seq: rec.Seq})
		if _, err := w.cmdIDs.Put(ctx, key, b); err != nil {
			errs[len(hosts)] = fmt.Errorf("record command id: %w", err)
		}
	})
	res.Outcome = messages.OutcomeAccepted
	errs[len(hosts)+1] = w.publishResult(ctx, *res)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", "", "", err
	}
	return messages.OutcomeAccepted, "", "", nil
}

// answer publishes res with outcome (and, for a rejection, the field and
// reason) and returns them.
func (in *intake) answer(ctx context.Context, res *messages.Result, outcome, field, reason string) (string, string, string, error) {
	res.Outcome, res.Reason = outcome, reason
	if outcome == messages.OutcomeRejected {
		res.Field, res.Class = field, "permanent"
	}
	if err := in.w.publishResult(ctx, *res); err != nil {
		return "", "", "", err
	}
	return outcome, field, reason, nil
}

// place decides the host of rec given the current record: a create goes
// where placeCreate says, its room reserved there, or is rejected (the
// FieldError) when there is none; a delete goes where the proxy was. A
// proxy that moves leaves PrevHost, so the old host's executor removes it
// there (and releases its room).
func (in *intake) place(ctx context.Context, rec, cur *messages.Desired) (*messages.FieldError, error) {
	hosts := in.w.catalog.Hosts
	curHost := ""
	if cur != nil {
		curHost = cur.Host
		if cur.Host == "" {
			curHost = cur.PrevHost
		}
	}
	switch rec.Op {
	case messages.OpCreate:
		if ferr, err := in.placeCreate(ctx, rec, cur); ferr != nil || err != nil {
			return ferr, err
		}
		rec.SpecHash = specHash(rec.Host, rec.Image, rec.CPUs, rec.MemoryMiB, rec.Labels)
		if curHost != "" && curHost != rec.Host {
			rec.PrevHost = curHost
		}
	case messages.OpDelete:
		rec.Host = curHost
		if rec.Host == "" {
			// Never created through us: its executor still answers,
			// and removes anything of that id it finds.
			rec.Host = pickHost(rec.ID, hosts)
		}
		if cur != nil && cur.PrevHost != "" && cur.PrevHost != rec.Host {
			rec.PrevHost = cur.PrevHost
		}
	}
	return nil, nil
}

// retry hands a command back after a transient failure, or gives up.
func (in *intake) retry(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, cause error) {
	w := in.w
	attempt := int(meta.NumDelivered)
	if ctx.Err() != nil {
		_ = msg.NakWithDelay(w.cfg.Backoff.Delay(1)) // stopping: hand it back
		return
	}
	if attempt >= w.cfg.MaxAttempts {
		w.log.Error("intake: giving up", "subject", msg.Subject(), "attempts", attempt, "err", cause)
		op, id, _ := w.subj.ParseCommand(msg.Subject())
		w.deadLetter(ctx, id, commandID(msg, meta.Sequence.Stream), op, meta.Sequence.Stream, attempt, cause, msg.Data(), time.Time{})
		_ = msg.Term()
		return
	}
	d := w.cfg.Backoff.Delay(attempt)
	w.log.Warn("intake: retrying", "subject", msg.Subject(), "attempt", attempt, "delay", d, "err", cause)
	w.metrics.retries.WithLabelValues(string(classOf(cause)), "intake").Inc()
	_ = msg.NakWithDelay(d)
}

// dispatch enqueues converge work for id on host. The work stream keeps one
// message per subject, so repeated dispatches collapse into one.
func (w *Worker) dispatch(ctx context.Context, host, id string, seq uint64) error {
	m := nats.NewMsg(w.subj.Work(host, id))
	m.Data = []byte(`{"v":1,"id":"` + id + `","seq":` + strconv.FormatUint(seq, 10) + `}`)
	ctx, cancel := request(ctx, w.js)
	defer cancel()
	if _, err := w.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("dispatch %s to %s: %w", id, host, err)
	}
	return nil
}

// publishResult answers a command. The message id makes a redelivered
// command's identical answer a duplicate JetStream drops.
func (w *Worker) publishResult(ctx context.Context, r messages.Result) error {
	return w.answer(ctx, r, time.Time{})
}

// answer is publishResult for a command intake accepted at accepted (zero:
// not timed): an answer the stream stores (not a duplicate of one stored
// before) is observed in commandSeconds, from accepted to its own time.
func (w *Worker) answer(ctx context.Context, r messages.Result, accepted time.Time) error {
	r.V = messages.Version
	r.At = w.now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	ctx, cancel := request(ctx, w.js)
	defer cancel()
	ack, err := w.js.Publish(ctx, w.subj.Result(r.ID), b, jetstream.WithMsgID(r.CommandID+"|"+r.Op+"|"+r.Outcome))
	if err != nil {
		return fmt.Errorf("publish result of %s: %w", r.ID, err)
	}
	w.metrics.commands.WithLabelValues(opLabel(r.Op), r.Outcome).Inc()
	if !accepted.IsZero() && !ack.Duplicate {
		w.metrics.observeCommand(r.Op, r.Outcome, r.At.Sub(accepted))
	}
	return nil
}

// deadLetter records a command that ran out of attempts and answers failed.
func (w *Worker) deadLetter(ctx context.Context, id, cmdID, op string, seq uint64, attempts int, cause error, body []byte, accepted time.Time) {
	dl := messages.DeadLetter{
		V: messages.Version, ID: id, CommandID: cmdID, Op: op, Seq: seq, Attempts: attempts,
		LastError: cause.Error(), Class: string(classOf(cause)), At: w.now().UTC(),
	}
	if json.Valid(body) && len(body) <= messages.MaxBodySize {
		dl.Command = json.RawMessage(body)
	}
	b, _ := json.Marshal(dl)
	pctx, cancel := request(ctx, w.js)
	defer cancel()
	if _, err := w.js.Publish(pctx, w.subj.Dead(id), b, jetstream.WithMsgID(cmdID+"|dead")); err != nil {
		w.log.Error("publish dead letter", "id", id, "err", err)
	}
	w.stats.dead.Add(1)
	w.metrics.dead.WithLabelValues(string(classOf(cause))).Inc()
	if err := w.answer(ctx, messages.Result{ID: id, CommandID: cmdID, Op: op, Outcome: messages.OutcomeFailed,
		Reason: fmt.Sprintf("gave up after %d attempts: %v", attempts, cause), Class: string(classOf(cause))}, accepted); err != nil {
		w.log.Error("publish failed result", "id", id, "err", err)
	}
}
