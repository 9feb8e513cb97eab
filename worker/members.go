package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// membership is the worker's part in sharing the hosts (see share.go): it
// keeps the worker's record in PROXY_WORKERS (a heartbeat every
// Heartbeat), watches everyone's, and tells each host's consumer run
// whether to pull, from the assignment of the live members.
//
// Without a view of the membership (it could not read the records yet) the worker
// pulls every host it can execute, as every worker did before hosts were
// shared: the pins still give each host one owner, only not a fair share.
type membership struct {
	w    *Worker
	kv   jetstream.KeyValue
	self messages.WorkerRecord // its id, hosts and start: fixed
	runs map[string]*consumerRun
	kick chan struct{} // a pin won or lost, a host taken or given up: write the record now

	// Owned by start, then by run, then by drain once run returned.
	watcher jetstream.KeyWatcher
	recs    map[string]member
	viewed  bool                 // it has read the records once
	share   []string             // the hosts assigned to this worker, last computed
	backup  []string             // the hosts it pulls for an assigned worker that does not
	shared  []string             // the ids they were shared over
	idle    map[string]idleOwner // by host not its own: since when its owner has not pulled it
	twin    time.Time            // when a record of this id from another process was last logged
	// The last assignment and the live members it was computed from
	// (their ids and hosts): see assignment.
	assignedFrom   []messages.WorkerRecord
	assignedOwners map[string]string

	viewedOnce atomic.Bool // viewed, for readers outside the run loop (Ready)

	// strays are the looks at the pins of hosts pulled without one
	// (straypin.go).
	strays strayLooks

	// heard is when the view last learnt something (an update of the
	// watch, or a read); wrote, when this worker's record was last
	// written. A watch that has delivered nothing for Liveness since a
	// write it should have seen is stuck (see run).
	heard, wrote time.Time
}

// idleOwner is a host's assigned worker, seen not pulling it since since.
type idleOwner struct {
	id    string
	since time.Time
}

// newMembership binds PROXY_WORKERS, writes the worker's record and reads
// everyone's, then sets each host run's want. A failed write or read is
// logged: the worker runs on and tries again every heartbeat.
func newMembership(ctx, watchCtx context.Context, w *Worker, runs map[string]*consumerRun) (*membership, error) {
	kv, err := w.js.KeyValue(ctx, messages.BucketWorkers)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", messages.BucketWorkers, err)
	}
	m := &membership{
		w: w, kv: kv, runs: runs, kick: make(chan struct{}, 1), recs: map[string]member{}, idle: map[string]idleOwner{},
		strays: newStrayLooks(len(runs)),
		self: messages.WorkerRecord{
			V: 1, ID: w.cfg.ID, State: messages.WorkerActive,
			Hosts: slices.Sorted(maps.Keys(runs)), Started: w.now().UTC(),
		},
	}
	for _, c := range runs {
		c.changed = m.poke
	}
	m.beat(ctx, messages.WorkerActive)
	m.refresh(ctx, watchCtx)
	m.reconcile()
	return m, nil
}

// poke asks run to write the record now.
func (m *membership) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// record is the worker's record as of now.
func (m *membership) record(state string) messages.WorkerRecord {
	r := m.self
	r.State, r.At = state, m.w.now().UTC()
	r.Owned, r.Pins = []string{}, map[string]string{}
	for h, c := range m.runs {
		if c.pulling.Load() {
			r.Pulling = append(r.Pulling, h)
		}
		if pin := c.getPin(); pin != "" {
			r.Owned = append(r.Owned, h)
			r.Pins[h] = pin
		}
	}
	slices.Sort(r.Owned)
	slices.Sort(r.Pulling)
	return r
}

// beat writes the worker's record.
func (m *membership) beat(ctx context.Context, state string) {
	b, err := json.Marshal(m.record(state))
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(m.w.cfg.Heartbeat, time.Second))
	defer cancel()
	if _, err := m.kv.Put(ctx, m.self.ID, b); err != nil {
		if ctx.Err() == nil {
			m.w.log.Warn("write worker record", "bucket", messages.BucketWorkers, "err", err)
		}
		return
	}
	m.wrote = m.w.now()
}

// leave deletes the worker's record: it has stopped. Past ctx it gives up:
// the others count the record dead after Liveness, and the bucket's TTL
// removes it.
func (m *membership) leave(ctx context.Context) {
	m.dropWatch()
	if m.w.js.Conn().IsClosed() {
		return // it ages out
	}
	ctx, cancel := context.WithTimeout(ctx, max(m.w.cfg.Heartbeat, time.Second))
	defer cancel()
	if err := m.kv.Delete(ctx, m.self.ID); err != nil {
		m.w.log.Warn("delete worker record", "bucket", messages.BucketWorkers, "err", err)
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
func (m *membership) refresh(ctx, watchCtx context.Context) {
	m.stopWatch()
	wa, err := m.kv.WatchAll(watchCtx, jetstream.UpdatesOnly())
	if err != nil {
		m.w.log.Warn("watch worker records", "bucket", messages.BucketWorkers, "err", err)
		return
	}
	m.watcher = wa
	recs, err := m.readAll(ctx)
	if err != nil {
		m.w.log.Warn("read worker records", "bucket", messages.BucketWorkers, "err", err)
		if !m.viewed {
			m.w.log.Warn("no view of the other workers yet: pulling every host until there is one")
		}
		return
	}
	m.recs, m.viewed = recs, true
	m.heard = m.w.now()
	m.viewedOnce.Store(true)
}

// stuck reports whether the watch has delivered nothing for Liveness
// though this worker wrote its record since it last did: the watch sees
// every key, this one's own too, so it has stopped delivering (nats.go's
// watch of a loaded server was seen to stall so, without ending: every
// worker then counted the others dead and pulled every host).
func (m *membership) stuck() bool {
	return m.watcher != nil && m.viewed && m.wrote.After(m.heard) &&
		m.w.now().Sub(m.heard) >= m.w.cfg.Liveness
}

// readAll reads every record directly: the keys of the bucket's stream,
// then each key's value.
func (m *membership) readAll(ctx context.Context) (map[string]member, error) {
	keys, err := jsapi.New(m.w.js).Keys(ctx, messages.BucketWorkers)
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

func (m *membership) stopWatch() {
	if m.watcher != nil {
		_ = m.watcher.Stop()
		m.watcher = nil
	}
}

// dropWatch is stopWatch once the watch's context has ended (the run's):
// with the connection down it leaves the watcher to nats.go, which
// unsubscribes it on that context's end, rather than wait for the server
// (see stopWatcher).
func (m *membership) dropWatch() {
	if m.watcher != nil {
		stopWatcher(m.w.js.Conn(), m.watcher)
		m.watcher = nil
	}
}

// apply records what the watch saw of one key.
func (m *membership) apply(e jetstream.KeyValueEntry) {
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
func (m *membership) decode(e jetstream.KeyValueEntry) (string, member, bool) {
	id := e.Key()
	var rec messages.WorkerRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.ID != id {
		m.w.log.Warn("worker record unreadable: ignored", "key", id, "err", err)
		return id, member{}, false
	}
	if id == m.self.ID && !rec.Started.Equal(m.self.Started) && m.w.now().Sub(m.twin) >= topology.MissingLogEvery {
		m.w.log.Error("another worker runs with this worker's id: give each worker its own (--id)", "id", id, "other_started", rec.Started)
		m.twin = m.w.now()
	}
	return id, member{rec: rec, stored: e.Created(), pulls: pullSet(rec)}, true
}

// run heartbeats and follows the membership until ctx is done.
func (m *membership) run(ctx context.Context) {
	defer m.strays.wg.Wait() // they end with ctx
	defer m.dropWatch()
	t := time.NewTicker(m.w.cfg.Heartbeat)
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
				m.w.log.Warn("worker records: the watch delivered nothing since this worker's last write; watching and reading them again",
					"silent", m.w.now().Sub(m.heard).Round(time.Millisecond))
				m.stopWatch()
			}
			if m.watcher == nil || !m.viewed {
				// Bounded like a beat: the loop must go on beating.
				rctx, cancel := context.WithTimeout(ctx, max(m.w.cfg.Heartbeat, time.Second))
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
					m.w.log.Warn("worker records: watch ended; watching again")
				}
				m.stopWatch()
				continue
			}
			m.heard = m.w.now()
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
func (m *membership) reconcile() {
	if !m.viewed {
		for _, c := range m.runs {
			c.want(true)
		}
		return
	}
	now := m.w.now()
	live := liveMembers(m.recs, m.self, now, m.w.cfg.Liveness)
	owners := m.assignment(live)
	var share, backup []string
	for h, c := range m.runs {
		owner := owners[h]
		mine := owner == m.self.ID
		if mine || m.pulls(owner, h) {
			delete(m.idle, h)
		} else if io, ok := m.idle[h]; !ok || io.id != owner {
			m.idle[h] = idleOwner{owner, now}
		} else if now.Sub(io.since) >= m.w.cfg.Liveness {
			backup = append(backup, h)
		}
		c.want(mine || slices.Contains(backup, h))
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
		m.w.log.Info("hosts shared", "workers", ids, "mine", share)
		m.share, m.shared = share, ids
	}
	if !slices.Equal(backup, m.backup) {
		if len(backup) > 0 {
			m.w.log.Warn("pulling hosts whose assigned worker does not pull them", "hosts", backup)
		}
		m.backup = backup
	}
}

// pulls reports whether worker id's record says it pulls (or owns) host.
func (m *membership) pulls(id, host string) bool {
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
// worker's heartbeat (a record renewed every Heartbeat) has every worker
// reconcile, and assign hashes and sorts every pair of a host and a
// worker: with 500 hosts and 10 workers, 5,000 pairs, 3ms and 850 KiB a
// reconcile, five times a second, for an assignment that changes only
// when a worker comes or goes (BenchmarkMembershipReconcile).
func (m *membership) assignment(live []messages.WorkerRecord) map[string]string {
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

// claim publishes a claim for every host the worker pulls without a pin
// (see consumerRun.claim).
func (m *membership) claim(ctx context.Context) {
	for _, c := range m.runs {
		if c.pulling.Load() && c.wanted.Load() && c.getPin() == "" {
			c.claim(ctx)
		}
	}
}
