package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// The observation pass of a host chooses the proxies it looks at by their
// last state events: those of the proxies the host's record holds room
// for, and of the domains listed there. It reads them when it runs, with
// one batched direct get (multi_last, nats-server 2.11+) per
// multiLastBatch of them (multiLast), so a pass costs reads of its own
// host's events only, and nothing at all between passes: no worker
// follows the fleet's events (docs/DECISIONS.md, "Observation reads its
// own host's events").

// multiLastBatch is the most subjects multiLast asks for in one request:
// the server answers at most 1,024 (and refuses a request that matches
// more).
const multiLastBatch = 256

// viewedEvent is what a pass keeps of a proxy's last event.
type viewedEvent struct {
	State string // one of the messages.State constants, or "" for another
	Host  string
	Seq   uint64
	IP    string
}

// lastEvents returns the last event of each of ids that has one.
func (w *Worker) lastEvents(ctx context.Context, ids []string) (map[string]viewedEvent, error) {
	prefix := strings.TrimSuffix(w.subj.StateAll(), ">")
	subjects := make([]string, len(ids))
	for i, id := range ids {
		subjects[i] = w.subj.State(id)
	}
	out := make(map[string]viewedEvent, len(ids))
	err := w.multiLast(ctx, messages.StreamEvents, subjects, func(subject string, _ nats.Header, data []byte) {
		id, ok := strings.CutPrefix(subject, prefix)
		if !ok {
			return
		}
		var ev struct { // the fields a pass uses: the rest is not decoded
			State string `json:"state"`
			Host  string `json:"host"`
			Seq   uint64 `json:"seq"`
			IP    string `json:"ip"`
		}
		if json.Unmarshal(data, &ev) != nil {
			ev.State = "" // on record, but unreadable: not chosen, not looked at as eventless
		}
		out[id] = viewedEvent{State: knownState(ev.State), Host: ev.Host, Seq: ev.Seq, IP: ev.IP}
	})
	if err != nil {
		return nil, fmt.Errorf("read last events: %w", err)
	}
	return out, nil
}

// multiLast asks stream for the last message of each of subjects, in one
// direct get for each multiLastBatch of them, and calls fn with each
// one's subject, headers and body, in the order the server sends them.
// Subjects with no message are left out; none at all is no error.
//
// It is written here rather than taken from orbit.go's jetstreamext, whose
// GetLastMsgsFor makes a synchronous subscription for every request, and
// with it a channel of nats.go's default 65,536 messages (512 KiB), which
// passes being many would make a large share of a worker's allocations
// (docs/DECISIONS.md). Here the channel holds what the request can be
// answered with: a message a subject, and the end.
func (w *Worker) multiLast(ctx context.Context, stream string, subjects []string, fn func(subject string, hdr nats.Header, data []byte)) error {
	for from := 0; from < len(subjects); from += multiLastBatch {
		if err := w.multiLastOnce(ctx, stream, subjects[from:min(from+multiLastBatch, len(subjects))], fn); err != nil {
			return err
		}
	}
	return nil
}

func (w *Worker) multiLastOnce(ctx context.Context, stream string, subjects []string, fn func(subject string, hdr nats.Header, data []byte)) error {
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return err
	}
	nc := w.js.Conn()
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, len(subjects)+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(apiPrefix(w.js)+"DIRECT.GET."+stream, inbox, req); err != nil {
		return err
	}
	ctx, cancel := request(ctx, w.js)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-ch:
			if len(m.Data) == 0 && m.Header.Get("Status") != "" {
				switch status := m.Header.Get("Status"); status {
				case "204": // the end of the batch
					return nil
				case "404": // none of subjects has a message
					return nil
				default:
					return fmt.Errorf("direct get from %s: status %s %s", stream, status, m.Header.Get("Description"))
				}
			}
			subject := m.Header.Get(jetstream.SubjectHeader)
			if subject == "" {
				return fmt.Errorf("direct get from %s: an answer with no subject header", stream)
			}
			fn(subject, m.Header, m.Data)
		}
	}
}

// knownState is s as the messages constant of that state (so no copy of
// it is kept), or "" for a state it does not know.
func knownState(s string) string {
	for _, k := range []string{messages.StateRunning, messages.StateProvisioning, messages.StateFailed, messages.StateDeleting, messages.StateDeleted} {
		if s == k {
			return k
		}
	}
	return ""
}
