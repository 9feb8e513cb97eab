package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

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
