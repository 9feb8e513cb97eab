package rotation

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"proxyfleet/messages"
)

// Selector narrows a pick.
type Selector struct {
	// Labels must all match the proxy's (from its latest state event): a
	// proxy whose labels are not known yet never matches a Selector with
	// labels.
	Labels map[string]string
	// Exclude are proxy ids not to pick (a failover's tried ones).
	Exclude []string
}

func (s Selector) String() string {
	switch {
	case len(s.Labels) == 0 && len(s.Exclude) == 0:
		return "any proxy"
	case len(s.Exclude) == 0:
		return fmt.Sprintf("labels %v", s.Labels)
	case len(s.Labels) == 0:
		return fmt.Sprintf("excluding %v", s.Exclude)
	}
	return fmt.Sprintf("labels %v excluding %v", s.Labels, s.Exclude)
}

// candidatesLocked returns the smallest set that holds every member sel
// may match (nil if none can): every member for no labels, else the set
// of the label pair with the fewest members, and that label's key (every
// member of the set has it). With r.mu held.
func (r *Rotation) candidatesLocked(sel Selector) (*set, string) {
	if len(sel.Labels) == 0 {
		return r.idx.all, ""
	}
	var best *set
	var bestKey string
	for k, v := range sel.Labels {
		s := r.idx.labels[k][v]
		if s == nil {
			return nil, ""
		}
		if best == nil || len(s.items) < len(best.items) {
			best, bestKey = s, k
		}
	}
	return best, bestKey
}

// matches reports whether m has every label of sel but key (which the set
// it comes from vouches for) and is not excluded.
func matches(m *member, sel Selector, key string) bool {
	if len(sel.Labels) > 1 {
		for k, v := range sel.Labels {
			if k == key {
				continue
			}
			if got, ok := m.p.Labels[k]; !ok || got != v {
				return false
			}
		}
	}
	return len(sel.Exclude) == 0 || !slices.Contains(sel.Exclude, m.p.ID)
}

// coolingLocked reports whether m is in its cooldown at now, and until
// when. With r.mu held (read).
func (r *Rotation) coolingLocked(m *member, now time.Time) (time.Time, bool) {
	if len(r.cool) == 0 {
		return time.Time{}, false
	}
	until, ok := r.cool[m.p.ID]
	return until, ok && now.Before(until)
}

// Pick chooses a proxy that matches sel by the configured strategy,
// passing over the proxies in their cooldown unless only they match. It
// fails with an error wrapping ErrEmpty when none matches. It is O(1) for
// round-robin and random picks of a rotation without cooldowns or
// exclusions (the walk stops at the first match), O(matching proxies) at
// worst, and allocates nothing on success.
func (r *Rotation) Pick(sel Selector) (Proxy, error) {
	r.picks.Add(1)
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, key := r.candidatesLocked(sel)
	if s == nil || len(s.items) == 0 {
		return r.emptyLocked(sel)
	}
	n := len(s.items)
	var start int
	if r.cfg.Strategy == Random {
		start = rand.IntN(n)
	} else {
		start = int(s.rr.Add(1)-1) % n
	}
	var now time.Time
	if len(r.cool) > 0 {
		now = r.cfg.Now()
	}
	var best, cooled *member
	var bestLoad int64
	var cooledUntil time.Time
	for i := range n {
		m := s.items[(start+i)%n]
		if !matches(m, sel, key) {
			continue
		}
		if until, ok := r.coolingLocked(m, now); ok {
			if cooled == nil || until.Before(cooledUntil) {
				cooled, cooledUntil = m, until
			}
			continue
		}
		if r.cfg.Strategy != LeastBusy {
			return m.p, nil
		}
		load := m.inflight.Load()
		if best == nil || load < bestLoad {
			best, bestLoad = m, load
			if load <= 0 {
				break // none is idler
			}
		}
	}
	if best != nil {
		return best.p, nil
	}
	if cooled != nil {
		return cooled.p, nil // the only ones that match: better than none
	}
	return r.emptyLocked(sel)
}

func (r *Rotation) emptyLocked(sel Selector) (Proxy, error) {
	r.emptyPicks.Add(1)
	return Proxy{}, fmt.Errorf("%w %s (%d in the rotation)", ErrEmpty, sel, len(r.idx.all.items))
}

// PickSession chooses the proxy for key among those that match sel, by
// rendezvous hashing (highest random weight) of key and each proxy's id:
// a key stays on its proxy while that proxy stays in the rotation (and is
// not excluded or in its cooldown), and when a proxy leaves only the keys
// it held move, each to its next-highest weight. Proxies in their cooldown
// are passed over unless only they match. O(matching proxies), no
// allocation on success.
func (r *Rotation) PickSession(key string, sel Selector) (Proxy, error) {
	r.picks.Add(1)
	kh := hashString(key)
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, key := r.candidatesLocked(sel)
	if s == nil || len(s.items) == 0 {
		return r.emptyLocked(sel)
	}
	if len(sel.Labels) <= 1 && len(sel.Exclude) == 0 && len(r.cool) == 0 {
		// Every member of the set matches: walk the hashes alone.
		best, bestW := 0, mix(kh^s.hashes[0])
		for i, h := range s.hashes[1:] {
			if w := mix(kh ^ h); w > bestW {
				best, bestW = i+1, w
			}
		}
		return s.items[best].p, nil
	}
	var now time.Time
	if len(r.cool) > 0 {
		now = r.cfg.Now()
	}
	var best, cooled *member
	var bestW, cooledW uint64
	for i, m := range s.items {
		if !matches(m, sel, key) {
			continue
		}
		w := mix(kh ^ s.hashes[i])
		if _, ok := r.coolingLocked(m, now); ok {
			if cooled == nil || w > cooledW {
				cooled, cooledW = m, w
			}
			continue
		}
		if best == nil || w > bestW {
			best, bestW = m, w
		}
	}
	if best != nil {
		return best.p, nil
	}
	if cooled != nil {
		return cooled.p, nil
	}
	return r.emptyLocked(sel)
}

// hashString is FNV-1a of s, mixed (FNV's low bits avalanche poorly).
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}

// mix is the finalizer of splitmix64: a bijection whose output bits each
// depend on every input bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Acquire counts a request in flight on p until release is called, for
// least-busy picks. release is idempotent. A proxy not in the rotation
// counts nothing.
func (r *Rotation) Acquire(p Proxy) (release func()) {
	r.mu.RLock()
	m := r.idx.members[p.ID]
	r.mu.RUnlock()
	if m == nil {
		return func() {}
	}
	m.inflight.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			m.inflight.Add(-1)
		}
	}
}

// maxReason bounds Report.Reason.
const maxReason = 256

// Report says that p failed this process: it publishes a messages.Report
// on <prefix>.report.<id> (core NATS: health probes the proxy at once, and
// only its own probe can take the proxy out), and starts p's cooldown
// here, so picks pass it over meanwhile unless only it matches. The
// cooldown starts even if the publish fails.
func (r *Rotation) Report(p Proxy, reason string) error {
	if !messages.ValidID(p.ID) {
		return fmt.Errorf("rotation: report: invalid proxy id %q", p.ID)
	}
	now := r.cfg.Now()
	if r.cfg.Cooldown > 0 {
		r.mu.Lock()
		r.cool[p.ID] = now.Add(r.cfg.Cooldown)
		if now.After(r.nextPrune) {
			for id, until := range r.cool {
				if !now.Before(until) {
					delete(r.cool, id)
				}
			}
			r.nextPrune = now.Add(r.cfg.Cooldown)
		}
		r.mu.Unlock()
	}
	body, err := json.Marshal(messages.Report{
		V: messages.Version, ID: p.ID, Addr: p.Addr, Reason: cut(reason, maxReason),
		By: r.cfg.Reporter, At: now.UTC(),
	})
	if err == nil {
		err = r.nc.Publish(r.subj.Report(p.ID), body)
	}
	if err != nil {
		r.reportErrors.Add(1)
		return fmt.Errorf("rotation: report %s: %w", p.ID, err)
	}
	r.reports.Add(1)
	r.log.Debug("reported a proxy", "id", p.ID, "addr", p.Addr, "reason", reason)
	return nil
}

// cut returns s cut to at most n bytes, at a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
