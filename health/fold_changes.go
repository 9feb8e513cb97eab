package health

import (
	"slices"
	"strings"

	"proxyfleet/messages"
)

// What of the fold changed since the publisher last looked (the dirty
// ids), and the entries it looks at: the publisher's per-change work is
// O(the ids marked), never O(fleet).

// touch marks p's entry as possibly changed.
func (f *Fold) touch(p *proxyState) {
	if f.dirty == nil {
		f.dirty = make(map[string]struct{})
	}
	f.dirty[p.id] = struct{}{}
}

// TakeDirty calls fn with every id whose rotation entry may have changed
// since the last call (an entry, an exit, or a change of its address,
// host, labels, egress or since; and some that did not change), and
// empties the set. What a proxy's entry is now, Entry says. O(ids).
func (f *Fold) TakeDirty(fn func(id string)) {
	for id := range f.dirty {
		fn(id)
	}
	// A new map rather than clear: iterating a map costs its capacity,
	// and a burst of 50,000 changes must not make every later drain
	// walk 50,000 empty slots.
	f.dirty = nil
}

// Dirty is how many ids TakeDirty would give.
func (f *Fold) Dirty() int { return len(f.dirty) }

// Entry returns id's entry in the rotation, if it is in.
func (f *Fold) Entry(id string) (messages.RotationEntry, bool) {
	p := f.proxies[id]
	if p == nil || !p.inRotation {
		return messages.RotationEntry{}, false
	}
	return messages.RotationEntry{ID: id, Addr: p.addr, Host: p.host, Since: p.since, Egress: p.egress, Labels: p.labels, EgressAddrs: p.egressAddrs}, true
}

// Snapshot returns the rotation sorted by id. It never returns nil, so it
// encodes as [] and not null.
func (f *Fold) Snapshot() []messages.RotationEntry {
	out := make([]messages.RotationEntry, 0, f.inRot)
	for id, p := range f.proxies {
		if p.inRotation {
			out = append(out, messages.RotationEntry{ID: id, Addr: p.addr, Host: p.host, Since: p.since, Egress: p.egress, Labels: p.labels, EgressAddrs: p.egressAddrs})
		}
	}
	slices.SortFunc(out, func(a, b messages.RotationEntry) int { return strings.Compare(a.ID, b.ID) })
	return out
}
