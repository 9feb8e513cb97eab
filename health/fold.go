package health

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"proxyfleet/messages"
)

// Fold is the rotation as a function of the state events seen so far. It
// does no I/O, starts no goroutine and reads the time only through Now, so
// it is tested with plain values. It is not safe for concurrent use; its
// owner serialises calls.
//
// Rules, per proxy id:
//   - an event whose seq is lower than or equal to the last one seen for
//     that id is ignored (duplicates, redeliveries, late arrivals);
//   - running with an IP and a port puts the proxy in the rotation at
//     ip:port; Since is when it entered (the event's time); a running event
//     with another address moves it and counts as a change;
//   - failed, deleting and deleted take it out and forget its address; its
//     seq stays as a tombstone so that an older event arriving late cannot
//     bring it back;
//   - provisioning (or running without an address) for a proxy in the
//     rotation starts its grace: it keeps its last address and place until
//     Grace has passed since that event, then Tick demotes it. With Grace 0
//     it is demoted at once. A proxy not in the rotation just records it.
//   - an event with an unknown state, a wrong version or no id is ignored.
type Fold struct {
	// Grace is how long a proxy in the rotation keeps its place after it
	// reports provisioning without an address (a guest agent restart, the
	// open half of H3). Zero demotes it at once.
	Grace time.Duration
	// Now is the fold's clock, used to bound event times from the future
	// and to start a grace whose event carries no time. Nil means time.Now.
	Now func() time.Time

	proxies map[string]*proxyState
	stats   FoldStats
}

// FoldStats counts what the fold did.
type FoldStats struct {
	Events  uint64 // events given to Apply
	Ignored uint64 // events that were stale, duplicate or not understood
	Changes uint64 // calls of Apply or Tick that changed the rotation
}

// proxyState is what the fold keeps of one proxy: its last seen event and
// its place in the rotation.
type proxyState struct {
	seq   uint64
	state string
	host  string
	ip    string
	port  int
	at    time.Time // time of the last event

	inRotation bool
	addr       string    // the address in the rotation, while in it
	since      time.Time // when it entered the rotation
	graceUntil time.Time // non-zero while it keeps its place in grace
}

// NewFold returns an empty fold with the given grace and clock (nil: time.Now).
func NewFold(grace time.Duration, now func() time.Time) *Fold {
	return &Fold{Grace: grace, Now: now}
}

func (f *Fold) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

// eventTime is the time an event happened: its own time, but never later
// than the fold's clock (a worker clock running ahead must not lengthen a
// grace or date an entry in the future).
func (f *Fold) eventTime(ev messages.StateEvent) time.Time {
	now := f.now()
	if ev.At.IsZero() || ev.At.After(now) {
		return now.UTC()
	}
	return ev.At.UTC()
}

// Addr is the rotation address of ip and port ("ip:port", "[v6]:port").
func Addr(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// Stats returns the fold's counters.
func (f *Fold) Stats() FoldStats { return f.stats }

// Seq returns the last seq seen for id (0 if none), tombstones included.
func (f *Fold) Seq(id string) uint64 {
	if p := f.proxies[id]; p != nil {
		return p.seq
	}
	return 0
}

// Apply folds one event in and reports whether the rotation changed.
func (f *Fold) Apply(ev messages.StateEvent) (changed bool) {
	f.stats.Events++
	changed, ok := f.apply(ev)
	if !ok {
		f.stats.Ignored++
	}
	if changed {
		f.stats.Changes++
	}
	return changed
}

func (f *Fold) apply(ev messages.StateEvent) (changed, ok bool) {
	if ev.V != messages.Version || ev.ID == "" {
		return false, false
	}
	switch ev.State {
	case messages.StateProvisioning, messages.StateRunning, messages.StateFailed,
		messages.StateDeleting, messages.StateDeleted:
	default:
		return false, false
	}
	if f.proxies == nil {
		f.proxies = make(map[string]*proxyState)
	}
	p := f.proxies[ev.ID]
	if p == nil {
		p = &proxyState{}
		f.proxies[ev.ID] = p
	} else if ev.Seq <= p.seq {
		return false, false
	}
	at := f.eventTime(ev)
	moved := p.host != ev.Host
	p.seq, p.state, p.host, p.at = ev.Seq, ev.State, ev.Host, at

	switch {
	case ev.State == messages.StateRunning && ev.IP != "" && ev.Port > 0:
		p.ip, p.port = ev.IP, ev.Port
		addr := Addr(ev.IP, ev.Port)
		p.graceUntil = time.Time{}
		if !p.inRotation {
			p.inRotation, p.addr, p.since = true, addr, at
			return true, true
		}
		if p.addr != addr || moved {
			// Moved: a new address is a new entry for clients.
			p.addr, p.since = addr, at
			return true, true
		}
		return false, true

	case ev.State == messages.StateRunning || ev.State == messages.StateProvisioning:
		// Not usable now, but maybe only for a moment (a guest agent
		// restart reports provisioning with no IP). Keep the last
		// address while in grace.
		if ev.IP != "" {
			p.ip, p.port = ev.IP, ev.Port
		}
		if !p.inRotation {
			return false, true
		}
		if p.graceUntil.IsZero() {
			p.graceUntil = at.Add(f.Grace)
		}
		if !f.now().Before(p.graceUntil) {
			p.demote()
			return true, true
		}
		return false, true

	default: // failed, deleting, deleted: out, and forget all but the seq.
		was := p.inRotation
		p.demote()
		p.ip, p.port = "", 0
		return was, true
	}
}

func (p *proxyState) demote() {
	p.inRotation, p.addr, p.since, p.graceUntil = false, "", time.Time{}, time.Time{}
}

// Tick demotes the proxies whose grace has passed by now and reports
// whether the rotation changed.
func (f *Fold) Tick(now time.Time) (changed bool) {
	for _, p := range f.proxies {
		if p.inRotation && !p.graceUntil.IsZero() && !now.Before(p.graceUntil) {
			p.demote()
			changed = true
		}
	}
	if changed {
		f.stats.Changes++
	}
	return changed
}

// NextDeadline returns the earliest end of a running grace, if any: the
// time Tick should next be called.
func (f *Fold) NextDeadline() (time.Time, bool) {
	var next time.Time
	for _, p := range f.proxies {
		if p.inRotation && !p.graceUntil.IsZero() && (next.IsZero() || p.graceUntil.Before(next)) {
			next = p.graceUntil
		}
	}
	return next, !next.IsZero()
}

// InGrace reports whether id is in the rotation on grace.
func (f *Fold) InGrace(id string) bool {
	p := f.proxies[id]
	return p != nil && p.inRotation && !p.graceUntil.IsZero()
}

// GraceLen is how many proxies in the rotation are on grace.
func (f *Fold) GraceLen() int {
	n := 0
	for _, p := range f.proxies {
		if p.inRotation && !p.graceUntil.IsZero() {
			n++
		}
	}
	return n
}

// Len is the size of the rotation.
func (f *Fold) Len() int {
	n := 0
	for _, p := range f.proxies {
		if p.inRotation {
			n++
		}
	}
	return n
}

// Snapshot returns the rotation sorted by id. It never returns nil, so it
// encodes as [] and not null.
func (f *Fold) Snapshot() []messages.RotationEntry {
	out := make([]messages.RotationEntry, 0, len(f.proxies))
	for id, p := range f.proxies {
		if p.inRotation {
			out = append(out, messages.RotationEntry{ID: id, Addr: p.addr, Host: p.host, Since: p.since})
		}
	}
	slices.SortFunc(out, func(a, b messages.RotationEntry) int { return strings.Compare(a.ID, b.ID) })
	return out
}
