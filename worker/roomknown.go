package worker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// roomKnown says whether the host's record is known to hold the room and
// slots of every domain on the host (see awaitRoomKnown), and which
// domains are known to be here, with the slots their guests' addresses
// are: those the last reconciliation listed, and those made or removed
// here since its listing began. A domain made or removed by hand since
// is not known, or known still: the first is as at start, and the
// second costs at most one reconciliation more (see lost and clash).
type roomKnown struct {
	done atomic.Bool
	mu   sync.Mutex // held by the reconciliation awaitRoomKnown runs

	movedMu sync.Mutex
	moved   map[string]bool // see moveTo

	domainsMu sync.Mutex
	domains   map[string]knownDomain
	epoch     uint64 // a tick for each listing (mark)
}

// knownDomain is a domain known to be here, with the slots its guest's
// addresses are, or (gone) known to be removed; at is the epoch it was
// noted in.
type knownDomain struct {
	slots addrplan.Slots
	gone  bool
	at    uint64
}

// mark is called right before the host's domains are listed for a
// reconciliation; listed takes what it returns.
func (k *roomKnown) mark() uint64 {
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	k.epoch++
	return k.epoch - 1
}

// listed makes the domains of insts, listed after mark returned since,
// the ones known here, with the slots of plan their egress addresses are.
// A domain noted or forgotten since the listing began stays as noted, and
// so does one noted before that the listing missed while the proxy holds
// room in the record read after the listing (held): its create may still
// be under way.
func (k *roomKnown) listed(plan *addrplan.Plan, insts []fleet.Instance, since uint64, held map[string]uint64) {
	if plan == nil {
		return
	}
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	next := make(map[string]knownDomain, len(insts))
	for id, d := range k.domains {
		if _, room := held[id]; d.at > since || !d.gone && room {
			next[id] = d
		}
	}
	for _, in := range insts {
		if _, ok := next[in.ID]; !ok {
			next[in.ID] = knownDomain{slots: slotsOf(plan, in.Egress), at: since}
		}
	}
	k.domains = next
}

// note records that proxy id's domain is made here with slots.
func (k *roomKnown) note(id string, slots addrplan.Slots) {
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	if k.domains == nil {
		k.domains = map[string]knownDomain{}
	}
	k.domains[id] = knownDomain{slots: slots, at: k.epoch}
}

// forget records that proxy id's domain was removed from here.
func (k *roomKnown) forget(id string) {
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	if k.domains == nil {
		return
	}
	k.domains[id] = knownDomain{gone: true, at: k.epoch}
}

// lost returns a domain known here, other than proxy id's, that holds no
// room in rec (the record deleted, or written anew without it), if any.
func (k *roomKnown) lost(rec *messages.HostRecord, id string) (string, bool) {
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	for other, d := range k.domains {
		if other == id || d.gone {
			continue
		}
		if _, ok := rec.Proxies[other]; !ok {
			return other, true
		}
	}
	return "", false
}

// clash returns a domain known here, other than proxy id's, whose slots
// share one with s (the record lost its slots and gave them to id), if
// any. Slots decide the MAC too (addrplan.Plan.Network), so a proxy whose
// slots clash with none gets no address or MAC of a known domain.
func (k *roomKnown) clash(id string, s addrplan.Slots) (string, bool) {
	k.domainsMu.Lock()
	defer k.domainsMu.Unlock()
	for other, d := range k.domains {
		if other == id || d.gone {
			continue
		}
		if s.V4 != 0 && d.slots.V4 == s.V4 || s.V6 != 0 && d.slots.V6 == s.V6 {
			return other, true
		}
	}
	return "", false
}

// moveTo notes that proxies ids gave their slots up to a domain found here.
func (k *roomKnown) moveTo(ids []string) {
	k.movedMu.Lock()
	defer k.movedMu.Unlock()
	if k.moved == nil {
		k.moved = map[string]bool{}
	}
	for _, id := range ids {
		k.moved[id] = true
	}
}

// wasMoved says, once, whether proxy id gave its slots up since it last
// asked.
func (k *roomKnown) wasMoved(id string) bool {
	k.movedMu.Lock()
	defer k.movedMu.Unlock()
	if !k.moved[id] {
		return false
	}
	delete(k.moved, id)
	return true
}

// awaitRoomKnown returns once a reconciliation since this worker began
// has recorded the room and slots of every domain it listed on the host,
// running one itself if no observation pass has completed one: on a host
// with a plan no work converges before that. A domain the record
// does not show (the record deleted or rewritten, or a crash that left a
// domain its record lost) still has its guest's addresses, and a create
// given one of them by the record would make a second guest with that
// address and MAC. Once it has returned, the record keeps every domain's
// slots for as long as the domain is there, whichever worker writes it:
// a create records them before it makes the domain (ensureRoom), and a
// proxy's slots are freed only once its domain is gone.
//
// Only the record's own loss breaks that while this worker runs: the
// record deleted, or written anew without a domain's room or slots (by
// hand, a restore, a bucket made anew). The creates here find it, right
// before they make a domain (ensureRoom checks the record they read and
// the slots they got against the domains known here), and the first to
// find it closes the gate again: no work on the host converges before a
// reconciliation, as at start, has recorded every domain listed here
// again. Until then intake, on any worker, may still reserve a lost
// domain's slots for a new proxy; the reconciliation moves them back to
// the domain (recordFound) before that proxy's create is let through.
//
// It is called before the work takes its proxy's lock, as the
// reconciliation takes the locks of the proxies it looks at. An error
// (the host's domains or its record unreadable) leaves the work to be
// retried.
func (e *executor) awaitRoomKnown(ctx context.Context) error {
	if e.w.catalog.Plans[e.host] == nil || e.known.done.Load() {
		return nil
	}
	e.known.mu.Lock()
	defer e.known.mu.Unlock()
	if e.known.done.Load() {
		return nil
	}
	since := e.known.mark()
	insts, err := e.prov.List(ctx)
	if err != nil {
		return fmt.Errorf("list %s before its first create: %w", e.host, err)
	}
	return e.reconcileRoom(ctx, insts, since)
}

// unrecordedRoom remembers when the owner first saw each reservation whose
// command was not recorded.
type unrecordedRoom struct {
	mu sync.Mutex
	m  map[string]seenAt
}

type seenAt struct {
	seq uint64
	at  time.Time
}

// since returns when id's reservation of seq was first seen unrecorded.
func (u *unrecordedRoom) since(id string, seq uint64) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]seenAt{}
	}
	s, ok := u.m[id]
	if !ok || s.seq != seq {
		s = seenAt{seq: seq, at: time.Now()}
		u.m[id] = s
	}
	return s.at
}

// keep forgets every reservation but those of pending.
func (u *unrecordedRoom) keep(pending map[string]uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for id, s := range u.m {
		if seq, ok := pending[id]; !ok || seq != s.seq {
			delete(u.m, id)
		}
	}
}

// recordFound records the room of domain id, found here, if it is still
// here under the proxy's lock (its delete may have just released it),
// and on a host with a plan the slots its guest's addresses are, unless
// the proxy holds some.
//
// A domain's addresses are its guest's, whatever the record says: a proxy
// the record gives one of its slots that has no domain here (placed while
// the record had lost the domain's) gives all its slots up in the same
// compare-and-set, keeping its room, and takes others when its create
// reserves. One whose lock is taken, or whose domain is here too, keeps
// them: the found domain takes its room and not the slot, and the
// conflict is counted and logged (the two guests share an address until
// one is deleted).
func (e *executor) recordFound(ctx context.Context, id string) error {
	w := e.w
	unlock, err := w.locks.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	in, err := e.prov.Get(ctx, id)
	switch {
	case isNotFound(err):
		return nil // gone since it was listed
	case err != nil && !fleet.IsTransient(err):
		// Nothing to learn from it by trying again: it is left out, as a
		// domain of someone else's would be.
		w.log.Warn("a domain found with no reservation or slots cannot be read: left out of the record", "host", e.host, "id", id, "err", err)
		return nil
	case err != nil:
		return err
	}
	plan := w.catalog.Plans[e.host]
	var want addrplan.Slots
	if plan != nil {
		want = slotsOf(plan, in.Egress)
	}
	idle := map[string]func(){} // holders of want with no domain here, under their locks
	defer func() {
		for _, unlock := range idle {
			unlock()
		}
	}()
	var roomTaken bool // by any write
	var holders, moved []string
	for try := 0; ; try++ {
		var took bool
		uctx := ctx
		if len(idle) > 0 {
			// The holders' locks are kept until the write has landed or
			// failed: a create of one must not read the record before it.
			uctx = context.WithoutCancel(ctx)
		}
		err = w.updateHost(uctx, e.host, func(rec *messages.HostRecord) error {
			took, holders, moved = false, nil, nil
			if _, ok := rec.Proxies[id]; !ok {
				rec.Proxies[id] = 0
				took = true
			}
			noChange := errNoChange
			if took {
				noChange = nil
			}
			if want == (addrplan.Slots{}) {
				return noChange
			}
			st, err := addrsOf(rec)
			if err != nil {
				return err
			}
			if _, ok := addrplan.Held(&st, id); ok {
				return noChange
			}
			now := time.Now()
			for _, h := range addrplan.Holders(&st, id, want) {
				if idle[h] != nil {
					plan.Release(&st, h, now)
					moved = append(moved, h)
				}
			}
			if err := plan.Take(&st, id, want, now); err != nil {
				holders, moved = addrplan.Holders(&st, id, want), nil
				return noChange // st, changed or not, is not written
			}
			rec.Addresses = messages.EncodeAddrs(st)
			return nil
		})
		roomTaken = roomTaken || err == nil && took
		if err != nil || len(holders) == 0 || try == 2 || !e.lockIdle(ctx, holders, idle) {
			break
		}
	}
	if err != nil {
		return err
	}
	if len(moved) > 0 {
		e.known.moveTo(moved)
		w.log.Info("a domain found with addresses the record gave to proxies with no domain here took them; those get others",
			"host", e.host, "id", id, "from", moved)
	}
	if roomTaken {
		w.log.Info("room taken by a domain with no reservation", "host", e.host, "id", id)
	}
	if len(holders) > 0 && roomTaken {
		w.metrics.addrConflicts.Inc()
		w.log.Warn("a domain found with no reservation has an address another proxy holds", "host", e.host, "id", id, "holders", holders)
	}
	return nil
}

// lockIdle takes the lock of each of holders not in idle whose lock is
// free and adds it to idle (with its unlock) if it has no domain here:
// while it is held no create of it runs. It reports whether it added one.
func (e *executor) lockIdle(ctx context.Context, holders []string, idle map[string]func()) bool {
	added := false
	for _, h := range holders {
		if idle[h] != nil {
			continue
		}
		unlock, ok := e.w.locks.tryLock(h)
		if !ok {
			continue // being converged: it may be making its domain
		}
		if _, err := e.prov.Get(ctx, h); !isNotFound(err) {
			unlock() // there, or unreadable: it keeps its slots
			continue
		}
		idle[h], added = unlock, true
	}
	return added
}

// slotsOf are the slots of plan that give a domain's egress addresses
// (its first address of each family decides).
func slotsOf(plan *addrplan.Plan, egress []netip.Addr) addrplan.Slots {
	var s addrplan.Slots
	for _, a := range egress {
		if s.V4 == 0 && a.Is4() {
			s.V4 = plan.Slot4Of(a)
		}
		if s.V6 == 0 && a.Is6() {
			s.V6 = plan.Slot6Of(a)
		}
	}
	return s
}

// releaseStale releases id's reservation (of the command of seq), unless
// the proxy's desired state places it here or its command may still be on
// its way (then it is added to pending).
func (e *executor) releaseStale(ctx context.Context, id string, seq uint64, pending map[string]uint64) error {
	w := e.w
	unlock, err := w.locks.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	d, err := w.readDesired(ctx, id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	upTo := seq
	switch {
	case d != nil && e.owns(d):
		return nil
	case d == nil || d.Seq < seq:
		pending[id] = seq
		if time.Since(e.unrecorded.since(id, seq)) < 2*w.cfg.AckWait {
			return nil // its command may be on its way
		}
	default:
		upTo = d.Seq
	}
	if _, err := e.prov.Get(ctx, id); !isNotFound(err) {
		return err // there after all (or unreadable): it keeps its room
	}
	if err := w.release(ctx, e.host, id, upTo); err != nil {
		return err
	}
	w.log.Info("released the room of a proxy that is not here", "host", e.host, "id", id)
	return nil
}

// recordHosts makes sure each of hosts has a record saying its room, for
// `proxyfleet hosts` to show before any proxy is placed there.
func (w *Worker) recordHosts(ctx context.Context, hosts []string) {
	for _, h := range hosts {
		rec, rev, err := w.readHost(ctx, h)
		if err == nil && rev != 0 && rec.MaxProxies == w.catalog.maxProxies(h) {
			continue
		}
		if err == nil {
			err = w.updateHost(ctx, h, func(*messages.HostRecord) error { return nil })
		}
		if err != nil {
			w.log.Warn("record host", "host", h, "err", err)
		}
	}
}
