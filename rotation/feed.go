package rotation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
)

// The protocol of the rotation's pages and feed (see the package doc and
// messages.RotationChanges), written once: a Rotation follows it into its
// index, Read into the entries of one read.

// holder is what the protocol reads the pages and applies the changes
// into.
type holder interface {
	// put records e, read by the read of the pages numbered gen (or by a
	// message after it).
	put(e messages.RotationEntry, gen uint64)
	del(id string)
	// sweep drops the entries that the read numbered gen did not find.
	sweep(gen uint64)
	size() int
}

// feed is the state of the protocol: the versions read and held.
type feed struct {
	first   uint64 // the first page's version, of the last read of the pages
	exact   uint64 // the last page's version: from there on the entries are the rotation at version
	version uint64 // the version held
	gen     uint64 // the number of the last read of the pages
}

// readPages reads the whole rotation in pages (each at a version no
// earlier than the one before: the rotation may move on between them)
// into h, drops the entries no page had, and says how many pages it read.
// It then holds the first page's version; the messages after it that the
// caller kept since it subscribed are to be applied (apply): because each
// change is the whole state of one proxy, the result is exactly the
// rotation at the last version applied once that reaches the last page's.
func (f *feed) readPages(ctx context.Context, page func(ctx context.Context, after string) (messages.RotationPage, error), h holder) (int, error) {
	f.gen++
	var first, last uint64
	after, n := "", 0
	for {
		p, err := page(ctx, after)
		if err != nil {
			return n, err
		}
		if n > 0 && p.Version < last {
			return n, fmt.Errorf("%w: a page at version %d after one at %d", errReset, p.Version, last)
		}
		if n == 0 {
			first = p.Version
		}
		last = p.Version
		n++
		for _, e := range p.Proxies {
			h.put(e, f.gen)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	h.sweep(f.gen)
	f.first, f.exact, f.version = first, last, first
	return n, nil
}

// apply applies the feed's messages to h in order: those at or before the
// version held are known already (or heartbeats); each other one must
// follow the version held, else it is a gap (or, from a new publisher, a
// reset) and nothing more is applied. Once the version held is at least
// the last page's, the number of entries must be the message's size. A
// message that does not decode is passed to skip and left out.
func (f *feed) apply(msgs []*nats.Msg, h holder, skip func(error)) error {
	for _, msg := range msgs {
		m, err := messages.DecodeRotationChanges(msg.Data)
		if err != nil {
			skip(err)
			continue
		}
		switch {
		case m.Version <= f.version:
			continue
		case m.Prev == 0:
			return fmt.Errorf("%w (version %d)", errReset, m.Version)
		case m.Prev != f.version:
			return fmt.Errorf("%w: version %d follows %d, this process holds %d", errGap, m.Version, m.Prev, f.version)
		}
		for _, c := range m.Changes {
			if c.Op == messages.ChangeLeft {
				h.del(c.ID)
			} else {
				h.put(*c.Proxy, f.gen)
			}
		}
		f.version = m.Version
		if size := h.size(); f.version >= f.exact && size != m.Size {
			return fmt.Errorf("%w: %d proxies at version %d, the publisher has %d", errGap, size, m.Version, m.Size)
		}
	}
	return nil
}

// indexHolder is a Rotation's index as the protocol's holder: each change
// under the Rotation's lock, counted and told to Changed's waiters.
type indexHolder struct{ r *Rotation }

func (h indexHolder) put(e messages.RotationEntry, gen uint64) {
	h.r.mu.Lock()
	if h.r.idx.put(proxyOf(e), gen) {
		h.r.changedLocked()
	}
	h.r.mu.Unlock()
}

func (h indexHolder) del(id string) {
	h.r.mu.Lock()
	if h.r.idx.del(id) {
		h.r.changedLocked()
	}
	h.r.mu.Unlock()
}

func (h indexHolder) sweep(gen uint64) {
	h.r.mu.Lock()
	for range h.r.idx.sweep(gen) {
		h.r.changedLocked()
	}
	h.r.mu.Unlock()
}

func (h indexHolder) size() int {
	h.r.mu.RLock()
	defer h.r.mu.RUnlock()
	return len(h.r.idx.all.items)
}

// entries is the holder of one Read: the entries by id, each with the
// read that found it.
type entries map[string]entry

type entry struct {
	e   messages.RotationEntry
	gen uint64
}

func (m entries) put(e messages.RotationEntry, gen uint64) { m[e.ID] = entry{e, gen} }
func (m entries) del(id string)                            { delete(m, id) }
func (m entries) size() int                                { return len(m) }

func (m entries) sweep(gen uint64) {
	for id, en := range m {
		if en.gen != gen {
			delete(m, id)
		}
	}
}

// Bounds of a Read.
const (
	// readPageTimeout bounds the wait for one page.
	readPageTimeout = 5 * time.Second
	// readFeedWait bounds the wait for the feed's messages up to the last
	// page's version, which the publisher sends as it answers.
	readFeedWait = 3 * time.Second
	// readAttempts is how many times a Read reads the rotation whole
	// before it reports a gap.
	readAttempts = 3
)

// Read reads the rotation once, exactly as the publishing health process
// has it at one version (its own), by the protocol a Rotation follows: it
// subscribes to the feed, reads the pages, then applies the feed's
// messages after the first page's version until it holds at least the
// last page's (waiting for them at most 3 s). A gap in the feed or a new
// publisher reads it again, up to three times. Proxies are sorted by id;
// At is when it was read.
//
// When no health process answers (none runs, or none holds the lease) the
// error wraps nats.ErrNoResponders, or context.DeadlineExceeded while ctx
// has not ended (a request the user may not make is dropped without a
// word); a page that does not decode is a *messages.PageError.
func Read(ctx context.Context, nc *nats.Conn, subj messages.Subjects) (messages.Rotation, error) {
	if nc == nil {
		return messages.Rotation{}, errors.New("rotation: no NATS connection")
	}
	if subj.Prefix == "" {
		subj = messages.NewSubjects("")
	}
	for attempt := 1; ; attempt++ {
		rot, err := readOnce(ctx, nc, subj)
		if attempt < readAttempts && ctx.Err() == nil &&
			(errors.Is(err, errGap) || errors.Is(err, errReset) || errors.Is(err, errOverflow)) {
			continue
		}
		return rot, err
	}
}

// readOnce is one read of the pages and the feed.
func readOnce(ctx context.Context, nc *nats.Conn, subj messages.Subjects) (messages.Rotation, error) {
	q := newFeedQueue()
	sub, err := nc.Subscribe(subj.RotationChanges(), q.push)
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("rotation: subscribe to %s: %w", subj.RotationChanges(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The subscription is the server's before the first page is asked
	// for: no message after that page's version is missed.
	fctx, cancel := context.WithTimeout(ctx, readPageTimeout)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("rotation: subscribe to %s: %w", subj.RotationChanges(), err)
	}
	var f feed
	held := entries{}
	if _, err := f.readPages(ctx, func(ctx context.Context, after string) (messages.RotationPage, error) {
		return askPage(ctx, nc, subj, after, 0, readPageTimeout)
	}, held); err != nil {
		return messages.Rotation{}, fmt.Errorf("rotation: %w", err)
	}
	skip := func(error) {} // the next message shows a gap, if any
	wait := time.NewTimer(readFeedWait)
	defer wait.Stop()
	for {
		msgs, overflow := q.take()
		if overflow {
			return messages.Rotation{}, fmt.Errorf("rotation: %w", errOverflow)
		}
		if err := f.apply(msgs, held, skip); err != nil {
			return messages.Rotation{}, fmt.Errorf("rotation: %w", err)
		}
		if f.version >= f.exact {
			break
		}
		select {
		case <-q.wake:
		case <-wait.C:
			return messages.Rotation{}, fmt.Errorf("rotation: %w: version %d of the pages never came on %s (at %d)", errGap, f.exact, subj.RotationChanges(), f.version)
		case <-ctx.Done():
			return messages.Rotation{}, ctx.Err()
		}
	}
	rot := messages.Rotation{V: messages.Version, Version: f.version, Proxies: make([]messages.RotationEntry, 0, len(held)), At: time.Now().UTC()}
	for _, en := range held {
		rot.Proxies = append(rot.Proxies, en.e)
	}
	slices.SortFunc(rot.Proxies, func(a, b messages.RotationEntry) int { return cmp.Compare(a.ID, b.ID) })
	return rot, nil
}
