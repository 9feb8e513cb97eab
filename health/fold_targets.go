package health

import (
	"slices"
	"strings"

	"proxyfleet/messages"
)

// Target is a proxy to probe: its candidate address, the epoch to give
// back with the result, and whether the probe must also check that the
// proxy refuses a request without credentials (see Fold.CheckOpen).
type Target struct {
	ID        string
	Addr      string
	Epoch     uint64
	CheckOpen bool
}

// Targets returns the proxies to probe, sorted by id: every candidate
// (running with an address, or in the rotation, on grace included) but
// the sim driver's, which have no address to probe.
func (f *Fold) Targets() []Target {
	now := f.now()
	out := make([]Target, 0, len(f.proxies))
	for id, p := range f.proxies {
		if p.addr != "" && !p.sim {
			out = append(out, Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, now)})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Rising returns id's target if it is a candidate on its way into the
// rotation that has not failed since its last pass: running at an address,
// not in the rotation, fewer than Rise passes in a row, no failure since
// and not refused. Such a proxy is probed again at once rather than at the
// next round, so that a new proxy enters the rotation as soon as it passes
// Rise probes in a row; one that fails, or was found open or leaky, waits
// for the rounds (a dead or refused proxy is never probed in a loop).
func (f *Fold) Rising(id string) (Target, bool) {
	p := f.proxies[id]
	if p == nil || f.Rise <= 0 || p.addr == "" || p.sim || p.inRotation || p.state != messages.StateRunning ||
		!p.graceUntil.IsZero() || p.fails > 0 || p.passes >= f.Rise || f.refused(p) {
		return Target{}, false
	}
	return Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, f.now())}, true
}

// Target returns id's target if it is a candidate to probe now: running
// at an address (or in the rotation on grace), not the sim driver's. A
// report of the proxy asks for that probe (see report.go).
func (f *Fold) Target(id string) (Target, bool) {
	p := f.proxies[id]
	if p == nil || p.addr == "" || p.sim {
		return Target{}, false
	}
	return Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, f.now())}, true
}

// TargetsLen is len(Targets()), without making them.
func (f *Fold) TargetsLen() int { return f.Counts().Targets }

// FoldCounts are the fold's gauges, counted in one pass without
// allocating (a scrape of the metrics).
type FoldCounts struct {
	Targets     int // proxies being probed
	Checks      int // candidates with a check record
	Open, Leaky int // candidates refused, by verdict
	Mismatch    int
}

// Counts counts the fold's gauges: O(proxies), per scrape, not per change.
func (f *Fold) Counts() FoldCounts {
	var c FoldCounts
	for _, p := range f.proxies {
		if p.addr == "" {
			continue
		}
		if !p.sim {
			c.Targets++
		}
		switch f.verdict(p) {
		case "":
		case messages.VerdictOpen:
			c.Open++
			c.Checks++
		case messages.VerdictLeaky:
			c.Leaky++
			c.Checks++
		case messages.VerdictMismatch:
			c.Mismatch++
			c.Checks++
		default:
			c.Checks++
		}
	}
	return c
}
