package health

import (
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	"proxyfleet/messages"
)

// Target is a proxy to probe: its candidate address, the epoch to give
// back with the result, whether the probe must also check that the
// proxy refuses a request without credentials (see Fold.CheckOpen), and
// the egress address its request names (messages.HeaderEgress), if any.
type Target struct {
	ID        string
	Addr      string
	Epoch     uint64
	CheckOpen bool
	// Egress is the address of the proxy's plan the probe's request is
	// to leave from, "" for none (see Fold.EgressFamilies): the target
	// must see the request come from it.
	Egress string
}

// Families is a set of address families.
type Families uint8

// The address families.
const (
	FamilyIPv4 Families = 1 << iota
	FamilyIPv6
)

// has reports whether fs holds the family of a.
func (fs Families) has(a netip.Addr) bool {
	if a.Unmap().Is4() {
		return fs&FamilyIPv4 != 0
	}
	return fs&FamilyIPv6 != 0
}

// FamilyName is the name of the family of the address s in the metrics:
// "ipv4", "ipv6", or "none" for "" (or anything not an address).
func FamilyName(s string) string {
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return familyNone
	case a.Unmap().Is4():
		return familyIPv4
	}
	return familyIPv6
}

const (
	familyIPv4 = "ipv4"
	familyIPv6 = "ipv6"
	familyNone = "none"
)

var familyNames = []string{familyIPv4, familyIPv6, familyNone}

// maxEgressPrefixBits bounds the addresses a prefix of an egress list may
// stand for, as messages.ExpandEgress does (2^9 > messages.MaxEgress).
const maxEgressPrefixBits = 9

// egressChoice returns the address the k-th probe of a proxy whose cycle
// starts at start names: the ((start+k) mod n)-th of the addresses of its
// egress list (items, as messages.CompactEgress writes them) whose family
// is in fams, n being how many there are; "" when there is none. So over
// any n probes in a row every such address is named once. An item that is neither an
// address nor a prefix of at most 2^9 addresses is skipped. It allocates
// nothing.
func egressChoice(items []string, fams Families, start, k uint64) string {
	n := uint64(0)
	for _, s := range items {
		n += egressItemLen(s, fams)
	}
	if n == 0 {
		return ""
	}
	k = (start%n + k%n) % n
	for _, s := range items {
		m := egressItemLen(s, fams)
		if k >= m {
			k -= m
			continue
		}
		if !strings.Contains(s, "/") {
			return netip.MustParseAddr(s).Unmap().String()
		}
		a := netip.MustParsePrefix(s).Addr()
		for ; k > 0; k-- {
			a = a.Next()
		}
		return a.String()
	}
	return ""
}

// egressItemLen is how many addresses of a family in fams the item s of
// an egress list stands for.
func egressItemLen(s string, fams Families) uint64 {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || !fams.has(a) {
			return 0
		}
		return 1
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Masked() != p || !fams.has(p.Addr()) {
		return 0
	}
	bits := p.Addr().BitLen() - p.Bits()
	if bits > maxEgressPrefixBits {
		return 0
	}
	return 1 << bits
}

// egressFor is the address p's next probe names: the mismatched one
// while there is one to name again (pinned), else the next of its cycle.
func (f *Fold) egressFor(p *proxyState) string {
	if f.EgressFamilies == 0 || len(p.egressAddrs) == 0 {
		return ""
	}
	if a := f.pinned(p); a != "" {
		return a
	}
	return egressChoice(p.egressAddrs, f.EgressFamilies, f.egressStart(p.id), p.egressTurn)
}

// pinned is the address p's probes must name again, "" for none: the one
// a request found mismatched named, while it is still an address of p's
// plan of a family probes name.
func (f *Fold) pinned(p *proxyState) string {
	if p.mismatch() == "" || p.mismatchNamed() == "" || !messages.EgressContains(p.egressAddrs, p.mismatchNamed()) {
		return ""
	}
	if a, err := netip.ParseAddr(p.mismatchNamed()); err != nil || !f.EgressFamilies.has(a) {
		return ""
	}
	return p.mismatchNamed()
}

// egressStart is where id's cycle starts (see Fold.EgressStart).
func (f *Fold) egressStart(id string) uint64 {
	if f.EgressStart != nil {
		return f.EgressStart(id)
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// Targets returns the proxies to probe, sorted by id: every candidate
// (running with an address, or in the rotation, on grace included) but
// the sim driver's, which have no address to probe.
func (f *Fold) Targets() []Target {
	now := f.now()
	out := make([]Target, 0, len(f.proxies))
	for id, p := range f.proxies {
		if p.addr != "" && !p.sim {
			out = append(out, Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, now), Egress: f.egressFor(p)})
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
	return Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, f.now()), Egress: f.egressFor(p)}, true
}

// Target returns id's target if it is a candidate to probe now: running
// at an address (or in the rotation on grace), not the sim driver's. A
// report of the proxy asks for that probe (see report.go).
func (f *Fold) Target(id string) (Target, bool) {
	p := f.proxies[id]
	if p == nil || p.addr == "" || p.sim {
		return Target{}, false
	}
	return Target{ID: id, Addr: p.addr, Epoch: p.epoch, CheckOpen: f.needOpen(p, f.now()), Egress: f.egressFor(p)}, true
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
