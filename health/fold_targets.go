package health

import (
	"slices"
	"strings"

	"proxyfleet/messages"
)

// Target is a proxy to probe: its candidate address and the epoch to give
// back with the result.
type Target struct {
	ID    string
	Addr  string
	Epoch uint64
}

// Targets returns the proxies to probe, sorted by id: every candidate
// (running with an address, or in the rotation, on grace included).
func (f *Fold) Targets() []Target {
	out := make([]Target, 0, len(f.proxies))
	for id, p := range f.proxies {
		if p.addr != "" {
			out = append(out, Target{ID: id, Addr: p.addr, Epoch: p.epoch})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Rising returns id's target if it is a candidate on its way into the
// rotation that has not failed since its last pass: running at an address,
// not in the rotation, fewer than Rise passes in a row and no failure
// since. Such a proxy is probed again at once rather than at the next
// round, so that a new proxy enters the rotation as soon as it passes
// Rise probes in a row; one that fails waits for the rounds (a dead proxy
// is never probed in a loop).
func (f *Fold) Rising(id string) (Target, bool) {
	p := f.proxies[id]
	if p == nil || f.Rise <= 0 || p.addr == "" || p.inRotation || p.state != messages.StateRunning ||
		!p.graceUntil.IsZero() || p.fails > 0 || p.passes >= f.Rise {
		return Target{}, false
	}
	return Target{ID: id, Addr: p.addr, Epoch: p.epoch}, true
}

// TargetsLen is len(Targets()), without making them.
func (f *Fold) TargetsLen() int {
	n := 0
	for _, p := range f.proxies {
		if p.addr != "" {
			n++
		}
	}
	return n
}
