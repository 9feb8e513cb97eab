package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// feedWatch keeps every message of the rotation's feed, each decoded
// strictly (a message that does not decode fails the test), and the size
// of the largest.
type feedWatch struct {
	t       *testing.T
	mu      sync.Mutex
	msgs    []messages.RotationChanges
	largest int
	bytes   int
}

func watchFeed(t *testing.T, nc *nats.Conn) *feedWatch {
	t.Helper()
	w := &feedWatch{t: t}
	sub, err := nc.Subscribe(subj.RotationChanges(), func(m *nats.Msg) {
		c, err := messages.DecodeRotationChanges(m.Data)
		if err != nil {
			t.Errorf("feed message: %v in %.200s", err, m.Data)
			return
		}
		w.mu.Lock()
		w.msgs = append(w.msgs, c)
		w.largest = max(w.largest, len(m.Data))
		w.bytes += len(m.Data)
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *feedWatch) all() []messages.RotationChanges {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]messages.RotationChanges(nil), w.msgs...)
}

// readPages reads the whole rotation in pages of at most limit proxies
// (0: as many as fit), asking again while no process answers, and returns
// it with each page's version. between, if set, runs after each page.
func readPages(t *testing.T, nc *nats.Conn, limit int, between func(page int, version uint64)) (map[string]messages.RotationEntry, []uint64) {
	t.Helper()
	out := map[string]messages.RotationEntry{}
	var versions []uint64
	after := ""
	for {
		req, _ := json.Marshal(messages.RotationGet{V: 1, After: after, Limit: limit})
		var page messages.RotationPage
		poll.Until(t, "a page of the rotation after "+strconv.Quote(after), 10*time.Second, func() bool {
			msg, err := nc.Request(subj.RotationGet(), req, 2*time.Second)
			if err != nil {
				return false
			}
			if len(msg.Data) > messages.MaxBodySize {
				t.Fatalf("a page of %d bytes", len(msg.Data))
			}
			page, err = messages.DecodeRotationPage(msg.Data)
			var pe *messages.PageError
			if errors.As(err, &pe) {
				return false // standing by: a new publisher is on its way
			}
			if err != nil {
				t.Fatalf("page: %v", err)
			}
			return true
		})
		for _, e := range page.Proxies {
			out[e.ID] = e
		}
		versions = append(versions, page.Version)
		if between != nil {
			between(len(versions), page.Version)
		}
		if page.Next == "" {
			return out, versions
		}
		after = page.Next
	}
}

var errGap = errors.New("a gap in the feed")

// follower is a consumer of the feed as messages.RotationChanges says:
// subscribe, read the pages, apply the kept messages after the first
// page's version in order, then each message that follows the version
// held.
type follower struct {
	w       *feedWatch
	state   map[string]messages.RotationEntry
	version uint64
	next    int // the index of the next message of w to look at
	pages   []uint64
	// exact is the last page's version: from there on the state is the
	// rotation at the version held (before, the ids of later pages may
	// be ahead of it).
	exact uint64
}

func follow(t *testing.T, nc *nats.Conn, limit int, between func(page int, version uint64)) *follower {
	t.Helper()
	f := &follower{w: watchFeed(t, nc)}
	f.state, f.pages = readPages(t, nc, limit, between)
	f.version, f.exact = f.pages[0], f.pages[len(f.pages)-1]
	for i := 1; i < len(f.pages); i++ {
		if f.pages[i] < f.pages[i-1] {
			t.Fatalf("page versions go back: %v", f.pages)
		}
	}
	return f
}

// catchUp applies what arrived since the last call.
func (f *follower) catchUp() error {
	msgs := f.w.all()
	for ; f.next < len(msgs); f.next++ {
		m := msgs[f.next]
		switch {
		case m.Version <= f.version:
			continue // in the pages already, or a heartbeat of the version held
		case m.Prev != f.version:
			return fmt.Errorf("%w: message %d->%d at version %d", errGap, m.Prev, m.Version, f.version)
		}
		for _, c := range m.Changes {
			if c.Op == messages.ChangeLeft {
				delete(f.state, c.ID)
			} else {
				f.state[c.ID] = *c.Proxy
			}
		}
		f.version = m.Version
		if f.version >= f.exact && len(f.state) != m.Size {
			return fmt.Errorf("%d proxies at version %d, the message says %d", len(f.state), m.Version, m.Size)
		}
	}
	return nil
}

func entryAddrs(m map[string]messages.RotationEntry) map[string]string {
	out := make(map[string]string, len(m))
	for id, e := range m {
		out[id] = e.Addr
	}
	return out
}

// TestFeedCarriesEveryChange: each change of the rotation is one change of
// a feed message (entered, changed with the whole entry, left with the
// id), the messages chain (each one's prev is the version before it), and
// the pages, PROXY_ROTATION and GET /rotation hold the same rotation.
func TestFeedCarriesEveryChange(t *testing.T) {
	r := newRig(t)
	w := watchFeed(t, r.nc)
	h := r.start(health.Config{})
	waitPublishing(t, h)
	r.publishFolded(h, event("p1", 1, messages.StateRunning, "198.18.100.1"),
		event("p2", 1, messages.StateRunning, "198.18.100.2"))
	waitFor(t, "p1 and p2 on the feed", func() bool {
		f := &follower{w: w, state: map[string]messages.RotationEntry{}}
		for _, m := range w.all() {
			if m.Prev == 0 {
				f.version = m.Version // the first message of the lease: a reset
			}
		}
		return f.catchUp() == nil && len(f.state) == 2
	})
	relabelled := event("p2", 2, messages.StateRunning, "198.18.100.2")
	relabelled.Labels = map[string]string{"team": "a"}
	// One at a time: changes that come together are sent together, the
	// last state of each proxy once.
	for i, ev := range []messages.StateEvent{event("p1", 2, messages.StateRunning, "198.18.100.9"), relabelled,
		event("p1", 3, messages.StateDeleted, "")} {
		r.publish(ev)
		waitFor(t, ev.ID+" on the feed", func() bool { return h.Metrics().FeedChanges == uint64(3+i) })
	}
	want := map[string]string{"p2": "198.18.100.2:3128"}
	r.waitBucket(want)
	var ops []string
	waitFor(t, "the changes on the feed", func() bool {
		ops = nil
		for _, m := range w.all() {
			for _, c := range m.Changes {
				ops = append(ops, c.Op+" "+c.ID)
			}
		}
		return len(ops) >= 5
	})
	wantOps := []string{"entered p1", "entered p2", "changed p1", "changed p2", "left p1"}
	if strings.Join(ops, ",") != strings.Join(wantOps, ",") {
		t.Fatalf("changes on the feed: %v, want %v", ops, wantOps)
	}
	msgs := w.all()
	if msgs[0].Prev != 0 || len(msgs[0].Changes) != 0 {
		t.Fatalf("first message of the lease: %+v, want a reset (prev 0, no changes)", msgs[0])
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Prev != msgs[i-1].Version || msgs[i].Version <= msgs[i].Prev {
			t.Fatalf("message %d: %d->%d after %d", i, msgs[i].Prev, msgs[i].Version, msgs[i-1].Version)
		}
	}
	for _, m := range msgs {
		for _, c := range m.Changes {
			if c.ID == "p2" && c.Op == messages.ChangeChanged && c.Proxy.Labels["team"] != "a" {
				t.Fatalf("p2's change: %+v, want its whole entry with its labels", c.Proxy)
			}
		}
	}
	pages, _ := readPages(t, r.nc, 0, nil)
	if got := entryAddrs(pages); !maps.Equal(got, want) {
		t.Fatalf("pages: %v, want %v", got, want)
	}
	if got := addrs(getRotation(t, h).Proxies); !maps.Equal(got, want) {
		t.Fatalf("GET /rotation: %v, want %v", got, want)
	}
	m := h.Metrics()
	if m.FeedChanges != 5 || m.FeedResets != 1 || m.FeedErrors != 0 || m.Pages[health.PageServed] != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

// TestLateSubscriberReachesTheRotation: a consumer that subscribes to the
// feed while the rotation churns, reads the pages (each at a later
// version than the one before: the rotation moves on between them), then
// applies the messages it kept after the first page's version, holds
// exactly the rotation: the same as PROXY_ROTATION, GET /rotation and a
// fresh read of the pages, at the same version.
func TestLateSubscriberReachesTheRotation(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	const n = 600
	seq := map[string]uint64{}
	next := func(id, state, ip string) messages.StateEvent {
		seq[id]++
		return event(id, seq[id], state, ip)
	}
	for i := range n {
		r.publish(next(fmt.Sprintf("p%03d", i), messages.StateRunning, fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)))
	}
	poll.Until(t, "the rotation filled", time.Minute, func() bool { return h.Metrics().RotationSize == n })

	// Churn: addresses change, proxies leave and come back, labels
	// change, until the pages are read.
	stop, done := make(chan struct{}), make(chan struct{})
	published := n
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(7, 8))
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("p%03d", rng.IntN(n+50)) // some new ones too
			ip := fmt.Sprintf("198.19.%d.%d", rng.IntN(250), rng.IntN(250)+1)
			var ev messages.StateEvent
			switch rng.IntN(4) {
			case 0:
				ev = next(id, messages.StateDeleted, "")
			case 1:
				ev = next(id, messages.StateRunning, ip)
				ev.Labels = map[string]string{"n": strconv.Itoa(rng.IntN(5))}
			default:
				ev = next(id, messages.StateRunning, ip)
			}
			b, _ := json.Marshal(ev)
			if _, err := r.js.Publish(context.Background(), subj.State(id), b); err != nil {
				t.Errorf("churn: %v", err)
				return
			}
			published++
		}
	}()
	// After each of the first pages, wait for a newer version, so that
	// the pages are read at several versions.
	f := follow(t, r.nc, 25, func(page int, version uint64) {
		if page <= 5 {
			waitFor(t, "a newer version", func() bool { return h.Metrics().RotationVersion > version })
		}
	})
	close(stop)
	<-done
	if f.pages[0] == f.pages[len(f.pages)-1] {
		t.Fatalf("every page at version %d: the rotation did not move while they were read", f.pages[0])
	}

	// The churn's last events may still be being folded and published:
	// wait for health to have folded them all, then for the late
	// subscriber, GET /rotation and a fresh read of
	// the pages to agree on the version, then compare what they hold.
	poll.Until(t, "every event folded", time.Minute, func() bool { return h.Metrics().Events == uint64(published) })
	// PROXY_ROTATION is written before each message: it may be a
	// message ahead of the others while the last changes go out.
	var fresh, pages map[string]messages.RotationEntry
	var bucket map[string]string
	agreed := poll.Wait(time.Minute, func() bool {
		if err := f.catchUp(); err != nil {
			t.Fatalf("late subscriber: %v", err)
		}
		resp, body := httpRotation(t, h, "", nil)
		var rot messages.Rotation
		if err := json.Unmarshal(body, &rot); err != nil || resp.Header.Get("ETag") != `"`+strconv.FormatUint(f.version, 10)+`"` {
			return false
		}
		var versions []uint64
		pages, versions = readPages(t, r.nc, 0, nil)
		for _, v := range versions {
			if v != f.version {
				return false
			}
		}
		fresh = map[string]messages.RotationEntry{}
		for _, e := range rot.Proxies {
			fresh[e.ID] = e
		}
		bucket = r.bucket()
		return maps.Equal(entryAddrs(f.state), bucket)
	})
	if !agreed {
		t.Fatalf("no agreement within a minute: late subscriber %d proxies at version %d, PROXY_ROTATION %d", len(f.state), f.version, len(bucket))
	}
	if !maps.EqualFunc(f.state, fresh, sameEntry) {
		t.Fatalf("late subscriber at version %d: %d proxies, GET /rotation %d, differing", f.version, len(f.state), len(fresh))
	}
	if !maps.EqualFunc(f.state, pages, sameEntry) {
		t.Fatalf("late subscriber: %d proxies, a fresh read of the pages %d, differing", len(f.state), len(pages))
	}
	t.Logf("pages at versions %d..%d; caught up at version %d with %d proxies", f.pages[0], f.pages[len(f.pages)-1], f.version, len(f.state))
}

// waitPublishing waits for h's first message (a reset, which lists
// nothing): changes after it are each on the feed.
func waitPublishing(t *testing.T, h *health.Health) {
	t.Helper()
	waitFor(t, "the first message of the feed", func() bool { return h.Metrics().FeedResets > 0 })
}

func sameEntry(a, b messages.RotationEntry) bool {
	return a.ID == b.ID && a.Addr == b.Addr && a.Host == b.Host && a.Since.Equal(b.Since) && a.Egress == b.Egress && maps.Equal(a.Labels, b.Labels)
}

// TestFeedMessagesBounded: a burst of proxies with large entries goes out
// in several messages, none larger than 64 KiB, chained; pages too.
func TestFeedMessagesBounded(t *testing.T) {
	r := newRig(t)
	w := watchFeed(t, r.nc)
	// Snapshots seldom: the rig decodes each one, up to 1 MiB.
	h := r.start(health.Config{SnapshotInterval: time.Second})
	waitPublishing(t, h)
	const n = 1000
	labels := map[string]string{}
	for i := range 8 {
		labels[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 200)
	}
	for i := range n {
		ev := event(fmt.Sprintf("p%04d", i), 1, messages.StateRunning, fmt.Sprintf("198.18.%d.%d", i/250, i%250+1))
		ev.Labels = labels
		b, _ := json.Marshal(ev)
		if _, err := r.js.PublishAsync(subj.State(ev.ID), b); err != nil {
			t.Fatal(err)
		}
	}
	var msgs []messages.RotationChanges
	poll.Until(t, "the burst on the feed", time.Minute, func() bool {
		msgs = w.all()
		changes := 0
		for _, m := range msgs {
			changes += len(m.Changes)
		}
		return changes == n
	})
	w.mu.Lock()
	largest := w.largest
	w.mu.Unlock()
	if largest > messages.MaxBodySize || len(msgs) < 20 {
		t.Fatalf("%d messages, the largest %d bytes: want several, none over %d", len(msgs), largest, messages.MaxBodySize)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Prev != msgs[i-1].Version {
			t.Fatalf("message %d: prev %d after version %d", i, msgs[i].Prev, msgs[i-1].Version)
		}
	}
	pages, versions := readPages(t, r.nc, 0, nil)
	if len(pages) != n || len(versions) < 20 {
		t.Fatalf("%d proxies in %d pages", len(pages), len(versions))
	}
}

// TestFeedBytesPerChange: a change of an ordinary entry costs the feed
// well under 1 KiB.
func TestFeedBytesPerChange(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	waitPublishing(t, h)
	const n = 500
	for i := range n {
		ev := event(fmt.Sprintf("proxy-%04d", i), 1, messages.StateRunning, fmt.Sprintf("198.18.%d.%d", i/250, i%250+1))
		ev.Labels = map[string]string{"team": "a", "region": "eu-west"}
		r.publish(ev)
	}
	poll.Until(t, "the proxies on the feed", time.Minute, func() bool { return h.Metrics().FeedChanges == n })
	m := h.Metrics()
	if per := float64(m.FeedBytes) / float64(m.FeedChanges); per > 400 {
		t.Fatalf("%.0f bytes per change (%d messages, %d bytes)", per, m.Published, m.FeedBytes)
	}
}

// TestTakeoverResets: a new publisher's first message follows no
// version (prev 0), so a consumer reads the pages again; its versions
// are above the old one's.
func TestTakeoverResets(t *testing.T) {
	r := newRig(t)
	w := watchFeed(t, r.nc)
	_, js1 := r.srv.Connect(t)
	h1 := r.startWith(js1, health.Config{LeaseTTL: time.Second})
	waitPublishing(t, h1)
	r.publishFolded(h1, event("p1", 1, messages.StateRunning, "198.18.100.1"))
	waitFor(t, "p1 on the feed", func() bool { return h1.Metrics().FeedChanges == 1 })
	_, js2 := r.srv.Connect(t)
	h2 := r.startWith(js2, health.Config{LeaseTTL: time.Second})
	if err := r.stop(h1); err != nil {
		t.Fatal(err)
	}
	// The first message of each publisher is a reset (prev 0).
	var msgs []messages.RotationChanges
	resets := func() (n int) {
		msgs = w.all()
		for _, m := range msgs {
			if m.Prev == 0 {
				n++
			}
		}
		return n
	}
	waitFor(t, "h2's first message", func() bool { return resets() == 2 })
	if h2.Metrics().FeedResets != 1 {
		t.Fatalf("h2's resets: %d", h2.Metrics().FeedResets)
	}
	var before uint64
	for i, m := range msgs {
		if m.Prev == 0 && i > 0 {
			if m.Version <= before || m.Size != 1 || len(m.Changes) != 0 {
				t.Fatalf("the new publisher's first message: %+v after version %d", m, before)
			}
		}
		before = max(before, m.Version)
	}
	if pages, _ := readPages(t, r.nc, 0, nil); len(pages) != 1 {
		t.Fatalf("pages after the takeover: %v", pages)
	}
}

// TestHeartbeat: with nothing to say for a third of the lease's TTL, the
// publisher repeats its version, so a consumer that missed the last
// message learns so.
func TestHeartbeat(t *testing.T) {
	r := newRig(t)
	w := watchFeed(t, r.nc)
	h := r.start(health.Config{LeaseTTL: 600 * time.Millisecond})
	waitPublishing(t, h)
	r.publishFolded(h, event("p1", 1, messages.StateRunning, "198.18.100.1"))
	var hb messages.RotationChanges
	waitFor(t, "a heartbeat", func() bool {
		for _, m := range w.all() {
			if m.Prev == m.Version {
				hb = m
				return true
			}
		}
		return false
	})
	if len(hb.Changes) != 0 || hb.Size != 1 || h.Metrics().FeedHeartbeats == 0 {
		t.Fatalf("heartbeat %+v", hb)
	}
}
