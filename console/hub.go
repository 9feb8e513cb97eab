package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"proxyfleet/client"
)

// ringSize is how many recent state events the hub keeps, so that a page
// rendered at one event and streaming from a later moment misses none in
// between (a longer gap sends the page a "reload").
const ringSize = 4096

// subscriberBuffer is how many events a live stream may fall behind
// before the hub drops it (its page then reloads).
const subscriberBuffer = 1024

// hub follows the proxies' state events (one client.Watch, as `watch`
// does) and fans them out to the live streams. Its one goroutine is
// run's caller's.
type hub struct {
	cl   *client.Client
	log  *slog.Logger
	view *proxyView // given every event before the streams; nil: none

	size int // of the ring: ringSize

	mu      sync.Mutex
	last    uint64 // the stream sequence of the newest event seen
	ring    []client.Update
	subs    map[chan client.Update]struct{}
	watched bool // a watch is open: last is current
}

func newHub(cl *client.Client, log *slog.Logger) *hub {
	return &hub{cl: cl, log: log, size: ringSize, subs: map[chan client.Update]struct{}{}}
}

// run follows the events until ctx ends; a watch that fails is opened
// again after a second, and the streams open meanwhile are dropped (their
// pages reload, reading afresh).
func (h *hub) run(ctx context.Context) error {
	for {
		err := h.follow(ctx)
		h.dropAll()
		if ctx.Err() != nil {
			return nil
		}
		h.log.Warn("console: following the state events", "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (h *hub) follow(ctx context.Context) error {
	w, err := h.cl.Watch(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	var start uint64
	for _, u := range w.Initial() {
		start = max(start, u.StreamSeq)
	}
	h.mu.Lock()
	h.last = max(h.last, start)
	h.watched = true
	h.mu.Unlock()
	if h.view != nil {
		// Events may have been missed while no watch was open: the view
		// reads the fleet afresh rather than take them one by one.
		h.view.reread()
	}
	for u := range w.Updates() {
		h.publish(u)
	}
	return w.Err()
}

func (h *hub) publish(u client.Update) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = max(h.last, u.StreamSeq)
	if h.view != nil {
		// Under h.mu: a page that reads position and then the view
		// finds every event up to that position in it.
		h.view.apply(u)
	}
	if len(h.ring) == h.size {
		copy(h.ring, h.ring[1:])
		h.ring = h.ring[:h.size-1]
	}
	h.ring = append(h.ring, u)
	for ch := range h.subs {
		select {
		case ch <- u:
		default: // too far behind: its page reloads
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// position is the stream sequence a page rendered now reflects at least.
func (h *hub) position() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// subscription says how a subscribe went.
type subscription int

const (
	subscribed subscription = iota // the backlog and the channel follow
	notYet                         // no watch is open: try again later
	tooOld                         // events after since are no longer held: read afresh
)

// subscribe returns the events after since (those the hub still holds)
// and a channel of those to come, closed when the subscriber falls too
// far behind or the watch breaks. Without a watch open it is notYet; when
// events after since are no longer held, tooOld. unsubscribe ends it.
func (h *hub) subscribe(since uint64) (backlog []client.Update, ch chan client.Update, st subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.watched {
		return nil, nil, notYet
	}
	if since < h.last && (len(h.ring) == 0 || h.ring[0].StreamSeq > since+1) {
		return nil, nil, tooOld
	}
	for _, u := range h.ring {
		if u.StreamSeq > since {
			backlog = append(backlog, u)
		}
	}
	ch = make(chan client.Update, subscriberBuffer)
	h.subs[ch] = struct{}{}
	return backlog, ch, subscribed
}

func (h *hub) unsubscribe(ch chan client.Update) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

func (h *hub) dropAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watched = false
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
}
