package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"proxyfleet/messages"
)

// placeCreate decides the host of a create and reserves its room there
// (see room.go): the host it names; or, naming none, the host the proxy is
// placed on already; or the healthy host with the most free room (see
// placeByRoom). A host with no room rejects the create, naming the field
// host.
func (in *intake) placeCreate(ctx context.Context, rec, cur *messages.Desired) (*messages.FieldError, error) {
	w := in.w
	if rec.Host == "" && cur != nil && cur.Op == messages.OpCreate && w.catalog.hasHost(cur.Host) {
		rec.Host = cur.Host // it stays where it is: no new room
	}
	if rec.Host == "" {
		host, ferr, err := w.placeByRoom(ctx, rec.ID, rec.Seq)
		if ferr != nil || err != nil {
			return ferr, err
		}
		rec.Host = host
		return nil, nil
	}
	err := w.reserve(ctx, rec.Host, rec.ID, rec.Seq, false)
	if errors.Is(err, errFull) {
		return &messages.FieldError{Field: "host", Reason: err.Error()}, nil
	}
	return nil, err
}

// placeByRoom reserves room for id on the healthy (not quarantined) host
// with the most free room, ties broken by the rendezvous hash of id and the
// host (so every worker breaks them alike), and returns it. A host that
// holds room for id already comes first: it needs none. With no healthy
// host left with room, the create is rejected, saying so.
func (w *Worker) placeByRoom(ctx context.Context, id string, seq uint64) (string, *messages.FieldError, error) {
	type cand struct {
		host  string
		held  bool // id holds room there already
		free  int
		score uint64
	}
	var cands []cand
	var notes []string
	// The records as the host view has them (it only ranks: each
	// reservation reads the record afresh), or as read now while it is
	// not caught up. A host the view says is full or quarantined is read
	// afresh before it is passed over: a view behind the bucket (made
	// anew, say) must not turn away a create.
	viewed := true
	for _, h := range w.catalog.Hosts {
		room := w.catalog.maxProxies(h)
		rec, err := w.hostView.record(h)
		if err != nil || !viewed || rec.Quarantined() || (!hasKey(rec.Proxies, id) && len(rec.Proxies) >= room) {
			viewed = viewed && err == nil
			if rec, _, err = w.readHost(ctx, h); err != nil {
				return "", nil, err
			}
		}
		_, held := rec.Proxies[id]
		switch {
		case rec.Quarantined():
			notes = append(notes, h+" quarantined")
		case !held && len(rec.Proxies) >= room:
			notes = append(notes, fmt.Sprintf("%s full (%d of %d)", h, len(rec.Proxies), room))
		default:
			cands = append(cands, cand{host: h, held: held, free: room - len(rec.Proxies), score: rendezvous(h, id)})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.held != b.held {
			return a.held
		}
		if a.free != b.free {
			return a.free > b.free
		}
		return a.score > b.score
	})
	for _, c := range cands {
		err := w.reservePlaced(ctx, c.host, id, seq)
		if err == nil {
			return c.host, nil, nil
		}
		var full *fullError
		switch {
		case errors.Is(err, errQuarantined):
			// Quarantined since the view or the read said otherwise.
			notes = append(notes, c.host+" quarantined")
		case errors.As(err, &full):
			// Taken by another intake since it was read.
			notes = append(notes, fmt.Sprintf("%s full (%d of %d)", c.host, full.n, full.maxRoom))
		default:
			return "", nil, err
		}
	}
	sort.Strings(notes)
	return "", &messages.FieldError{Field: "host", Reason: "no room on any healthy host: " + strings.Join(notes, ", ")}, nil
}

// errQuarantined: placement found the host quarantined on its fresh read.
var errQuarantined = errors.New("host quarantined")

// reservePlaced is reserve for a host placement chose from what it read
// before: judged on the record as it is now, a host quarantined meanwhile
// is refused (errQuarantined) as a full one is.
func (w *Worker) reservePlaced(ctx context.Context, host, id string, seq uint64) error {
	return w.updateHost(ctx, host, func(rec *messages.HostRecord) error {
		if rec.Quarantined() {
			return errQuarantined
		}
		return reserveEdit(rec, host, id, seq, w.catalog.maxProxies(host), false)
	})
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}
