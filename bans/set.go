package bans

import (
	"container/heap"
	"net/netip"
	"time"
)

// DefaultMaxEntries bounds a Set made with a max of 0.
const DefaultMaxEntries = 1 << 20

type pair struct {
	addr netip.Addr
	site string
}

// Set holds bans in memory: O(1) Banned, O(log n) Add, Remove and Expire,
// at most max entries (the ones ending first leave first when it is full).
// It keeps no clock: every call is given now. It is not safe for
// concurrent use; its owner locks it.
type Set struct {
	max  int
	ends map[pair]time.Time
	q    endQueue
}

// NewSet returns an empty Set of at most max entries (0: DefaultMaxEntries).
func NewSet(max int) *Set {
	if max <= 0 {
		max = DefaultMaxEntries
	}
	return &Set{max: max, ends: map[pair]time.Time{}}
}

// Add bans addr for site until until, replacing any end it had (the last
// ban stored wins, so a shorter ban can shorten one). A ban already over
// at now removes it. It reports how many other bans left to make room.
func (s *Set) Add(addr netip.Addr, site string, until, now time.Time) (evicted int) {
	p := pair{addr.Unmap(), site}
	if !until.After(now) {
		s.Remove(addr, site)
		return 0
	}
	if _, ok := s.ends[p]; !ok && len(s.ends) >= s.max {
		s.Expire(now)
		for len(s.ends) >= s.max {
			s.popFirst()
			evicted++
		}
	}
	s.ends[p] = until
	heap.Push(&s.q, queued{p, until})
	s.compact()
	return evicted
}

// Remove lifts the ban of addr for site, if any.
func (s *Set) Remove(addr netip.Addr, site string) {
	delete(s.ends, pair{addr.Unmap(), site})
	s.compact()
}

// Banned reports whether addr is banned for site at now.
func (s *Set) Banned(addr netip.Addr, site string, now time.Time) bool {
	end, ok := s.ends[pair{addr.Unmap(), site}]
	return ok && now.Before(end)
}

// Until is the end of the ban of addr for site, if one is active at now.
func (s *Set) Until(addr netip.Addr, site string, now time.Time) (time.Time, bool) {
	end, ok := s.ends[pair{addr.Unmap(), site}]
	if !ok || !now.Before(end) {
		return time.Time{}, false
	}
	return end, true
}

// Expire drops the bans over at now and returns how many it dropped.
func (s *Set) Expire(now time.Time) (n int) {
	for len(s.q) > 0 && !now.Before(s.q[0].end) {
		q := heap.Pop(&s.q).(queued)
		if end, ok := s.ends[q.p]; ok && end.Equal(q.end) {
			delete(s.ends, q.p)
			n++
		}
	}
	return n
}

// Each calls f for every ban not over at now, in no order. f must not
// change s. O(bans held).
func (s *Set) Each(now time.Time, f func(addr netip.Addr, site string)) {
	for p, end := range s.ends {
		if now.Before(end) {
			f(p.addr, p.site)
		}
	}
}

// Len is the number of bans held (some may be over and not expired yet).
func (s *Set) Len() int { return len(s.ends) }

// Active counts the bans not over at now.
func (s *Set) Active(now time.Time) (n int) {
	for _, end := range s.ends {
		if now.Before(end) {
			n++
		}
	}
	return n
}

// popFirst drops the live ban that ends first.
func (s *Set) popFirst() {
	for len(s.q) > 0 {
		q := heap.Pop(&s.q).(queued)
		if end, ok := s.ends[q.p]; ok && end.Equal(q.end) {
			delete(s.ends, q.p)
			return
		}
	}
}

// compact rebuilds the queue once stale entries (replaced or removed
// bans) outnumber the live ones, so memory follows the bans held.
func (s *Set) compact() {
	if len(s.q) <= 2*len(s.ends)+64 {
		return
	}
	s.q = s.q[:0]
	for p, end := range s.ends {
		s.q = append(s.q, queued{p, end})
	}
	heap.Init(&s.q)
}

type queued struct {
	p   pair
	end time.Time
}

// endQueue is a min-heap of ends.
type endQueue []queued

func (q endQueue) Len() int           { return len(q) }
func (q endQueue) Less(i, j int) bool { return q[i].end.Before(q[j].end) }
func (q endQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *endQueue) Push(x any)        { *q = append(*q, x.(queued)) }
func (q *endQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
