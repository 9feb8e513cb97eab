package health

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
)

// Pages: the publishing process answers <prefix>.rotation.get with a page
// of its published view (messages.RotationPage), so that a consumer that
// starts late or saw a gap in the feed reads the whole rotation in
// messages of bounded size. Only a process that serves (it holds the
// lease and has published on it) subscribes: with none, a request finds
// no responders at once.

// Outcomes of page requests (proxyfleet_rotation_pages_total).
const (
	PageServed  = "served"
	PageInvalid = "invalid"
	PageStandby = "standby" // answered by a process that no longer serves
)

var pageResults = []string{PageServed, PageInvalid, PageStandby}

// syncPages subscribes to the page requests while this process serves,
// and unsubscribes when it stops. Called by the loop.
func (h *Health) syncPages() {
	h.mu.Lock()
	serve := h.servingLocked()
	h.mu.Unlock()
	switch {
	case serve && h.pageSub == nil:
		sub, err := h.nc.Subscribe(h.subj.RotationGet(), h.onPage)
		if err != nil {
			h.log.Warn("answering the rotation's pages: subscribe", "subject", h.subj.RotationGet(), "err", err)
			return
		}
		h.pageSub = sub
	case !serve && h.pageSub != nil:
		h.stopPages()
	}
}

func (h *Health) stopPages() {
	if h.pageSub == nil {
		return
	}
	if err := h.pageSub.Unsubscribe(); err != nil && !h.nc.IsClosed() {
		h.log.Warn("answering the rotation's pages: unsubscribe", "subject", h.subj.RotationGet(), "err", err)
	}
	h.pageSub = nil
}

// onPage answers one page request, from the view: O(page) after a binary
// search for its first id.
func (h *Health) onPage(msg *nats.Msg) {
	req, err := messages.DecodeRotationGet(msg.Data)
	var body []byte
	h.mu.Lock()
	switch {
	case err != nil:
		h.pages[PageInvalid]++
		body = pageError(err.Error())
	case !h.servingLocked():
		h.pages[PageStandby]++
		body = pageError("standing by: not the publisher of the rotation")
	default:
		h.pages[PageServed]++
		body, _ = h.view.appendPage(nil, req.After, req.Limit, messages.MaxBodySize)
	}
	h.mu.Unlock()
	if msg.Reply == "" {
		return
	}
	if err := msg.Respond(body); err != nil {
		h.log.Debug("answering a rotation page", "err", err)
	}
}

func pageError(reason string) []byte {
	b, _ := json.Marshal(messages.RotationPage{V: messages.Version, Error: reason})
	return b
}

// snapshot publishes the whole rotation on <prefix>.rotation (the v1
// subject) if it moved since the last one and that one is old enough (see
// snapshotWait), and returns when the next one is due if one waits
// (zero if none). The snapshot costs O(fleet), so the interval bounds its
// cost whatever the churn. One that does not fit in a message (the
// server's max_payload, or SnapshotMaxBytes) is replaced by a notice that
// says so (truncated, the size, the feed's subject), counted, and logged
// at error level once when the rotation stops fitting (and at info level
// once when it fits again): never a silent stale snapshot. The pace is
// the wall clock's, not Config.Now's: it is about load, not the rotation.
func (h *Health) snapshot() time.Time {
	h.mu.Lock()
	if !h.servingLocked() || h.view.version == h.snap.version {
		h.mu.Unlock()
		return time.Time{}
	}
	now := time.Now()
	if due := h.snap.sent.Add(h.snapshotWait()); now.Before(due) {
		h.mu.Unlock()
		return due
	}
	v := h.view
	size, limit := v.snapshotSize(), h.snapshotLimit()
	tooLarge := size > limit
	var body []byte
	if tooLarge {
		body, _ = json.Marshal(messages.Rotation{V: messages.Version, Version: v.version, At: v.at,
			Truncated: true, Size: v.Len(), Bytes: size, Feed: h.subj.RotationChanges()})
	} else {
		body = v.appendSnapshot(make([]byte, 0, size))
	}
	version, n, was := v.version, v.Len(), h.snap.tooLarge
	h.snap.version, h.snap.sent, h.snap.tooLarge, h.snap.bytes, h.snap.sentBytes = version, now, tooLarge, size, len(body)
	h.snap.count++
	if tooLarge {
		h.snap.truncated++
	}
	h.mu.Unlock()
	switch {
	case tooLarge && !was:
		h.log.Error("the rotation no longer fits in one snapshot: "+h.subj.Rotation()+" carries a notice (truncated) instead of the proxies; follow "+h.subj.RotationChanges()+" and "+h.subj.RotationGet(),
			"proxies", n, "bytes", size, "limit", limit, "version", version)
	case !tooLarge && was:
		h.log.Info("the rotation fits in one snapshot again: "+h.subj.Rotation()+" carries the proxies",
			"proxies", n, "bytes", size, "limit", limit, "version", version)
	}
	if err := h.nc.Publish(h.subj.Rotation(), body); err != nil {
		h.mu.Lock()
		h.publishErrors++
		h.snap.version = 0 // try again at the next turn
		h.mu.Unlock()
		h.log.Warn("publishing the rotation's snapshot", "subject", h.subj.Rotation(), "err", err)
	}
	return time.Time{}
}

// snapshotWait is the least time after the last snapshot before the next:
// SnapshotInterval, or the time the last one's bytes take at SnapshotRate
// if longer. A snapshot costs O(fleet) bytes to every subscriber, so in a
// large fleet under churn it goes out less often than the interval (the
// latest version each time), which keeps the subject's bytes a change
// about those of the feed, whose messages carry the changes themselves.
func (h *Health) snapshotWait() time.Duration {
	wait := h.cfg.SnapshotInterval
	if r := h.cfg.SnapshotRate; r > 0 {
		wait = max(wait, time.Duration(float64(h.snap.sentBytes)/float64(r)*float64(time.Second)))
	}
	return wait
}

// snapshotLimit is the largest snapshot published whole: the server's
// max_payload, or SnapshotMaxBytes if smaller.
func (h *Health) snapshotLimit() int {
	limit := int(h.nc.MaxPayload())
	if limit <= 0 {
		limit = 1 << 20 // NATS's default
	}
	if m := h.cfg.SnapshotMaxBytes; m > 0 && m < limit {
		limit = m
	}
	return limit
}

// snapState is what the loop knows of the snapshots it published.
type snapState struct {
	version   uint64    // of the last one
	sent      time.Time // when
	tooLarge  bool      // the last one did not fit: a notice went instead
	bytes     int       // the size of the whole snapshot then
	sentBytes int       // the size of what went out (the notice's, if it did not fit)
	count     uint64    // snapshots published (whole or notices)
	truncated uint64    // of which notices
}
