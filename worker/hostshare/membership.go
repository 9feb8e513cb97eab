package hostshare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Host is one of the worker's hosts as sharing sees it: the worker's
// consumer of the host's work. The worker implements it.
type Host interface {
	// Want asks the worker to pull the host (true) or to hand it over
	// (false); it does not block, and the worker acts on it in its own
	// time.
	Want(pull bool)
	// Pulling reports whether the worker pulls the host, means to, or is
	// still handing it over.
	Pulling() bool
	// Pin is the pin id the server gave the worker on the host's work
	// consumer; "" for none known.
	Pin() string
}

// Config of a Membership.
type Config struct {
	// ID is the worker's id: the key of its record.
	ID string
	// Hosts are the hosts the worker can execute, by name.
	Hosts map[string]Host
	// Subjects are the worker's: claims go to its work subjects.
	Subjects messages.Subjects
	// Heartbeat is how often the record is renewed; Liveness how young a
	// record must be (by the view's clock, see liveMembers) for its
	// worker to count as live. Liveness must be longer than Heartbeat.
	Heartbeat, Liveness time.Duration
	// Unpins makes the unpins of stray pins, within the worker's bound
	// of unpins in flight; nil: an Unpinner of its own.
	Unpins *Unpinner
	// StrayUnpinned, if set, is told of each stray pin unpinned.
	StrayUnpinned func()
	// Now is the clock records are written and judged by (nil:
	// time.Now); Log is where it logs (nil: nowhere).
	Now func() time.Time
	Log *slog.Logger
}

// Membership is a worker's part in sharing the hosts: it keeps the
// worker's record in PROXY_WORKERS (a heartbeat every Heartbeat), follows
// everyone's, and tells each of the worker's hosts whether to pull it,
// from the assignment of the live members.
//
// Without a view of the membership (it could not read the records yet) the worker
// pulls every host it can execute: the pins still give each host one
// owner, only not a fair share.
type Membership struct {
	cfg  Config
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	self messages.WorkerRecord // its id, hosts and start: fixed
	kick chan struct{}         // a pin won or lost, a host taken or given up: write the record now

	// Owned by Join, then by Run, then by Draining and Leave once Run
	// returned.
	watcher jetstream.KeyWatcher
	recs    map[string]member
	viewed  bool                 // it has read the records once
	wanted  map[string]bool      // by host: what Want was last told
	share   []string             // the hosts assigned to this worker, last computed
	backup  []string             // the hosts it pulls for an assigned worker that does not
	shared  []string             // the ids they were shared over
	idle    map[string]idleOwner // by host not its own: since when its owner has not pulled it
	twin    time.Time            // when a record of this id from another process was last logged
	// The last assignment and the live members it was computed from
	// (their ids and hosts): see assignment.
	assignedFrom   []messages.WorkerRecord
	assignedOwners map[string]string

	viewedOnce atomic.Bool              // viewed, for readers outside the run loop
	mine       atomic.Pointer[[]string] // share, for readers outside the run loop

	// strays are the looks at the pins of hosts pulled without one
	// (straypin.go).
	strays strayLooks

	// heard is when the view last learnt something (an update of the
	// watch, or a read); wrote, when this worker's record was last
	// written. A watch that has delivered nothing for Liveness since a
	// write it should have seen is stuck (see Run).
	heard, wrote time.Time
}

// idleOwner is a host's assigned worker, seen not pulling it since since.
type idleOwner struct {
	id    string
	since time.Time
}

// Join binds PROXY_WORKERS, writes the worker's record, watches everyone's
// (on watchCtx: the watch ends with it; pass Run's) and reads them, then
// tells each host whether to pull it. A failed write or read is logged:
// the worker runs on and Run tries again every heartbeat. It fails only
// when the bucket cannot be bound.
func Join(ctx, watchCtx context.Context, js jetstream.JetStream, cfg Config) (*Membership, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Unpins == nil {
		cfg.Unpins = NewUnpinner(js)
	}
	kv, err := js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", messages.BucketWorkers, err)
	}
	m := &Membership{
		cfg: cfg, js: js, kv: kv, kick: make(chan struct{}, 1), recs: map[string]member{},
		wanted: map[string]bool{}, idle: map[string]idleOwner{}, strays: newStrayLooks(len(cfg.Hosts)),
		self: messages.WorkerRecord{
			V: 1, ID: cfg.ID, State: messages.WorkerActive,
			Hosts: slices.Sorted(maps.Keys(cfg.Hosts)), Started: cfg.Now().UTC(),
		},
	}
	m.beat(ctx, messages.WorkerActive)
	m.refresh(ctx, watchCtx)
	m.reconcile()
	return m, nil
}

// Viewed reports whether the membership has read the records once: until
// then the worker pulls every host it can execute.
func (m *Membership) Viewed() bool { return m.viewedOnce.Load() }

// Mine returns the hosts assigned to this worker, as last computed (nil
// without a view).
func (m *Membership) Mine() []string {
	if p := m.mine.Load(); p != nil {
		return *p
	}
	return nil
}

// Changed tells the membership that a host's pin, or whether the worker
// pulls it, changed: Run writes the record at once. It does not block.
func (m *Membership) Changed() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Draining writes the record as draining, so the others take the
// worker's hosts at once. Call it once Run has returned.
func (m *Membership) Draining(ctx context.Context) {
	if !m.js.Conn().IsClosed() {
		m.beat(ctx, messages.WorkerDraining)
	}
}

// record is the worker's record as of now.
func (m *Membership) record(state string) messages.WorkerRecord {
	r := m.self
	r.State, r.At = state, m.cfg.Now().UTC()
	r.Owned, r.Pins = []string{}, map[string]string{}
	for h, c := range m.cfg.Hosts {
		if c.Pulling() {
			r.Pulling = append(r.Pulling, h)
		}
		if pin := c.Pin(); pin != "" {
			r.Owned = append(r.Owned, h)
			r.Pins[h] = pin
		}
	}
	slices.Sort(r.Owned)
	slices.Sort(r.Pulling)
	return r
}

// beat writes the worker's record.
func (m *Membership) beat(ctx context.Context, state string) {
	b, err := json.Marshal(m.record(state))
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(m.cfg.Heartbeat, time.Second))
	defer cancel()
	if _, err := m.kv.Put(ctx, m.self.ID, b); err != nil {
		if ctx.Err() == nil {
			m.cfg.Log.Warn("write worker record", "bucket", messages.BucketWorkers, "err", err)
		}
		return
	}
	m.wrote = m.cfg.Now()
}

// Leave deletes the worker's record: it has stopped. Past ctx it gives up:
// the others count the record dead after Liveness, and the bucket's TTL
// removes it. Call it once Run has returned.
func (m *Membership) Leave(ctx context.Context) {
	m.dropWatch()
	if m.js.Conn().IsClosed() {
		return // it ages out
	}
	ctx, cancel := context.WithTimeout(ctx, max(m.cfg.Heartbeat, time.Second))
	defer cancel()
	if err := m.kv.Delete(ctx, m.self.ID); err != nil {
		m.cfg.Log.Warn("delete worker record", "bucket", messages.BucketWorkers, "err", err)
	}
}

// refresh watches the records' updates (on watchCtx: the watch ends with
// it), then reads every record, which makes the view anew. Updates queued
// by the watch meanwhile are applied after the read, in order, so the view
// ends at the latest of each. (The watch's own initial values are not
// used: its "initial values done" marker can come before all of them while
// records are being renewed, which would have a worker start from a
// membership missing some workers.) Without a watch or a read it keeps the
// view it had; the run loop tries again every heartbeat.
func (m *Membership) refresh(ctx, watchCtx context.Context) {
	m.stopWatch()
	wa, err := m.kv.WatchAll(watchCtx, jetstream.UpdatesOnly())
	if err != nil {
		m.cfg.Log.Warn("watch worker records", "bucket", messages.BucketWorkers, "err", err)
		return
	}
	m.watcher = wa
	recs, err := m.readAll(ctx)
	if err != nil {
		m.cfg.Log.Warn("read worker records", "bucket", messages.BucketWorkers, "err", err)
		if !m.viewed {
			m.cfg.Log.Warn("no view of the other workers yet: pulling every host until there is one")
		}
		return
	}
	m.recs, m.viewed = recs, true
	m.heard = m.cfg.Now()
	m.viewedOnce.Store(true)
}

// stuck reports whether the watch has delivered nothing for Liveness
// though this worker wrote its record since it last did: the watch sees
// every key, this one's own too, so it has stopped delivering without
// ending (a watch of a loaded server can), and Run watches and reads
// again rather than count the others dead and pull every host.
func (m *Membership) stuck() bool {
	return m.watcher != nil && m.viewed && m.wrote.After(m.heard) &&
		m.cfg.Now().Sub(m.heard) >= m.cfg.Liveness
}

// readAll reads every record directly: the keys of the bucket's stream,
// then each key's value.
func (m *Membership) readAll(ctx context.Context) (map[string]member, error) {
	keys, err := jsapi.New(m.js).Keys(ctx, messages.BucketWorkers)
	if err != nil {
		return nil, err
	}
	recs := map[string]member{}
	for _, key := range keys {
		e, err := m.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if id, mem, ok := m.decode(e); ok {
			recs[id] = mem
		}
	}
	return recs, nil
}

func (m *Membership) stopWatch() {
	if m.watcher != nil {
		_ = m.watcher.Stop()
		m.watcher = nil
	}
}

// dropWatch is stopWatch once the watch's context has ended (the run's):
// with the connection down it leaves the watcher to nats.go, which
// unsubscribes it on that context's end, rather than wait for the server
// (see jsapi.StopWatcher).
func (m *Membership) dropWatch() {
	if m.watcher != nil {
		jsapi.StopWatcher(m.js.Conn(), m.watcher)
		m.watcher = nil
	}
}

// apply records what the watch saw of one key.
func (m *Membership) apply(e jetstream.KeyValueEntry) {
	if e == nil {
		return // no initial values are asked for
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.recs, e.Key())
		return
	}
	if id, mem, ok := m.decode(e); ok {
		m.recs[id] = mem
	} else {
		delete(m.recs, id)
	}
}

// decode reads a record, saying so if it is another process's under this
// worker's id.
//
// A heartbeat repeats its worker's lists far more often than it changes
// them: the lists are kept as the bytes they came in, and a list whose
// bytes are those of the member's last record is taken from it instead of
// decoded again (Hosts names every host the worker executes: hundreds).
func (m *Membership) decode(e jetstream.KeyValueEntry) (string, member, bool) {
	id := e.Key()
	var wire struct {
		messages.WorkerRecord
		// These shadow the record's fields of the same names.
		Hosts   json.RawMessage `json:"hosts"`
		Pulling json.RawMessage `json:"pulling"`
		Owned   json.RawMessage `json:"owned"`
	}
	err := json.Unmarshal(e.Value(), &wire)
	rec := wire.WorkerRecord
	prev, had := m.recs[id]
	lists := []struct {
		raw, prevRaw json.RawMessage
		into, prev   *[]string
	}{
		{wire.Hosts, prev.rawHosts, &rec.Hosts, &prev.rec.Hosts},
		{wire.Pulling, prev.rawPulling, &rec.Pulling, &prev.rec.Pulling},
		{wire.Owned, prev.rawOwned, &rec.Owned, &prev.rec.Owned},
	}
	same := had
	for _, l := range lists {
		if err != nil {
			break
		}
		if had && bytes.Equal(l.raw, l.prevRaw) {
			*l.into = *l.prev
			continue
		}
		same = false
		if len(l.raw) > 0 {
			err = json.Unmarshal(l.raw, l.into)
		}
	}
	if err != nil || rec.ID != id {
		m.cfg.Log.Warn("worker record unreadable: ignored", "key", id, "err", err)
		return id, member{}, false
	}
	if id == m.self.ID && !rec.Started.Equal(m.self.Started) && m.cfg.Now().Sub(m.twin) >= topology.MissingLogEvery {
		m.cfg.Log.Error("another worker runs with this worker's id: give each worker its own (--id)", "id", id, "other_started", rec.Started)
		m.twin = m.cfg.Now()
	}
	mem := member{rec: rec, stored: e.Created(), rawHosts: wire.Hosts, rawPulling: wire.Pulling, rawOwned: wire.Owned}
	if same {
		mem.pulls = prev.pulls
	} else {
		mem.pulls = pullSet(rec)
	}
	return id, mem, true
}

// Run claims the hosts the worker pulls without a pin, writes the record,
// then heartbeats and follows the membership until ctx is done, telling
// each host whether to pull it as the membership changes.
func (m *Membership) Run(ctx context.Context) {
	defer m.strays.wg.Wait() // they end with ctx
	defer m.dropWatch()
	m.claim(ctx)
	m.beat(ctx, messages.WorkerActive) // what it pulls now
	t := time.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	for {
		var updates <-chan jetstream.KeyValueEntry
		if m.watcher != nil {
			updates = m.watcher.Updates()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.beat(ctx, messages.WorkerActive)
			if m.stuck() {
				m.cfg.Log.Warn("worker records: the watch delivered nothing since this worker's last write; watching and reading them again",
					"silent", m.cfg.Now().Sub(m.heard).Round(time.Millisecond))
				m.stopWatch()
			}
			if m.watcher == nil || !m.viewed {
				// Bounded like a beat: the loop must go on beating.
				rctx, cancel := context.WithTimeout(ctx, max(m.cfg.Heartbeat, time.Second))
				m.refresh(rctx, ctx)
				cancel()
			}
			m.reconcile()
			m.claim(ctx)
			m.lookForStrays(ctx)
			continue
		case f := <-m.strays.seen:
			m.judgeStray(ctx, f)
			continue
		case <-m.kick:
			m.beat(ctx, messages.WorkerActive)
			continue
		case e, ok := <-updates:
			if !ok {
				if ctx.Err() == nil {
					m.cfg.Log.Warn("worker records: watch ended; watching again")
				}
				m.stopWatch()
				continue
			}
			m.heard = m.cfg.Now()
			m.apply(e)
		}
		m.reconcile()
	}
}

// reconcile computes the assignment and tells each host run whether to
// pull: its share, and, so that no host is left without an owner, any host
// whose assigned worker, live by its record, has not been pulling it for
// Liveness (its record does not list it): a worker that cannot pull a host
// must not leave it unowned. Such a backup ends once the assigned worker
// pulls the host (the pin decides meanwhile who owns it).
func (m *Membership) reconcile() {
	if !m.viewed {
		for h, c := range m.cfg.Hosts {
			m.wanted[h] = true
			c.Want(true)
		}
		return
	}
	now := m.cfg.Now()
	live := liveMembers(m.recs, m.self, now, m.cfg.Liveness)
	owners := m.assignment(live)
	var share, backup []string
	for h, c := range m.cfg.Hosts {
		owner := owners[h]
		mine := owner == m.self.ID
		if mine || m.pulls(owner, h) {
			delete(m.idle, h)
		} else if io, ok := m.idle[h]; !ok || io.id != owner {
			m.idle[h] = idleOwner{owner, now}
		} else if now.Sub(io.since) >= m.cfg.Liveness {
			backup = append(backup, h)
		}
		pull := mine || slices.Contains(backup, h)
		m.wanted[h] = pull
		c.Want(pull)
		if mine {
			share = append(share, h)
		}
	}
	slices.Sort(share)
	slices.Sort(backup)
	ids := make([]string, 0, len(live))
	for _, r := range live {
		if len(r.Hosts) > 0 {
			ids = append(ids, r.ID)
		}
	}
	if !slices.Equal(share, m.share) || !slices.Equal(ids, m.shared) {
		m.cfg.Log.Info("hosts shared", "workers", ids, "mine", share)
		m.share, m.shared = share, ids
		m.mine.Store(&share)
	}
	if !slices.Equal(backup, m.backup) {
		if len(backup) > 0 {
			m.cfg.Log.Warn("pulling hosts whose assigned worker does not pull them", "hosts", backup)
		}
		m.backup = backup
	}
}

// pulls reports whether worker id's record says it pulls (or owns) host.
func (m *Membership) pulls(id, host string) bool {
	mem, ok := m.recs[id]
	if !ok {
		return false
	}
	if mem.pulls != nil {
		_, ok := mem.pulls[host]
		return ok
	}
	return slices.Contains(mem.rec.Pulling, host) || slices.Contains(mem.rec.Owned, host)
}

// pullSet is the set of the hosts rec says its worker pulls or owns.
func pullSet(rec messages.WorkerRecord) map[string]struct{} {
	s := make(map[string]struct{}, len(rec.Pulling)+len(rec.Owned))
	for _, h := range rec.Pulling {
		s[h] = struct{}{}
	}
	for _, h := range rec.Owned {
		s[h] = struct{}{}
	}
	return s
}

// assignment is assign(live), computed again only when the live members,
// or the hosts they can execute, are not those of the last one. Every
// worker's heartbeat has every worker reconcile, and assign hashes and
// sorts every pair of a host and a worker, for an assignment that changes
// only when a worker comes or goes (BenchmarkMembershipReconcile).
func (m *Membership) assignment(live []messages.WorkerRecord) map[string]string {
	same := m.assignedOwners != nil && slices.EqualFunc(live, m.assignedFrom, func(a, b messages.WorkerRecord) bool {
		return a.ID == b.ID && slices.Equal(a.Hosts, b.Hosts)
	})
	if !same {
		m.assignedOwners = assign(live)
		m.assignedFrom = make([]messages.WorkerRecord, len(live))
		for i, r := range live {
			m.assignedFrom[i] = messages.WorkerRecord{ID: r.ID, Hosts: r.Hosts}
		}
	}
	return m.assignedOwners
}

// claim publishes a claim (see Claim) for every host the worker pulls
// without a pin.
func (m *Membership) claim(ctx context.Context) {
	for h, c := range m.cfg.Hosts {
		if c.Pulling() && m.wanted[h] && c.Pin() == "" {
			Claim(ctx, m.js, m.cfg.Subjects, h, m.cfg.Log)
		}
	}
}
