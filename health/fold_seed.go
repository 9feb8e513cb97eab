package health

import (
	"time"

	"proxyfleet/messages"
)

// Starting from what is published (Fold's doc): a restarting process
// seeds the rotation it loaded, and a process taking over adopts what the
// previous publisher had admitted, so neither empties the rotation.

// Seed puts id in the rotation at addr as a proxy that has already risen,
// unless the fold knows id already: the membership published before the
// process started (PROXY_ROTATION). The proxy then follows its events and
// probes as any other. It reports whether it was seeded.
func (f *Fold) Seed(id, addr string, now time.Time) bool {
	if id == "" || addr == "" || f.proxies[id] != nil {
		return false
	}
	p := f.get(id)
	p.seeded = true
	f.candidate(p, addr)
	p.passes = f.Rise
	f.enter(p, now.UTC())
	f.stats.Changes++
	return true
}

// DropUnseen takes out the seeded proxies no event has confirmed: once the
// events are caught up, a proxy they do not know is gone (its deleted
// event aged out), whatever the bucket said. It reports whether the
// rotation changed.
func (f *Fold) DropUnseen() (changed bool) {
	for id, p := range f.proxies {
		if p.seeded {
			f.leave(p)
			f.resetChecks(p) // probed meanwhile: its record goes too
			delete(f.proxies, id)
			changed = true
		}
	}
	if changed {
		f.stats.Changes++
	}
	return changed
}

// Adopt puts id back in the rotation as risen if the fold has it as a
// running candidate at addr but not in the rotation: what a standby does
// when it takes over, for the proxies the previous publisher had admitted
// (it read them from PROXY_ROTATION) and its own probes have not yet
// caught up with. Fall failing probes take it out again; one this
// process found open or leaky is not adopted. It reports whether the
// rotation changed.
func (f *Fold) Adopt(id, addr string, now time.Time) bool {
	p := f.proxies[id]
	if p == nil || p.inRotation || p.addr != addr || p.state != messages.StateRunning || !p.graceUntil.IsZero() || f.refused(p) {
		return false
	}
	p.passes, p.fails = max(p.passes, f.Rise), 0
	p.runningAt = time.Time{} // not an admission of its running event (latency.go)
	f.enter(p, now.UTC())
	f.stats.Changes++
	return true
}
