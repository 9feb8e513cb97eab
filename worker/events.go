package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// eventPublisher publishes state events whose per-proxy seq only grows, on
// any number of workers: each publish names the stream sequence of the
// subject's last message it read, and the server refuses it if another
// publish came in between; then it reads again.
//
// What it stored last of each proxy it remembers (see known), so the next
// event of the proxy, most often its own command's next, needs no read:
// the server checks the remembered sequence as it would a read one, and a
// refusal (another publisher came in between) drops it and reads again.
type eventPublisher struct {
	js         jetstream.JetStream
	stream     jetstream.Stream
	subjects   messages.Subjects
	deletedTTL time.Duration
	now        func() time.Time

	mu    sync.Mutex
	known map[string]storedEvent // id → its last event this publisher stored

	// The stream's last sequence, for a proxy's first event, is read once
	// for every publish waiting for it (see lastStreamSeq): reads is the
	// clock that orders the reads of proxies' last events and the
	// stream's; info the read of the stream under way or done last.
	reads  atomic.Uint64
	infoMu sync.Mutex
	info   *streamRead
}

// streamRead is one read of the stream's last sequence; ticket is when it
// began on the publisher's reads clock, done closed once seq or err is set.
type streamRead struct {
	ticket uint64
	done   chan struct{}
	seq    uint64
	err    error
}

// storedEvent is what the next publish of a proxy needs of its last event.
type storedEvent struct {
	streamSeq  uint64 // where it was stored
	seq        uint64 // its seq
	commandSeq uint64
}

// maxKnown bounds the events remembered: past it they are forgotten (and
// read again when needed). A proxy's entry goes with its "deleted" event.
const maxKnown = 1 << 16

func newEventPublisher(ctx context.Context, js jetstream.JetStream, subj messages.Subjects, deletedTTL time.Duration, now func() time.Time) (*eventPublisher, error) {
	st, err := js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("bind stream %s: %w", messages.StreamEvents, err)
	}
	return &eventPublisher{js: js, stream: st, subjects: subj, deletedTTL: deletedTTL, now: now, known: map[string]storedEvent{}}, nil
}

// isWrongLastSeq reports a lost compare-and-set on a subject's last sequence.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// request bounds one request to NATS by js's default timeout, however
// long ctx has. A reply can be lost for good (in a cluster, the request
// reached a node that stopped, and the client reconnected to another at
// once, so the fence does not cut), and a handler's own deadline, such as
// the ready budget of minutes, is far too long to wait for it while
// holding the work item and a slot of the host's pool.
func request(ctx context.Context, js jetstream.JetStream) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, js.Options().DefaultTimeout)
}

// last returns the latest event of id and its stream sequence (0 if none).
func (p *eventPublisher) last(ctx context.Context, id string) (messages.StateEvent, uint64, error) {
	var ev messages.StateEvent
	ctx, cancel := request(ctx, p.js)
	defer cancel()
	raw, err := p.stream.GetLastMsgForSubject(ctx, p.subjects.State(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ev, 0, nil
	}
	if err != nil {
		return ev, 0, fmt.Errorf("read last event of %s: %w", id, err)
	}
	if err := json.Unmarshal(raw.Data, &ev); err != nil {
		return ev, 0, fmt.Errorf("decode last event of %s: %w", id, err)
	}
	return ev, raw.Sequence, nil
}

// errEventSuperseded: the proxy's last event is of a newer command than
// the one being published, which is then not stored.
var errEventSuperseded = errors.New("an event of a newer command is on record")

// Publish sets ev's V, At and Seq and publishes it. An event of an older
// command than the last event's (by CommandSeq) is not published:
// errEventSuperseded. Commands for one proxy may run on two hosts, whose
// owners may be two workers (a create that moves it while its delete
// still runs on the old host), and the old command's last event must not
// land after the new one's: the proxy would look deleted while it runs,
// and nothing would correct it. The compare-and-set makes the check and
// the publish one step.
//
// An event of a proxy this publisher remembers nothing of is sent only
// after the subject's last message was read, never on a guess checked by
// the compare-and-set: a publish JetStream refuses still reaches the core
// subscribers of the subject, and would show them a seq the proxy never
// had (TestCoreSubscribersSeeOnlyStoredEvents).
func (p *eventPublisher) Publish(ctx context.Context, ev messages.StateEvent) (messages.StateEvent, error) {
	ev.V = messages.Version
	ev.At = p.now().UTC()
	var readAt uint64 // when the last read of id's last event returned
	for attempt := 0; attempt < 16; attempt++ {
		prev, ok := p.remembered(ev.ID)
		if !ok || (ev.CommandSeq != 0 && prev.commandSeq > ev.CommandSeq) {
			// Nothing remembered, or a refusal to decide: read what is
			// on record.
			last, lastStreamSeq, err := p.last(ctx, ev.ID)
			if err != nil {
				return ev, err
			}
			readAt = p.reads.Add(1)
			prev = storedEvent{streamSeq: lastStreamSeq, seq: last.Seq, commandSeq: last.CommandSeq}
			if lastStreamSeq != 0 && ev.CommandSeq != 0 && prev.commandSeq > ev.CommandSeq {
				return ev, fmt.Errorf("publish %s event of %s for command %s (sequence %d): %s (sequence %d) has reported: %w",
					ev.State, ev.ID, ev.CommandID, ev.CommandSeq, last.CommandID, last.CommandSeq, errEventSuperseded)
			}
		}
		if prev.streamSeq == 0 {
			// No event on record (never published, or "deleted" aged
			// out): start above every seq this proxy ever had. Every
			// seq is at most the stream sequence it was stored at, and
			// the stream's last sequence only grows.
			last, err := p.lastStreamSeq(ctx, readAt)
			if err != nil {
				return ev, err
			}
			ev.Seq = last + 1
		} else {
			ev.Seq = prev.seq + 1
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return ev, err
		}
		opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(prev.streamSeq)}
		if ev.State == messages.StateDeleted && p.deletedTTL > 0 {
			opts = append(opts, jetstream.WithMsgTTL(p.deletedTTL))
		}
		rctx, cancel := request(ctx, p.js)
		ack, err := p.js.Publish(rctx, p.subjects.State(ev.ID), b, opts...)
		cancel()
		if err == nil {
			p.remember(ev, ack.Sequence)
			return ev, nil
		}
		p.forget(ev.ID) // refused, or not known to be stored
		if !isWrongLastSeq(err) {
			return ev, fmt.Errorf("publish %s event of %s: %w", ev.State, ev.ID, err)
		}
	}
	return ev, fmt.Errorf("publish %s event of %s: lost the race 16 times", ev.State, ev.ID)
}

// lastStreamSeq returns the stream's last sequence as read after after,
// a time on the reads clock: every message stored before then (the
// proxy's events that are gone since, included) has a sequence at most
// that. A publish waits for a read that began after its own read of the
// proxy's last event, and shares it with every other publish that did,
// instead of reading the stream for each: in a burst of creates each
// first event read it (STREAM.INFO, a whole configuration to decode), a
// sixteenth of a worker's CPU and some of the server's.
func (p *eventPublisher) lastStreamSeq(ctx context.Context, after uint64) (uint64, error) {
	for range 16 {
		p.infoMu.Lock()
		r := p.info
		if r != nil && r.ticket > after && !r.failed() {
			p.infoMu.Unlock() // begun after our read: its answer will do
		} else if r != nil && !r.finished() {
			p.infoMu.Unlock() // begun before: wait for it, then begin the next
			select {
			case <-r.done:
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		} else {
			r = &streamRead{ticket: p.reads.Add(1), done: make(chan struct{})}
			p.info = r
			p.infoMu.Unlock()
			rctx, cancel := request(ctx, p.js)
			info, err := p.stream.Info(rctx)
			cancel()
			if err != nil {
				r.err = fmt.Errorf("read stream %s: %w", messages.StreamEvents, err)
			} else {
				r.seq = info.State.LastSeq
			}
			close(r.done)
			return r.seq, r.err
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if r.err == nil {
			return r.seq, nil
		}
		// Its reader failed (its own deadline, say): begin one of our own.
	}
	return 0, fmt.Errorf("read stream %s: every read failed", messages.StreamEvents)
}

// failed reports a read that ended with an error.
func (r *streamRead) failed() bool { return r.finished() && r.err != nil }

func (r *streamRead) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (p *eventPublisher) remembered(id string) (storedEvent, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.known[id]
	return s, ok
}

// remember notes ev, stored at streamSeq, as id's last event; a "deleted"
// one is forgotten instead (it ages out of the stream).
func (p *eventPublisher) remember(ev messages.StateEvent, streamSeq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ev.State == messages.StateDeleted {
		delete(p.known, ev.ID)
		return
	}
	if len(p.known) >= maxKnown {
		clear(p.known)
	}
	p.known[ev.ID] = storedEvent{streamSeq: streamSeq, seq: ev.Seq, commandSeq: ev.CommandSeq}
}

func (p *eventPublisher) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.known, id)
}
