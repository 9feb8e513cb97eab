package rotation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
)

// Why the rotation is read whole again.
var (
	errGap      = errors.New("a gap in the feed")
	errReset    = errors.New("a new publisher")
	errOverflow = errors.New("the feed came faster than it was applied")
)

// maxQueued bounds the bytes of feed messages kept while the pages are
// read (or before the follower takes them); past it they are dropped and
// the rotation is read whole again.
const maxQueued = 64 << 20

// feedQueue keeps the feed's messages from the subscription's goroutine
// until the follower takes them.
type feedQueue struct {
	mu       sync.Mutex
	msgs     []*nats.Msg
	bytes    int
	overflow bool
	wake     chan struct{} // a message is waiting
}

func newFeedQueue() *feedQueue { return &feedQueue{wake: make(chan struct{}, 1)} }

func (q *feedQueue) push(m *nats.Msg) {
	q.mu.Lock()
	if q.bytes+len(m.Data) > maxQueued {
		q.msgs, q.bytes, q.overflow = nil, 0, true
	} else {
		q.msgs = append(q.msgs, m)
		q.bytes += len(m.Data)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns the messages kept and whether some were dropped.
func (q *feedQueue) take() ([]*nats.Msg, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs, overflow := q.msgs, q.overflow
	q.msgs, q.bytes, q.overflow = nil, 0, false
	return msgs, overflow
}

// follower is the state of the one goroutine that follows the feed.
type follower struct {
	q    *feedQueue
	feed feed // the versions held and read
	read bool // the pages were read and the kept messages applied
	// expect is a version the first page announced at a look, which the
	// feed has not brought yet; 0 if none.
	expect uint64
	// waitingSince is when reading the pages started failing (zero if it
	// does not), waitingLogged when that was last logged.
	waitingSince, waitingLogged time.Time
}

// followFeed follows the rotation until ctx ends (nil) or the connection
// is closed (its error): it subscribes to the feed, reads the pages, then
// applies each message that follows the version it holds, and reads the
// pages again on a gap, a new publisher, or a look (after CheckInterval
// of silence) that finds the publisher at a version the feed never
// brought.
func (r *Rotation) followFeed(ctx context.Context) error {
	f := &follower{q: newFeedQueue()}
	sub, err := r.nc.Subscribe(r.subj.RotationChanges(), f.q.push)
	if err != nil {
		return fmt.Errorf("rotation: subscribe to %s: %w", r.subj.RotationChanges(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The subscription is the server's before the first page is asked
	// for: no message after that page's version is missed.
	if err := r.nc.Flush(); err != nil && r.nc.IsClosed() {
		return fmt.Errorf("rotation: %w", nats.ErrConnectionClosed)
	}
	look := time.NewTimer(r.cfg.CheckInterval)
	defer look.Stop()
	wait := r.cfg.RetryMax / 50
	for {
		if ctx.Err() != nil {
			return nil
		}
		if r.nc.IsClosed() {
			return fmt.Errorf("rotation: %w", nats.ErrConnectionClosed)
		}
		if !f.read {
			err := r.readPages(ctx, f)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				r.noteWaiting(f, err)
				t := time.NewTimer(wait + rand.N(wait/5+1))
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
				}
				wait = min(wait*2, r.cfg.RetryMax)
				continue
			}
			wait = r.cfg.RetryMax / 50
			f.expect = 0
			look.Reset(r.cfg.CheckInterval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.q.wake:
			msgs, overflow := f.q.take()
			err := errOverflow
			if !overflow {
				err = r.apply(f, msgs)
			}
			if err != nil {
				r.readAgain(f, err)
			}
			look.Reset(r.cfg.CheckInterval)
		case <-look.C:
			r.look(ctx, f)
			look.Reset(r.cfg.CheckInterval)
		}
	}
}

// readAgain marks the rotation to be read whole again, and says why.
func (r *Rotation) readAgain(f *follower, why error) {
	f.read = false
	r.restarts.Add(1)
	if errors.Is(why, errReset) {
		// A takeover or a restart of health: expected now and then.
		r.log.Info("reading the rotation again: "+why.Error(), "version", f.feed.version)
		return
	}
	r.log.Warn("reading the rotation again", "why", why, "version", f.feed.version)
}

// look asks the publisher for its version (a page of one proxy) after a
// silence of the feed: the version held is current, or the feed brings
// the one announced before the next look; else a message was lost, and
// the rotation is read again. A publisher that does not answer changes
// nothing: the rotation is kept as it is.
func (r *Rotation) look(ctx context.Context, f *follower) {
	page, err := r.page(ctx, "", 1)
	switch {
	case err != nil:
		r.log.Debug("looking at the rotation's version", "err", err)
	case page.Version == f.feed.version:
		f.expect = 0
	case page.Version < f.feed.version:
		r.readAgain(f, fmt.Errorf("%w: the publisher is at version %d, before %d", errReset, page.Version, f.feed.version))
	case f.expect != 0 && f.feed.version < f.expect:
		r.readAgain(f, fmt.Errorf("%w: version %d was announced, the feed is still at %d", errGap, f.expect, f.feed.version))
	default:
		f.expect = page.Version
	}
}

// readPages reads the pages into the index (see feed.readPages) and
// applies the messages kept since the subscription that come after the
// first page's version.
func (r *Rotation) readPages(ctx context.Context, f *follower) error {
	n, err := f.feed.readPages(ctx, func(ctx context.Context, after string) (messages.RotationPage, error) {
		return r.page(ctx, after, 0)
	}, indexHolder{r})
	if err != nil {
		return err
	}
	r.version.Store(f.feed.version)
	msgs, overflow := f.q.take()
	if overflow {
		return errOverflow
	}
	if err := r.apply(f, msgs); err != nil {
		return err
	}
	f.read = true
	if !f.waitingSince.IsZero() {
		r.log.Info("the rotation's publisher answers again", "after", time.Since(f.waitingSince).Round(time.Millisecond))
		f.waitingSince, f.waitingLogged = time.Time{}, time.Time{}
	}
	r.mu.Lock()
	r.readyLocked()
	size := len(r.idx.all.items)
	r.mu.Unlock()
	r.log.Debug("read the rotation", "pages", n, "versions", fmt.Sprintf("%d..%d", f.feed.first, f.feed.exact), "version", f.feed.version, "proxies", size)
	return nil
}

// apply applies the feed's messages to the index (see feed.apply).
func (r *Rotation) apply(f *follower, msgs []*nats.Msg) error {
	err := f.feed.apply(msgs, indexHolder{r}, func(err error) {
		r.log.Warn("ignoring a message of the rotation's feed that does not decode", "err", err)
	})
	r.version.Store(f.feed.version)
	return err
}

// page asks the publishing health process for the page after after.
func (r *Rotation) page(ctx context.Context, after string, limit int) (messages.RotationPage, error) {
	return askPage(ctx, r.nc, r.subj, after, limit, opTimeout)
}

// askPage asks subj's publishing health process for the page after after
// (limit: the most proxies, 0 for the page's own bound), within timeout.
func askPage(ctx context.Context, nc *nats.Conn, subj messages.Subjects, after string, limit int, timeout time.Duration) (messages.RotationPage, error) {
	body, err := json.Marshal(messages.RotationGet{V: messages.Version, After: after, Limit: limit})
	if err != nil {
		return messages.RotationPage{}, err
	}
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(octx, subj.RotationGet(), body)
	if err != nil {
		return messages.RotationPage{}, fmt.Errorf("ask %s: %w", subj.RotationGet(), err)
	}
	page, err := messages.DecodeRotationPage(msg.Data)
	if err != nil {
		return messages.RotationPage{}, fmt.Errorf("a page of %s: %w", subj.RotationGet(), err)
	}
	return page, nil
}

// noteWaiting says that the pages could not be read: at info level at
// first (a health process may be starting, or taking over), at error
// level once that lasts missingRepeat, and again every missingRepeat.
// The rotation is kept as it is meanwhile.
func (r *Rotation) noteWaiting(f *follower, err error) {
	now := time.Now()
	if f.waitingSince.IsZero() {
		f.waitingSince, f.waitingLogged = now, now
		r.log.Info("waiting for the rotation's publisher (a health process holding the lease) to answer", "subject", r.subj.RotationGet(), "err", err)
		return
	}
	if now.Sub(f.waitingLogged) >= missingRepeat {
		f.waitingLogged = now
		r.log.Error("no health process answers for the rotation: is one running, and holding the lease? The rotation is kept meanwhile",
			"subject", r.subj.RotationGet(), "for", now.Sub(f.waitingSince).Round(time.Second), "err", err)
	}
}
