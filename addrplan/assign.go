package addrplan

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"proxyfleet/messages"
)

// The decisions below change a host's AddrState (in its record, written
// by compare-and-set of the whole record), so they are pure: the caller
// reads the record, decides and writes, and decides again on a fresh read
// when another writer won. A decision that returns an error has not
// changed the state.

// Assign gives proxy id its slots in st and returns them. A proxy keeps
// the slots it holds (also one its plan no longer has: its guest is
// configured with it); a family of the plan where it holds none gets a
// free slot, least recently used first: one never given before, else the
// one freed longest ago, and never one freed less than ReuseAfter before
// now. No slot free in a family of the plan is an error wrapping
// ErrNoAddress (a *FullError), and then st is unchanged.
func (p *Plan) Assign(st *messages.AddrState, id string, now time.Time) (Slots, error) {
	cur := st.Slots[id]
	s, err := p.assign(st, cur, func(f func(messages.AddrSlots) int) slotSet { return held(st, f) }, now)
	if err != nil || s == (Slots{V4: cur.V4, V6: cur.V6}) {
		return s, err
	}
	if st.Slots == nil {
		st.Slots = map[string]messages.AddrSlots{}
	}
	st.Slots[id] = messages.AddrSlots{V4: s.V4, V6: s.V6}
	return s, nil
}

// AssignFree is Assign for a proxy that holds no slot, on a state whose
// proxies hold the slots of held (st.Slots is neither read nor changed):
// it returns the slots the proxy is given and changes st's spaces as
// Assign does; the caller records the proxy's slots beside held
// (messages.AddrsAdding.With). Zero Slots and no error: the plan has no
// slot to give of any family, and st is unchanged.
func (p *Plan) AssignFree(st *messages.AddrState, held []messages.AddrSlots, now time.Time) (Slots, error) {
	return p.assign(st, messages.AddrSlots{}, func(f func(messages.AddrSlots) int) slotSet {
		var set slotSet
		for _, a := range held {
			set.add(f(a))
		}
		return set
	}, now)
}

// assign picks the slots of a proxy holding cur (see Assign) and records
// in st's spaces that they are taken, heldBy giving the slots of a family
// that proxies hold; st.Slots is left to the caller.
func (p *Plan) assign(st *messages.AddrState, cur messages.AddrSlots, heldBy func(func(messages.AddrSlots) int) slotSet, now time.Time) (Slots, error) {
	s := Slots{V4: cur.V4, V6: cur.V6}
	if s.V4 == 0 && p.v4n > 0 {
		n, err := p.pick(&st.V4, heldBy(func(a messages.AddrSlots) int { return a.V4 }), p.v4n, now, "ipv4")
		if err != nil {
			return Slots{}, err
		}
		s.V4 = n
	}
	if s.V6 == 0 && p.v6n > 0 {
		n, err := p.pick(&st.V6, heldBy(func(a messages.AddrSlots) int { return a.V6 }), p.v6n, now, "ipv6")
		if err != nil {
			return Slots{}, err
		}
		s.V6 = n
	}
	if s == (Slots{V4: cur.V4, V6: cur.V6}) {
		return s, nil
	}
	if s.V4 != cur.V4 {
		take(&st.V4, s.V4)
	}
	if s.V6 != cur.V6 {
		take(&st.V6, s.V6)
	}
	p.prune(st, now)
	return s, nil
}

// Held returns the slots proxy id holds in st.
func Held(st *messages.AddrState, id string) (Slots, bool) {
	a, ok := st.Slots[id]
	return Slots{V4: a.V4, V6: a.V6}, ok
}

// ErrTaken is a slot held by another proxy.
var ErrTaken = errors.New("address held by another proxy")

// Take records that proxy id holds slots s (its domain was found with
// them: a proxy found on the host keeps the addresses its guest has). A
// slot held by another proxy is not taken: the error wraps ErrTaken and
// names both, and st is unchanged.
func (p *Plan) Take(st *messages.AddrState, id string, s Slots, now time.Time) error {
	for other, a := range st.Slots {
		if other == id {
			continue
		}
		if (s.V4 != 0 && a.V4 == s.V4) || (s.V6 != 0 && a.V6 == s.V6) {
			return fmt.Errorf("proxy %s: %w (%s)", id, ErrTaken, other)
		}
	}
	cur := st.Slots[id]
	if cur.V4 == s.V4 && cur.V6 == s.V6 {
		return nil
	}
	if cur.V4 != 0 && cur.V4 != s.V4 {
		free(&st.V4, cur.V4, now)
	}
	if cur.V6 != 0 && cur.V6 != s.V6 {
		free(&st.V6, cur.V6, now)
	}
	take(&st.V4, s.V4)
	take(&st.V6, s.V6)
	if st.Slots == nil {
		st.Slots = map[string]messages.AddrSlots{}
	}
	st.Slots[id] = messages.AddrSlots{V4: s.V4, V6: s.V6}
	p.prune(st, now)
	return nil
}

// Holders lists, sorted, the proxies other than id that hold a slot of s
// in st: those a Take of s for id is refused for.
func Holders(st *messages.AddrState, id string, s Slots) []string {
	var out []string
	for other, a := range st.Slots {
		if other != id && ((s.V4 != 0 && a.V4 == s.V4) || (s.V6 != 0 && a.V6 == s.V6)) {
			out = append(out, other)
		}
	}
	slices.Sort(out)
	return out
}

// Release frees proxy id's slots as of now: they are given again no
// sooner than ReuseAfter later. It says whether id held any.
func (p *Plan) Release(st *messages.AddrState, id string, now time.Time) bool {
	if !Release(st, id, now) {
		return false
	}
	p.prune(st, now)
	return true
}

// Release frees proxy id's slots as of now, on a host whose plan is gone
// from the config (its record still says who held what). It says whether
// id held any.
func Release(st *messages.AddrState, id string, now time.Time) bool {
	a, ok := st.Slots[id]
	if !ok {
		return false
	}
	delete(st.Slots, id)
	if a.V4 != 0 {
		free(&st.V4, a.V4, now)
	}
	if a.V6 != 0 {
		free(&st.V6, a.V6, now)
	}
	if len(st.Slots) == 0 {
		st.Slots = nil
	}
	return true
}

func held(st *messages.AddrState, f func(messages.AddrSlots) int) slotSet {
	var set slotSet
	for _, a := range st.Slots {
		set.add(f(a))
	}
	return set
}

// slotSet is a set of slot numbers, a bit each.
type slotSet []uint64

// add puts slot k in the set; 0 (none) is left out.
func (s *slotSet) add(k int) {
	if k <= 0 {
		return
	}
	i := k / 64
	if i >= len(*s) {
		*s = append(*s, make([]uint64, i+1-len(*s))...)
	}
	(*s)[i] |= 1 << (k % 64)
}

func (s slotSet) has(k int) bool {
	i := k / 64
	return k > 0 && i < len(s) && s[i]&(1<<(k%64)) != 0
}

// pick chooses a free slot of a family of n slots (see Assign) without
// changing sp.
func (p *Plan) pick(sp *messages.SlotSpace, held slotSet, n int, now time.Time, family string) (int, error) {
	next := min(sp.Next, n)
	for k := next + 1; k <= n; k++ {
		if !held.has(k) {
			return k, nil
		}
	}
	best, bestAt := 0, time.Time{}
	cooling := 0
	for k := 1; k <= n; k++ {
		if held.has(k) {
			continue
		}
		at, ok := sp.Freed[k] // absent: freed long ago
		if ok && p.reuse > 0 && now.Sub(at) < p.reuse {
			cooling++
			continue
		}
		if best == 0 || at.Before(bestAt) {
			best, bestAt = k, at
		}
	}
	if best == 0 {
		return 0, &FullError{Host: p.host, Family: family, Held: countIn(held, n), Cooling: cooling, Slots: n}
	}
	return best, nil
}

func countIn(held slotSet, n int) int {
	c := 0
	for k := 1; k <= n && k/64 < len(held); k++ {
		if held.has(k) {
			c++
		}
	}
	return c
}

func take(sp *messages.SlotSpace, k int) {
	if k == 0 {
		return
	}
	delete(sp.Freed, k)
	if len(sp.Freed) == 0 {
		sp.Freed = nil
	}
	sp.Next = max(sp.Next, k)
}

func free(sp *messages.SlotSpace, k int, now time.Time) {
	if sp.Freed == nil {
		sp.Freed = map[int]time.Time{}
	}
	sp.Freed[k] = now
}

// prune drops what no longer decides anything: Next past the plan's
// slots, freed times of slots the plan no longer has, and, while slots
// never given remain (they come first), freed times older than
// ReuseAfter. It returns how many entries it dropped.
func (p *Plan) prune(st *messages.AddrState, now time.Time) int {
	return pruneSpace(&st.V4, p.v4n, p.reuse, now) + pruneSpace(&st.V6, p.v6n, p.reuse, now)
}

func pruneSpace(sp *messages.SlotSpace, n int, reuse time.Duration, now time.Time) int {
	sp.Next = min(sp.Next, n)
	dropped := 0
	for _, k := range sortedKeys(sp.Freed) {
		at := sp.Freed[k]
		if k > n || (sp.Next < n && now.Sub(at) >= reuse) {
			delete(sp.Freed, k)
			dropped++
		}
	}
	if len(sp.Freed) == 0 {
		sp.Freed = nil
	}
	return dropped
}

// Usage is one family's slots on a host as a record says.
type Usage struct {
	Slots, Held, Cooling, Free int
}

// Usage counts the slots of each family: held, freed within ReuseAfter
// of now, and free.
func (p *Plan) Usage(st *messages.AddrState, now time.Time) (v4, v6 Usage) {
	count := func(sp messages.SlotSpace, n int, f func(messages.AddrSlots) int) Usage {
		u := Usage{Slots: n}
		h := held(st, f)
		u.Held = countIn(h, n)
		for k, at := range sp.Freed {
			if k <= n && !h.has(k) && p.reuse > 0 && now.Sub(at) < p.reuse {
				u.Cooling++
			}
		}
		u.Free = n - u.Held - u.Cooling
		return u
	}
	return count(st.V4, p.v4n, func(a messages.AddrSlots) int { return a.V4 }),
		count(st.V6, p.v6n, func(a messages.AddrSlots) int { return a.V6 })
}
