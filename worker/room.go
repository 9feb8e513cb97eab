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

// Room: each host's record in PROXY_HOSTS holds the set of proxies that
// hold room on it (messages.HostRecord.Proxies). The invariant is that a
// domain exists on a host only for a proxy in the host's set, and the set
// never grows past the host's max_proxies:
//
//   - intake reserves (adds the proxy, if there is room) before it records a
//     desired state placing the proxy on the host;
//   - the executor checks the reservation (taking it again if it went) right
//     before it creates a domain, under the proxy's lock;
//   - a proxy's room is released only once its domain is gone from the
//     host: by the host's executor after a delete or a move away removed it,
//     and by the owner's reconciliation (see reconcileRoom).
//
// Every change is a compare-and-set of the whole record, retried on
// conflict, so concurrent intakes on any number of workers never both take
// the last place. A release names the command it acts for and leaves a
// reservation made by a newer command alone, so a create placing the proxy
// here again while its delete runs keeps its room.

// errFull says a host has no room for another proxy (see fullError).
var errFull = errors.New("no room")

// fullError is a host with no room for another proxy: no place under its
// max_proxies, or no free address of its plan (addr, wrapping
// addrplan.ErrNoAddress).
type fullError struct {
	host       string
	n, maxRoom int
	addr       error
}

func (e *fullError) Error() string {
	if e.addr != nil {
		return e.addr.Error()
	}
	return fmt.Sprintf("host %s is full (%d of %d proxies)", e.host, e.n, e.maxRoom)
}

func (e *fullError) Unwrap() error { return e.addr }

// note is how placement names the refusal among others.
func (e *fullError) note() string {
	if e.addr != nil {
		return e.host + " has no free address"
	}
	return fmt.Sprintf("%s full (%d of %d)", e.host, e.n, e.maxRoom)
}

func (e *fullError) Is(target error) bool { return target == errFull }

// reserve gives proxy id room on host for the command of seq. A proxy that
// holds room there already keeps it (the newer seq is recorded); another
// needs a free place, unless force (its domain is there already, so it
// takes room whatever the count). No room is an error wrapping errFull.
func (w *Worker) reserve(ctx context.Context, host, id string, seq uint64, force bool) error {
	_, err := w.reserveSlots(ctx, host, id, seq, force)
	return err
}

// reserveSlots is reserve, returning the address slots the proxy holds on
// a host with a plan (none without one).
func (w *Worker) reserveSlots(ctx context.Context, host, id string, seq uint64, force bool) (addrplan.Slots, error) {
	var slots addrplan.Slots
	plan := w.catalog.Plans[host]
	err := w.updateHost(ctx, host, func(rec *messages.HostRecord) error {
		var err error
		slots, err = reserveEdit(rec, host, id, seq, w.catalog.maxProxies(host), force, plan, time.Now())
		return err
	})
	return slots, err
}

// reserveEdit is reserve's change of the record, room its max_proxies and
// plan its address plan (nil: none). On a host with a plan, room comes
// with slots: a proxy that holds room and no slots gets them, and no free
// slot is no room (a fullError wrapping addrplan.ErrNoAddress), whatever
// force says: a proxy is never given an address another holds. It returns
// the slots the proxy holds.
func reserveEdit(rec *messages.HostRecord, host, id string, seq uint64, room int, force bool, plan *addrplan.Plan, now time.Time) (addrplan.Slots, error) {
	r, ok := rec.Proxies[id]
	var slots addrplan.Slots
	hasSlots := false
	if plan != nil {
		var err error
		if slots, hasSlots, err = heldSlots(rec, id); err != nil {
			return addrplan.Slots{}, err
		}
	}
	if ok && r >= seq && (plan == nil || hasSlots) {
		return slots, errNoChange
	}
	if !ok && len(rec.Proxies) >= room && !force {
		return addrplan.Slots{}, &fullError{host: host, n: len(rec.Proxies), maxRoom: room}
	}
	if plan != nil && !hasSlots {
		var err error
		if slots, err = assignFree(rec, id, plan, now); err != nil {
			var full *addrplan.FullError
			if errors.As(err, &full) {
				return addrplan.Slots{}, &fullError{host: host, n: len(rec.Proxies), maxRoom: room, addr: err}
			}
			return addrplan.Slots{}, err
		}
	}
	if !ok || r < seq {
		rec.Proxies[id] = seq
	}
	return slots, nil
}

// assignFree gives proxy id, which holds no slots in rec, free slots of
// plan, and records them in rec. Where the assignments are in the form
// they are written in, only the proxies' slots and the spaces are read,
// and the proxy's pair is put in among the others, not every pair decoded
// and written anew: a create on a host with a plan does this, and the
// whole did cost most of a reservation. The record is the same either
// way.
func assignFree(rec *messages.HostRecord, id string, plan *addrplan.Plan, now time.Time) (addrplan.Slots, error) {
	if add, ok := rec.Addresses.Adding(id); ok {
		slots, err := plan.AssignFree(&add.Spaces, add.Held, now)
		if err != nil || slots == (addrplan.Slots{}) {
			return slots, err
		}
		rec.Addresses = add.With(messages.AddrSlots{V4: slots.V4, V6: slots.V6})
		return slots, nil
	}
	st, err := addrsOf(rec)
	if err != nil {
		return addrplan.Slots{}, err
	}
	slots, err := plan.Assign(&st, id, now)
	if err != nil {
		return addrplan.Slots{}, err
	}
	rec.Addresses = messages.EncodeAddrs(st)
	return slots, nil
}

// addrsOf parses rec's address assignments, an error naming the host if
// they are malformed.
func addrsOf(rec *messages.HostRecord) (messages.AddrState, error) {
	st, err := rec.Addresses.Decode()
	if err != nil {
		return st, fmt.Errorf("host record of %s: %w", rec.Host, err)
	}
	return st, nil
}

// heldSlots returns the slots id holds in rec's address assignments,
// without decoding them all where their form allows (messages.HostAddrs.Held),
// an error naming the host if they are malformed.
func heldSlots(rec *messages.HostRecord, id string) (addrplan.Slots, bool, error) {
	a, ok, err := rec.Addresses.Held(id)
	if err != nil {
		return addrplan.Slots{}, false, fmt.Errorf("host record of %s: %w", rec.Host, err)
	}
	return addrplan.Slots{V4: a.V4, V6: a.V6}, ok, nil
}

// release frees id's room on host for the command of seq, whose removal of
// the proxy from the host is done. A reservation made by a newer command
// stays.
func (w *Worker) release(ctx context.Context, host, id string, seq uint64) error {
	return w.updateHost(ctx, host, func(rec *messages.HostRecord) error {
		r, ok := rec.Proxies[id]
		if !ok || r > seq {
			return errNoChange
		}
		delete(rec.Proxies, id)
		if rec.Addresses.IsZero() {
			return nil
		}
		st, err := addrsOf(rec)
		if err != nil {
			return err
		}
		if addrplan.Release(&st, id, time.Now()) {
			rec.Addresses = messages.EncodeAddrs(st)
		}
		return nil
	})
}

// ensureRoom checks, right before the executor creates d's domain, that d
// holds room here, taking it again if it went (a reservation released by a
// reconciliation while its intake stalled, or a PROXY_HOSTS made anew). A
// present domain is being replaced: it holds its room whatever the count.
//
// On a host with a plan it also checks the record against the domains
// known here (see roomKnown.lost and roomKnown.clash): a record that lost
// the room of one of them, or slots that would give d an address one of
// them has, fails the attempt (transient, wrapping errRecordLost) and
// makes the host's work wait for a reconciliation that records every
// domain listed here again (awaitRoomKnown), so the retry gets slots no
// domain here has.
//
// It returns the network the proxy's address slots give (the zero Network
// on a host without a plan).
func (e *executor) ensureRoom(ctx context.Context, d *messages.Desired, present bool) (fleet.Network, error) {
	plan := e.w.catalog.Plans[e.host]
	rec, _, rerr := e.w.readHost(ctx, e.host)
	if rerr == nil && plan != nil {
		if other, ok := e.known.lost(&rec, d.ID); ok {
			return fleet.Network{}, e.recordLost(d.ID, other, "its room")
		}
	}
	// Releases happen under the proxy's lock, which this holds: a
	// reservation read here stays until the create is done. Slots a
	// reconciliation moved from the proxy to a domain found here are the
	// exception: a read (of a replica that is behind) may still show them,
	// so such a proxy takes its slots by compare-and-set, on the record as
	// it is.
	if rerr == nil && !e.known.wasMoved(d.ID) {
		if r, ok := rec.Proxies[d.ID]; ok && r >= d.Seq {
			if plan == nil {
				return fleet.Network{}, nil
			}
			if slots, ok, err := heldSlots(&rec, d.ID); err == nil && ok {
				return e.slotsFor(plan, d.ID, slots)
			}
		}
	}
	slots, err := e.w.reserveSlots(ctx, e.host, d.ID, d.Seq, present)
	if errors.Is(err, errFull) {
		return fleet.Network{}, fleet.Permanent(fmt.Errorf("create %s: %w", d.ID, err))
	}
	if err != nil {
		return fleet.Network{}, fleet.Transient(err)
	}
	if plan == nil {
		return fleet.Network{}, nil
	}
	return e.slotsFor(plan, d.ID, slots)
}

// errRecordLost says the host's record lost the room or slots of a domain
// known to be here.
var errRecordLost = errors.New("the host's record lost a domain that is here")

// slotsFor is the network slots give proxy id, about to be made here,
// unless a domain known here has one of them (see roomKnown.clash): then
// the record lost that domain's slots, and the attempt fails (recordLost).
// Slots it gives are noted as the proxy's domain's.
func (e *executor) slotsFor(plan *addrplan.Plan, id string, slots addrplan.Slots) (fleet.Network, error) {
	if other, ok := e.known.clash(id, slots); ok {
		return fleet.Network{}, e.recordLost(id, other, "its slots")
	}
	e.known.note(id, slots)
	return planNetwork(plan, slots), nil
}

// recordLost makes the host's work wait for a reconciliation (see
// awaitRoomKnown) and returns the transient error that fails the attempt
// of proxy id: the record lost what of domain other.
func (e *executor) recordLost(id, other, what string) error {
	if e.known.done.CompareAndSwap(true, false) {
		e.w.log.Warn("the host's record lost a domain that is here: its domains are recorded again before any is made",
			"host", e.host, "id", id, "domain", other, "lost", what)
	}
	return fleet.Transient(fmt.Errorf("create %s: %w (%s of %s)", id, errRecordLost, what, other))
}

// planNetwork is the network slots give under plan; the zero Network
// without a plan.
func planNetwork(plan *addrplan.Plan, slots addrplan.Slots) fleet.Network {
	if plan == nil {
		return fleet.Network{}
	}
	return plan.Network(slots)
}

// reconcileRoom makes the host's reservations match what is there, after
// an observation pass listed insts (the host's domains of ours): a domain
// with no reservation gets one (its room is taken, whatever the count),
// and on a host with a plan a domain whose proxy holds no slots takes the
// slots its guest has (see recordFound); a reservation of a proxy with no
// domain here whose desired state does not place it here is released.
// That frees the room a crash left (an executor that removed a proxy and
// died before releasing, a create that reserved and then lost to a newer
// command). A reservation whose command is not recorded yet (intake
// reserves first) is released only when passes at least two AckWaits
// apart find it so: by then its command has been given up, or retried
// (and a retry reserves again, with its own seq).
//
// insts, listed after since (roomKnown.mark), are also the domains known
// here from now on (roomKnown.listed).
//
// It returns an error when the room or slots of a domain in insts may be
// missing from the record (the record, or a domain, unreadable); nil
// says the record holds them all, and lets the host's work through
// awaitRoomKnown.
func (e *executor) reconcileRoom(ctx context.Context, insts []fleet.Instance, since uint64) error {
	w := e.w
	rec, _, err := w.readHost(ctx, e.host)
	if err != nil {
		w.log.Debug("reconcile room", "host", e.host, "err", err)
		return fmt.Errorf("reconcile room on %s: %w", e.host, err)
	}
	e.known.listed(w.catalog.Plans[e.host], insts, since, rec.Proxies)
	var st messages.AddrState
	plan := w.catalog.Plans[e.host]
	if plan != nil {
		if st, err = addrsOf(&rec); err != nil {
			return fmt.Errorf("reconcile room: %w", err)
		}
	}
	var errs []error
	present := map[string]bool{}
	for _, in := range insts {
		present[in.ID] = true
		_, room := rec.Proxies[in.ID]
		_, slots := addrplan.Held(&st, in.ID)
		if room && (plan == nil || slots) || ctx.Err() != nil {
			continue
		}
		if err := e.recordFound(ctx, in.ID); err != nil {
			w.log.Debug("reconcile room", "host", e.host, "id", in.ID, "err", err)
			errs = append(errs, fmt.Errorf("record domain %s: %w", in.ID, err))
		}
	}
	pending := map[string]uint64{}
	for id, seq := range rec.Proxies {
		if present[id] || ctx.Err() != nil {
			continue
		}
		if err := e.releaseStale(ctx, id, seq, pending); err != nil {
			w.log.Debug("reconcile room", "host", e.host, "id", id, "err", err)
		}
	}
	e.unrecorded.keep(pending)
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return fmt.Errorf("reconcile room on %s: %w", e.host, err)
	}
	e.known.done.Store(true)
	return nil
}

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
