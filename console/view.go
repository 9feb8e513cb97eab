package console

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"proxyfleet/client"
	"proxyfleet/console/defaults"
	"proxyfleet/messages"
)

// DefaultViewRefresh is how often, at least, the proxies view is read
// afresh (Config.ViewRefresh; console.view_refresh in the YAML).
const DefaultViewRefresh = defaults.ViewRefresh

// viewReadShare bounds the time the view spends re-reading: the pause
// after a read is at least this many times the read's own duration, so a
// re-read takes at most a fifth of the console's time however large the
// fleet.
const viewReadShare = 4

// proxyView holds what the proxies page shows of every proxy, in memory,
// indexed so that a page costs O(page) with one filter and O(the smallest
// filter's matches) with several, never a read or decode of the fleet.
//
// It is kept current two ways: the proxies' state events (state, host,
// address, egress, age) reach it as the hub receives them, before any
// live stream sees them; everything else List joins (desired records,
// results, health's verdicts, a create's "pending") comes from reading
// the fleet afresh (client.List) every refresh, or sooner when the hub's
// watch is opened again. So a verdict or a label is at most refresh plus
// one read old; a state is as current as `watch`.
type proxyView struct {
	cl      *client.Client
	log     *slog.Logger
	refresh time.Duration
	again   chan struct{} // a re-read is asked for (the watch was reopened)
	readyCh chan struct{} // closed when the first read completed

	mu       sync.RWMutex
	ready    bool // a read has completed: the view may answer
	unread   bool // the last read could not read PROXY_DESIRED
	byID     map[string]*viewEntry
	index    map[indexKey][]string // each sorted by id
	reading  bool                  // a read is under way: events are kept in pending
	pending  []client.Update
	readTook time.Duration
	lastErr  error // of the last read, nil if it succeeded
}

// viewEntry is one proxy and the keys it is indexed by.
type viewEntry struct {
	st                client.Status
	state, host, pool string
	gone              bool
}

// indexKey names one index: kind is 'v' (every proxy List shows without
// IncludeDeleted), 'd' (every proxy in state deleted, gone or not), 'h'
// (host), 's' (state) or 'p' (pool); the last three hold only what 'v'
// holds.
type indexKey struct {
	kind  byte
	value string
}

func newProxyView(cl *client.Client, log *slog.Logger, refresh time.Duration) *proxyView {
	return &proxyView{cl: cl, log: log, refresh: refresh, again: make(chan struct{}, 1), readyCh: make(chan struct{}),
		byID: map[string]*viewEntry{}, index: map[indexKey][]string{}}
}

func entryOf(st client.Status) *viewEntry {
	return &viewEntry{st: st, state: st.State(), host: st.Host(), pool: st.Labels()[messages.PoolLabel], gone: st.Gone()}
}

// keys are the indexes e belongs to.
func (e *viewEntry) keys() []indexKey {
	var ks []indexKey
	if e.state == messages.StateDeleted {
		ks = append(ks, indexKey{'d', ""})
	}
	if e.gone {
		return ks
	}
	return append(ks, indexKey{'v', ""}, indexKey{'h', e.host}, indexKey{'s', e.state}, indexKey{'p', e.pool})
}

// viewRetry is the pause after a failed read while the view has none.
const viewRetry = time.Second

// run reads the fleet, then again every refresh (or when asked), until
// ctx ends. A read that fails is logged and tried again at the next turn
// (after viewRetry while no read has completed yet); the view keeps
// answering from the last read meanwhile.
func (v *proxyView) run(ctx context.Context) error {
	for {
		start := time.Now()
		err := v.read(ctx)
		took := time.Since(start)
		pause := max(v.refresh, viewReadShare*took)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			v.log.Warn("console: read the proxies for the view", "err", err)
			if !v.isReady() {
				pause = viewRetry
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-v.again:
			t.Stop()
		case <-t.C:
		}
	}
}

// reread asks run for a read soon.
func (v *proxyView) reread() {
	select {
	case v.again <- struct{}{}:
	default:
	}
}

// read replaces the view with a fresh List, then applies the events the
// hub received while it was read (each is as new as, or newer than,
// what the read found of its proxy).
func (v *proxyView) read(ctx context.Context) error {
	v.mu.Lock()
	v.reading, v.pending = true, nil
	v.mu.Unlock()
	start := time.Now()
	sts, err := v.cl.List(ctx, client.IncludeDeleted())
	v.mu.Lock()
	defer v.mu.Unlock()
	pending := v.pending
	v.reading, v.pending, v.lastErr = false, nil, err
	if err != nil {
		return err
	}
	byID := make(map[string]*viewEntry, len(sts))
	index := map[indexKey][]string{}
	for _, st := range sts { // sorted by id: every index is built sorted
		e := entryOf(st)
		byID[st.ID] = e
		for _, k := range e.keys() {
			index[k] = append(index[k], st.ID)
		}
	}
	v.byID, v.index, v.ready, v.readTook = byID, index, true, time.Since(start)
	v.unread = len(sts) > 0 && sts[0].DesiredUnread
	for _, u := range pending {
		v.applyLocked(u)
	}
	select {
	case <-v.readyCh:
	default:
		close(v.readyCh)
	}
	return nil
}

func (v *proxyView) isReady() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.ready
}

// wait waits until the view's first read completed, or ctx ends; then it
// returns the last read's error (the view cannot answer yet).
func (v *proxyView) wait(ctx context.Context) error {
	select {
	case <-v.readyCh:
		return nil
	case <-ctx.Done():
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.lastErr != nil {
		return fmt.Errorf("not read yet: %w", v.lastErr)
	}
	return fmt.Errorf("not read yet: %w", ctx.Err())
}

// apply takes a state event the hub received into the view.
func (v *proxyView) apply(u client.Update) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.reading {
		v.pending = append(v.pending, u)
	}
	if v.ready {
		v.applyLocked(u)
	}
}

func (v *proxyView) applyLocked(u client.Update) {
	ev := u.Event
	if ev.ID == "" {
		return
	}
	st := client.Status{ID: ev.ID, DesiredUnread: v.unread}
	old := v.byID[ev.ID]
	if old != nil {
		st = old.st
	}
	if cmd := lastCommand(st); ev.CommandID != "" && cmd != "" && ev.CommandID != cmd {
		// The event is of a later command than the desired record and
		// result the view read: those are stale until the next read, and
		// the event alone says more truly what the proxy is (a delete's
		// "deleted" takes it out of the list at once).
		st.Desired, st.Result = nil, nil
	}
	st.Event = &ev
	e := entryOf(st)
	if old != nil {
		for _, k := range old.keys() {
			if i, ok := slices.BinarySearch(v.index[k], ev.ID); ok {
				v.index[k] = slices.Delete(v.index[k], i, i+1)
			}
		}
	}
	v.byID[ev.ID] = e
	for _, k := range e.keys() {
		if i, ok := slices.BinarySearch(v.index[k], ev.ID); !ok {
			v.index[k] = slices.Insert(v.index[k], i, ev.ID)
		}
	}
}

// lastCommand is the command id of the desired record the view read of
// a proxy, else of its latest result ("" when neither is known).
func lastCommand(st client.Status) string {
	if st.Desired != nil {
		return st.Desired.CommandID
	}
	if st.Result != nil {
		return st.Result.CommandID
	}
	return ""
}

// query returns the page (from 0, of size n) of the proxies List returns
// with these filters (an empty one is any), in id order, and how many
// match in all; ok is false until the first read completed.
func (v *proxyView) query(host, state, pool string, page, n int) (rows []client.Status, total int, ok bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !v.ready {
		return nil, 0, false
	}
	var lists [][]string
	if state == messages.StateDeleted {
		lists = append(lists, v.index[indexKey{'d', ""}])
	} else if state != "" {
		lists = append(lists, v.index[indexKey{'s', state}])
	}
	if host != "" {
		lists = append(lists, v.index[indexKey{'h', host}])
	}
	if pool != "" {
		lists = append(lists, v.index[indexKey{'p', pool}])
	}
	if len(lists) == 0 {
		lists = append(lists, v.index[indexKey{'v', ""}])
	}
	from := page * n
	if len(lists) == 1 && state != messages.StateDeleted {
		// One index is the whole answer: the page is a slice of it.
		ids := lists[0]
		for _, id := range ids[min(from, len(ids)):min(from+n, len(ids))] {
			rows = append(rows, v.byID[id].st)
		}
		return rows, len(ids), true
	}
	smallest := slices.MinFunc(lists, func(a, b []string) int { return len(a) - len(b) })
	for _, id := range smallest {
		e := v.byID[id]
		if (state != "" && e.state != state) || (host != "" && e.host != host) || (pool != "" && e.pool != pool) {
			continue
		}
		if total >= from && total < from+n {
			rows = append(rows, e.st)
		}
		total++
	}
	return rows, total, true
}
