package gateway

import "sync/atomic"

// unauthGate bounds the connections open at once that have not yet
// presented a valid credential (Config.MaxUnauthenticated): a flood of
// connections that never authenticate holds at most that many, whatever
// else it costs; past it, new ones are closed as they are accepted.
type unauthGate struct {
	max int64
	n   atomic.Int64
}

// unauthSlot is one connection's place under the gate, held from its
// accept until it presents a valid credential or ends. release may be
// called any number of times: the first gives the place back.
type unauthSlot struct {
	gate *unauthGate
	held atomic.Bool
}

// take takes a place for s; false when all are taken.
func (s *unauthSlot) take(g *unauthGate) bool {
	if g.n.Add(1) > g.max {
		g.n.Add(-1)
		return false
	}
	s.gate = g
	s.held.Store(true)
	return true
}

func (s *unauthSlot) release() {
	if s != nil && s.held.CompareAndSwap(true, false) {
		s.gate.n.Add(-1)
	}
}
