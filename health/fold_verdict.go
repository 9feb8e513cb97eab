package health

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"proxyfleet/messages"
)

// What the probes of a candidate found, and its check record: the
// verdicts of Fold's doc, and the records the package doc's "Checks"
// writes.

// findings keeps what a passing probe found.
func (f *Fold) findings(p *proxyState, r ProbeResult) {
	if r.Egress != "" {
		// The egress shown is where a request naming none, or the
		// proxy's first address (its default), leaves from: a probe
		// naming another one in turn does not change the entry.
		if r.Named == "" || p.egress == "" || r.Named == firstEgress(p.egressAddrs) {
			p.egress = r.Egress
		}
		f.egressFindings(p, r)
	}
	if r.Reported {
		// Only a report clears a leak: a target that reports nothing
		// (an https one, an external page) says nothing either way.
		p.reported = true
		p.setLeak(r.Leak)
	}
	switch r.Open {
	case OpenRefused, OpenAnswered:
		p.openState, p.openAt, p.openPending = r.Open, r.At, false
	case OpenInconclusive:
		// Admits nothing, changes no verdict: the next probe checks again.
		p.openPending = true
	}
}

// egressFindings checks the address a passing probe's request left from
// against p's plan. A proxy whose plan gave it addresses must leave from
// one of them, and from the one a request names (when of the family of the
// target: a request's named address is used only over its family); one
// left to its network's DHCP may leave from any. A mismatch stays until a
// probe naming the same address (none, for one found without a name) sees
// it, or until that address is no longer one to name.
func (f *Fold) egressFindings(p *proxyState, r ProbeResult) {
	if len(p.egressAddrs) == 0 {
		p.setMismatch("", "")
		return
	}
	planned := messages.EgressContains(p.egressAddrs, r.Egress)
	if !planned || (r.Named != "" && r.Egress != r.Named && sameFamily(r.Named, r.Egress)) {
		p.setMismatch(r.Egress, r.Named)
		f.stats.EgressMismatches++
		return
	}
	if p.mismatch() != "" && (r.Named == "" || r.Egress == r.Named) && (r.Named == p.mismatchNamed() || f.pinned(p) == "") {
		p.setMismatch("", "")
	}
}

// firstEgress is the first address of an egress list, "" if none.
func firstEgress(items []string) string {
	if len(items) == 0 {
		return ""
	}
	if p, err := netip.ParsePrefix(items[0]); err == nil {
		return p.Addr().String()
	}
	if a, err := netip.ParseAddr(items[0]); err == nil {
		return a.Unmap().String()
	}
	return ""
}

// sameFamily reports whether a and b are addresses of one family.
func sameFamily(a, b string) bool {
	x, err1 := netip.ParseAddr(a)
	y, err2 := netip.ParseAddr(b)
	return err1 == nil && err2 == nil && x.Unmap().Is4() == y.Unmap().Is4()
}

// refused reports whether p's checks keep it out of the rotation.
func (f *Fold) refused(p *proxyState) bool {
	return p.openState == OpenAnswered || p.leak() != "" || p.mismatch() != ""
}

// admissible reports whether p's checks let it enter the rotation: not
// refused, and with CheckOpen, the last open check was conclusive and
// found it refusing. A sim proxy is never checked.
func (f *Fold) admissible(p *proxyState) bool {
	if p.sim {
		return true
	}
	if f.refused(p) {
		return false
	}
	return !f.CheckOpen || (p.openState == OpenRefused && !p.openPending)
}

// needOpen reports whether p's next probe must check that it refuses a
// request without credentials: with CheckOpen, for a candidate not in the
// rotation (the check admits it), and for one in it whose last conclusive
// check is OpenInterval old, or whose last check was inconclusive.
func (f *Fold) needOpen(p *proxyState, now time.Time) bool {
	if !f.CheckOpen || p.sim {
		return false
	}
	return !p.inRotation || p.openState != OpenRefused || p.openPending || !now.Before(p.openAt.Add(f.OpenInterval))
}

// verdict is the verdict of p's check record, "" while there is nothing
// to record: no finding yet, or (with CheckOpen) no conclusive open check
// and no leak.
func (f *Fold) verdict(p *proxyState) string {
	switch {
	case p.addr == "":
		return ""
	case p.openState == OpenAnswered:
		return messages.VerdictOpen
	case p.leak() != "":
		return messages.VerdictLeaky
	case p.mismatch() != "":
		return messages.VerdictMismatch
	case f.CheckOpen && p.openState == "":
		return "" // not known to refuse: nothing to call ok yet
	case p.openState != "" || p.reported || p.egress != "":
		return messages.VerdictOK
	}
	return ""
}

func (f *Fold) reason(p *proxyState) string {
	var parts []string
	if p.openState == OpenAnswered {
		parts = append(parts, ReasonOpen)
	}
	if p.leak() != "" {
		parts = append(parts, p.leak())
	}
	switch {
	case p.mismatch() == "":
	case p.mismatchNamed() == "":
		parts = append(parts, ReasonMismatch+": its requests left from "+p.mismatch()+", not from an address its plan gave it")
	case messages.EgressContains(p.egressAddrs, p.mismatch()):
		parts = append(parts, ReasonMismatch+": a request naming "+p.mismatchNamed()+" left from "+p.mismatch())
	default:
		parts = append(parts, ReasonMismatch+": a request naming "+p.mismatchNamed()+" left from "+p.mismatch()+", not from an address its plan gave it")
	}
	return strings.Join(parts, "; ")
}

// ChecksGen grows whenever a check record (Checks) appears, changes or
// goes: the publisher writes PROXY_CHECKS when it moved.
func (f *Fold) ChecksGen() uint64 { return f.checksGen }

// markCheck marks p's check record as possibly changed.
func (f *Fold) markCheck(p *proxyState) {
	if f.checksDirty == nil {
		f.checksDirty = make(map[string]struct{})
	}
	f.checksDirty[p.id] = struct{}{}
}

// TakeChecksDirty calls fn with every id whose check record may have
// changed, appeared or gone since the last call, and empties the set:
// what the record is now, CheckState says. O(ids).
func (f *Fold) TakeChecksDirty(fn func(id string)) {
	for id := range f.checksDirty {
		fn(id)
	}
	f.checksDirty = nil // not clear: iterating costs a map's capacity
}

// ChecksDirty is how many ids TakeChecksDirty would give.
func (f *Fold) ChecksDirty() int { return len(f.checksDirty) }

// CheckState returns id's record as a candidate (Verdict "" while there
// is nothing to record yet) and whether it is a candidate at all.
func (f *Fold) CheckState(id string) (messages.CheckRecord, bool) {
	p := f.proxies[id]
	if p == nil || p.addr == "" {
		return messages.CheckRecord{}, false
	}
	return f.record(id, p), true
}

// Checks returns the check records of the candidates that have one (see
// CheckRecord), sorted by id.
func (f *Fold) Checks() []messages.CheckRecord {
	out := make([]messages.CheckRecord, 0)
	for _, c := range f.candidateChecks() {
		if c.Verdict != "" {
			out = append(out, c)
		}
	}
	return out
}

// Check returns id's check record, if it has one.
func (f *Fold) Check(id string) (messages.CheckRecord, bool) {
	p := f.proxies[id]
	if p == nil || f.verdict(p) == "" {
		return messages.CheckRecord{}, false
	}
	return f.record(id, p), true
}

// candidateChecks returns a record for every candidate, sorted by id;
// Verdict "" for one with nothing to record yet.
func (f *Fold) candidateChecks() []messages.CheckRecord {
	out := make([]messages.CheckRecord, 0, len(f.proxies))
	for id, p := range f.proxies {
		if p.addr != "" {
			out = append(out, f.record(id, p))
		}
	}
	slices.SortFunc(out, func(a, b messages.CheckRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (f *Fold) record(id string, p *proxyState) messages.CheckRecord {
	return messages.CheckRecord{V: messages.Version, ID: id, Addr: p.addr, Egress: p.egress,
		Verdict: f.verdict(p), Reason: f.reason(p), At: p.checkAt}
}

// Refused returns how many candidates are refused, by verdict.
func (f *Fold) Refused() (open, leaky, mismatch int) {
	for _, p := range f.proxies {
		switch f.verdict(p) {
		case messages.VerdictOpen:
			open++
		case messages.VerdictLeaky:
			leaky++
		case messages.VerdictMismatch:
			mismatch++
		}
	}
	return open, leaky, mismatch
}
