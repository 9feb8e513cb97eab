package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Rotation reads the rotation as the publishing health process has it,
// exactly, at one version (health's): it subscribes to the rotation's
// feed, reads the pages (messages.RotationPage; entries whole, with host,
// labels and egress), then applies the feed's messages after the first
// page's version until it holds at least the last page's (see
// messages.RotationChanges). A gap in the feed (a lost message, a new
// publisher) reads it again, up to three times. When no health process
// answers (none runs, or none holds the lease yet), it reads the KV bucket
// PROXY_ROTATION instead (RotationFromBucket). Proxies are sorted by id.
func (c *Client) Rotation(ctx context.Context) (messages.Rotation, error) {
	for attempt := 1; ; attempt++ {
		rot, err := c.rotationFromFeed(ctx)
		var pe *messages.PageError
		switch {
		case errors.Is(err, nats.ErrNoResponders), errors.As(err, &pe):
			return c.RotationFromBucket(ctx)
		case errors.Is(err, errFeedGap) && attempt < 3 && ctx.Err() == nil:
			continue
		}
		return rot, err
	}
}

// errFeedGap: the feed did not follow on from the pages.
var errFeedGap = errors.New("a gap in the rotation's feed")

// pageTimeout bounds the wait for one page.
const pageTimeout = 5 * time.Second

// feedWait bounds the wait for the feed's messages up to the last page's
// version, which the publisher sends as it answers.
const feedWait = 3 * time.Second

// rotationFromFeed is one read of the pages and the feed.
func (c *Client) rotationFromFeed(ctx context.Context) (messages.Rotation, error) {
	ch := make(chan *nats.Msg, 4096)
	sub, err := c.nc.ChanSubscribe(c.subj.RotationChanges(), ch)
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("subscribe to %s: %w", c.subj.RotationChanges(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The subscription is the server's before the first page is asked
	// for: no message after that page's version is missed.
	fctx, cancel := context.WithTimeout(ctx, pageTimeout) // Flush wants a deadline
	err = c.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("subscribe to %s: %w", c.subj.RotationChanges(), err)
	}
	state := map[string]messages.RotationEntry{}
	var first, last uint64
	for after, n := "", 0; ; n++ {
		body, _ := json.Marshal(messages.RotationGet{V: messages.Version, After: after})
		rctx, cancel := context.WithTimeout(ctx, pageTimeout)
		msg, err := c.nc.RequestWithContext(rctx, c.subj.RotationGet(), body)
		cancel()
		if n == 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// No answer at all (a request refused to this user by an
			// older accounts.conf is dropped without a word): as if
			// no health process answered.
			err = nats.ErrNoResponders
		}
		if err != nil {
			return messages.Rotation{}, fmt.Errorf("ask %s: %w", c.subj.RotationGet(), err)
		}
		page, err := messages.DecodeRotationPage(msg.Data)
		if err != nil {
			return messages.Rotation{}, fmt.Errorf("a page of %s: %w", c.subj.RotationGet(), err)
		}
		if n > 0 && page.Version < last {
			return messages.Rotation{}, fmt.Errorf("%w: a page at version %d after one at %d", errFeedGap, page.Version, last)
		}
		if n == 0 {
			first = page.Version
		}
		last = page.Version
		for _, e := range page.Proxies {
			state[e.ID] = e
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	version := first
	apply := func(msg *nats.Msg) error {
		m, err := messages.DecodeRotationChanges(msg.Data)
		switch {
		case err != nil:
			return nil // not ours to judge: the next one shows a gap, if any
		case m.Version <= version:
			return nil
		case m.Prev != version:
			return fmt.Errorf("%w: version %d follows %d, the pages and the feed hold %d", errFeedGap, m.Version, m.Prev, version)
		}
		for _, ch := range m.Changes {
			if ch.Op == messages.ChangeLeft {
				delete(state, ch.ID)
			} else {
				state[ch.ID] = *ch.Proxy
			}
		}
		version = m.Version
		if version >= last && len(state) != m.Size {
			return fmt.Errorf("%w: %d proxies at version %d, the publisher has %d", errFeedGap, len(state), version, m.Size)
		}
		return nil
	}
	wait := time.NewTimer(feedWait)
	defer wait.Stop()
	for version < last {
		select {
		case msg := <-ch:
			if err := apply(msg); err != nil {
				return messages.Rotation{}, err
			}
		case <-wait.C:
			return messages.Rotation{}, fmt.Errorf("%w: version %d of the pages never came on %s (at %d)", errFeedGap, last, c.subj.RotationChanges(), version)
		case <-ctx.Done():
			return messages.Rotation{}, ctx.Err()
		}
	}
	for more := true; more; {
		select {
		case msg := <-ch:
			if err := apply(msg); err != nil {
				return messages.Rotation{}, err
			}
		default:
			more = false
		}
	}
	rot := messages.Rotation{V: messages.Version, Version: version, Proxies: make([]messages.RotationEntry, 0, len(state)), At: time.Now().UTC()}
	for _, e := range state {
		rot.Proxies = append(rot.Proxies, e)
	}
	sort.Slice(rot.Proxies, func(i, j int) bool { return rot.Proxies[i].ID < rot.Proxies[j].ID })
	return rot, nil
}

// RotationFromBucket reads the rotation from the KV bucket PROXY_ROTATION
// (key = proxy id, value = ip:port), what the publishing health process
// last wrote there: for when no health process answers. The snapshot's
// Version is the highest revision among the keys (it grows with every
// change, but it is not the health process's own version); each entry's
// Since is when its key was last written; Host, which the bucket does not
// hold, comes from the proxy's latest state event when there is one, and
// Egress from health's record of the proxy in PROXY_CHECKS. Proxies are
// sorted by id.
func (c *Client) RotationFromBucket(ctx context.Context) (messages.Rotation, error) {
	rot := messages.Rotation{V: messages.Version, Proxies: []messages.RotationEntry{}}
	kv, err := c.bucket(ctx, messages.BucketRotation)
	if err != nil {
		return rot, err
	}
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		rot.Proxies = append(rot.Proxies, messages.RotationEntry{
			ID: e.Key(), Addr: string(e.Value()), Since: e.Created().UTC(),
		})
		rot.Version = max(rot.Version, e.Revision())
		return nil
	})
	if err != nil {
		return rot, fmt.Errorf("read %s: %w", messages.BucketRotation, err)
	}
	sort.Slice(rot.Proxies, func(i, j int) bool { return rot.Proxies[i].ID < rot.Proxies[j].ID })
	rot.At = time.Now().UTC()
	if len(rot.Proxies) > 0 {
		// The bucket holds no host; the latest events do. Best effort:
		// the rotation is complete without them.
		if events, err := c.latestEvents(ctx); err == nil {
			for i, p := range rot.Proxies {
				if ev := events[p.ID]; ev != nil {
					rot.Proxies[i].Host = ev.Host
				}
			}
		}
		if checks, err := c.checks(ctx); err == nil {
			for i, p := range rot.Proxies {
				if chk := checks[p.ID]; chk != nil && chk.Addr == p.Addr {
					rot.Proxies[i].Egress = chk.Egress
				}
			}
		}
	}
	return rot, nil
}

// maxRotationBody bounds a snapshot read over HTTP.
const maxRotationBody = 32 << 20

// RotationURL returns the snapshot served by a health process: base is its
// address ("http://host:port", to which /rotation is added, or a full URL
// with a path). hc nil means http.DefaultClient. It needs no NATS.
func RotationURL(ctx context.Context, hc *http.Client, base string) (messages.Rotation, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return messages.Rotation{}, fmt.Errorf("rotation url %q: want http(s)://host:port[/path]", base)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/rotation"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return messages.Rotation{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return messages.Rotation{}, fmt.Errorf("get rotation: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return messages.Rotation{}, fmt.Errorf("get %s: %s: %s", u, resp.Status, strings.TrimSpace(string(snippet)))
	}
	var rot messages.Rotation
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxRotationBody))
	if err := dec.Decode(&rot); err != nil {
		return messages.Rotation{}, fmt.Errorf("decode rotation from %s: %w", u, err)
	}
	if rot.Proxies == nil {
		rot.Proxies = []messages.RotationEntry{}
	}
	return rot, nil
}
