package health

import "time"

// Grace (Fold's doc): a proxy in the rotation that reports provisioning
// from the same command and host keeps its place until Grace has passed.
// onGrace holds those proxies alone, so Tick and NextDeadline cost
// O(proxies on grace), not O(fleet).

// setGrace sets p's grace to end at until (zero: none), keeping onGrace.
func (f *Fold) setGrace(p *proxyState, until time.Time) {
	p.graceUntil = until
	if until.IsZero() {
		delete(f.onGrace, p)
		return
	}
	if f.onGrace == nil {
		f.onGrace = make(map[*proxyState]struct{})
	}
	f.onGrace[p] = struct{}{}
}

// Tick demotes the proxies whose grace has passed by now and reports
// whether the rotation changed.
func (f *Fold) Tick(now time.Time) (changed bool) {
	for p := range f.onGrace {
		if p.inRotation && !p.graceUntil.IsZero() && !now.Before(p.graceUntil) {
			f.leave(p)
			f.forget(p)
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
	for p := range f.onGrace {
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
func (f *Fold) GraceLen() int { return len(f.onGrace) }
