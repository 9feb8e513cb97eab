package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// The observation pass of a host chooses the proxies it looks at by their
// last state events: those of the proxies the host's record holds room
// for, and of the domains listed there. It reads them when it runs, with
// batched direct gets (jsapi's LastOfEach), so a pass costs reads of its
// own host's events only, and nothing at all between passes: no worker
// follows the fleet's events (docs/DECISIONS.md, "Observation reads its
// own host's events").

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
	err := jsapi.New(w.js).LastOfEach(ctx, messages.StreamEvents, subjects, func(subject string, _ nats.Header, data []byte) {
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
