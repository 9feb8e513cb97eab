package health

import (
	"time"

	"proxyfleet/messages"
)

// Probe results folded in, by the rules of Fold's doc: a result counts
// only for the epoch it was taken for, and a passing one brings findings
// that may refuse the proxy.

// ProbeResult is the outcome of one probe of a Target.
type ProbeResult struct {
	ID    string
	Epoch uint64
	OK    bool
	At    time.Time // when the probe started
	// Named is the egress address the probe's request named
	// (Target.Egress), "" if none: the target must see it as Egress.
	Named string

	// What a passing probe found besides (see Findings); ignored for a
	// failing one.
	Egress   string // the address the target saw the request come from, "" if not reported
	Reported bool   // the target reported the request it received: Leak is the verdict on it
	Leak     string // why the proxy is leaky, "" if the report shows nothing
	Open     string // the open check: OpenRefused, OpenAnswered, OpenInconclusive, or "" if none
}

// Reasons of refused proxies (CheckRecord.Reason): ReasonOpen is an open
// proxy's; ReasonMismatch starts that of a proxy whose requests left from
// an address its plan did not give it.
const (
	ReasonOpen     = "open proxy: answered a request without credentials"
	ReasonMismatch = "egress mismatch"
)

// ApplyProbe folds one probe result in and reports whether the rotation
// changed (a proxy entered or left, or the egress of one in it changed). A
// result for another epoch than the proxy's current one (its address
// changed, it was deleted or stopped being a candidate), or older than the
// last result applied, is ignored.
func (f *Fold) ApplyProbe(r ProbeResult) (changed bool) {
	f.stats.Probes++
	p := f.proxies[r.ID]
	if p == nil || p.addr == "" || p.epoch != r.Epoch || r.At.Before(p.lastProbe) {
		f.stats.ProbesIgnored++
		return false
	}
	p.lastProbe = r.At
	at := r.At.UTC()
	if now := f.now(); at.After(now) {
		at = now.UTC()
	}
	verdict, reason, egress := f.verdict(p), f.reason(p), p.egress
	if r.OK {
		p.passes++
		p.fails = 0
		f.findings(p, r)
	} else {
		p.fails++
		p.passes = 0
	}
	if r.Named != "" && r.OK && p.mismatch() == "" {
		// The next probe names the next address; a failed or
		// mismatched one is named again until a probe passes through it
		// and leaves from it.
		p.egressTurn++
	}
	if v := f.verdict(p); v != verdict || f.reason(p) != reason || p.egress != egress {
		f.checksGen++
		f.markCheck(p)
		p.checkAt = at
		if v != verdict {
			switch v {
			case messages.VerdictOpen:
				f.stats.RefusedOpen++
			case messages.VerdictLeaky:
				f.stats.RefusedLeaky++
			case messages.VerdictMismatch:
				f.stats.RefusedMismatch++
			}
		}
	}
	changed = p.inRotation && p.egress != egress
	if changed {
		f.touch(p)
	}
	switch {
	case p.inRotation && (f.refused(p) || (f.Fall > 0 && p.fails >= f.Fall)):
		// Refused (found open or leaky): out at once, and probed on at
		// the rounds' cadence, so a fix brings it back. Or fallen.
		f.leave(p)
		changed = true
		if p.state != messages.StateRunning {
			// Out while on grace: nothing to probe until it
			// reports running again.
			f.forget(p)
		}
	case !p.inRotation && f.Rise > 0 && p.passes >= f.Rise && p.state == messages.StateRunning &&
		p.graceUntil.IsZero() && f.admissible(p):
		f.enter(p, at)
		f.admitted(p)
		changed = true
	}
	if changed {
		f.stats.Changes++
	}
	return changed
}
