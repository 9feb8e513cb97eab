package pool

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// hostRoom is what placement knows of one host: its room from its record
// in PROXY_HOSTS (or the config's max_proxies when it has none yet) and
// whether it is quarantined.
type hostRoom struct {
	name        string
	used, max   int
	quarantined bool
	// unknown: its record could not be read this pass; it is skipped
	// rather than guessed at.
	unknown bool
}

func (h hostRoom) free() int { return h.max - h.used }

// placer chooses the host of each new member of one pool during a pass:
// anti-affinity first (the fewest live members of this pool), then the
// most free room, then the name, so every controller ranks alike. It
// counts what it placed, so a pass that makes several members spreads
// them.
type placer struct {
	hosts   []hostRoom
	members map[string]int // live members of this pool by host
	allowed map[string]bool
}

// newPlacer ranks hosts for a pool whose live members are on memberHosts;
// allowed, if not empty, is the pool's spec.hosts.
func newPlacer(hosts []hostRoom, memberHosts []string, allowed []string) *placer {
	p := &placer{hosts: slices.Clone(hosts), members: map[string]int{}}
	for _, h := range memberHosts {
		p.members[h]++
	}
	if len(allowed) > 0 {
		p.allowed = map[string]bool{}
		for _, h := range allowed {
			p.allowed[h] = true
		}
	}
	return p
}

// place returns the host for one more member, or "" and why none can take
// it.
func (p *placer) place() (string, string) {
	best := -1
	for i, h := range p.hosts {
		if (p.allowed != nil && !p.allowed[h.name]) || h.quarantined || h.unknown || h.free() <= 0 {
			continue
		}
		if best < 0 || p.better(h, p.hosts[best]) {
			best = i
		}
	}
	if best < 0 {
		return "", p.why()
	}
	h := &p.hosts[best]
	h.used++
	p.members[h.name]++
	return h.name, ""
}

func (p *placer) better(a, b hostRoom) bool {
	if c := cmp.Compare(p.members[a.name], p.members[b.name]); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(a.free(), b.free()); c != 0 {
		return c > 0
	}
	return a.name < b.name
}

// why says why no host can take a member: "no room on any host: h1 full
// (20 of 20), h2 quarantined".
func (p *placer) why() string {
	var parts []string
	for _, h := range p.hosts {
		switch {
		case p.allowed != nil && !p.allowed[h.name]:
			continue
		case h.unknown:
			parts = append(parts, h.name+" unreadable")
		case h.quarantined:
			parts = append(parts, h.name+" quarantined")
		default:
			parts = append(parts, fmt.Sprintf("%s full (%d of %d)", h.name, h.used, h.max))
		}
	}
	if len(parts) == 0 {
		return "no host to place on"
	}
	return "no room on any host: " + strings.Join(parts, ", ")
}
