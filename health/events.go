package health

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// handle folds one message of PROXY_EVENTS from the consumer of
// generation gen, which calls it from one goroutine at a time.
func (h *Health) handle(gen uint64, msg jetstream.Msg) {
	md, mdErr := msg.Metadata()
	marker := msg.Headers().Get(jetstream.MarkerReasonHeader) != ""
	var ev messages.StateEvent
	var err error
	if !marker {
		ev, err = h.decode(msg.Subject(), msg.Data())
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != h.feedGen {
		return // a consumer replaced since: its successor delivers again
	}
	if mdErr == nil && md.Sequence.Consumer != h.handledConsumerSeq+1 && h.suspect == nil {
		// A delivery skipped: lost in transit. Fold this one, and
		// read the last events again.
		h.suspect, h.suspectAt = fmt.Errorf("%w: delivery %d after %d", errGap, md.Sequence.Consumer, h.handledConsumerSeq), time.Now()
		select {
		case h.check <- struct{}{}:
		default:
		}
	}
	switch {
	case marker:
		// A server-placed marker (an event aged out, if the stream is
		// ever configured to leave markers): nothing to fold.
	case err != nil:
		h.undecodable++
		h.log.Warn("ignoring a state event", "subject", msg.Subject(), "err", err)
	default:
		if h.fold.Apply(ev) {
			if h.caughtUp {
				h.log.Info("rotation changed", "id", ev.ID, "state", ev.State, "ip", ev.IP, "host", ev.Host, "command_id", ev.CommandID, "seq", ev.Seq, "size", h.fold.Len(), "version", h.version)
			}
		} else if h.fold.InGrace(ev.ID) && ev.State != messages.StateRunning {
			h.log.Info("keeping a proxy in the rotation during its grace", "id", ev.ID, "state", ev.State, "seq", ev.Seq, "grace", h.cfg.Grace)
		}
		h.probeIfRisingLocked(ev.ID)
	}
	if mdErr == nil {
		h.handledSeq = max(h.handledSeq, md.Sequence.Stream)
		h.handledConsumer, h.handledConsumerSeq = md.Consumer, md.Sequence.Consumer
		switch {
		case md.NumPending == 0:
			h.caughtUpLocked("no event pending")
		case h.handledSeq >= h.startLastSeq:
			h.caughtUpLocked("reached the stream's last sequence at start")
		}
	}
	h.signal()
}

// decode reads a state event. It is lenient about fields it does not know
// (a newer worker may add some; a health process that dropped every event
// it could not fully read would freeze the rotation) and strict about the
// rest: the version, the size, and the id against the subject's.
func (h *Health) decode(subject string, body []byte) (messages.StateEvent, error) {
	var ev messages.StateEvent
	id, err := h.subj.ParseState(subject)
	if err != nil {
		return ev, err
	}
	if !messages.ValidID(id) {
		return ev, fmt.Errorf("invalid id %q", id)
	}
	if len(body) > messages.MaxBodySize {
		return ev, fmt.Errorf("body of %d bytes, more than %d", len(body), messages.MaxBodySize)
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, fmt.Errorf("malformed: %w", err)
	}
	if ev.V != messages.Version {
		return ev, fmt.Errorf("version %d, want %d", ev.V, messages.Version)
	}
	if ev.ID != id {
		return ev, fmt.Errorf("body id %q does not match the subject's %q", ev.ID, id)
	}
	return ev, nil
}

// signal wakes the loop (to publish) and the checks writer.
func (h *Health) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
	h.signalChecks()
}

// signalChecks wakes the checks writer.
func (h *Health) signalChecks() {
	select {
	case h.checksWake <- struct{}{}:
	default:
	}
}
