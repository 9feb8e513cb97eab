package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/synadia-io/orbit.go/jetstreamext"

	"proxyfleet/messages"
)

// The observation pass of a host chooses the proxies it looks at by their
// last state events: those of the proxies the host's record holds room
// for, and of the domains listed there. It reads them when it runs, with
// one batched direct get (multi_last, nats-server 2.11+) per
// lastEventsBatch of them, so a pass costs reads of its own host's events
// only, and nothing at all between passes.
//
// Before, every worker followed every event of the fleet (an ordered
// consumer on proxy.state.>) to keep such a view: with ten workers that
// was ten deliveries of each event, most of the messages the server sent
// in a burst of creates (22 of the 76 a create cost at 12,000 proxies),
// and each host a worker came to pull made it read the last event of the
// whole fleet again.

// lastEventsBatch is the most subjects asked for in one request: the
// server answers at most 1,024 (and refuses a request that matches more).
const lastEventsBatch = 256

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
	out := make(map[string]viewedEvent, len(ids))
	for from := 0; from < len(ids); from += lastEventsBatch {
		part := ids[from:min(from+lastEventsBatch, len(ids))]
		subjects := make([]string, len(part))
		for i, id := range part {
			subjects[i] = w.subj.State(id)
		}
		rctx, cancel := request(ctx, w.js)
		msgs, err := jetstreamext.GetLastMsgsFor(rctx, w.js, messages.StreamEvents, subjects)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("read last events: %w", err)
		}
		for m, err := range msgs {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break // none of these has an event
			}
			if err != nil {
				cancel()
				return nil, fmt.Errorf("read last events: %w", err)
			}
			id, ok := strings.CutPrefix(m.Subject, prefix)
			if !ok {
				continue
			}
			var ev struct { // the fields a pass uses: the rest is not decoded
				State string `json:"state"`
				Host  string `json:"host"`
				Seq   uint64 `json:"seq"`
				IP    string `json:"ip"`
			}
			if json.Unmarshal(m.Data, &ev) != nil {
				ev.State = "" // on record, but unreadable: not chosen, not looked at as eventless
			}
			out[id] = viewedEvent{State: knownState(ev.State), Host: ev.Host, Seq: ev.Seq, IP: ev.IP}
		}
		cancel()
	}
	return out, nil
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
