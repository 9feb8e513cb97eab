package gateway

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// HeaderEgress is set on the request to a proxy whose host's plan gave
// it addresses (the address the request is to leave from) and on the
// answer to the client (the address it left from). A client's own is
// dropped.
const HeaderEgress = messages.HeaderEgress

// egressFor is the address of p that a request of o leaves from, among
// those of family (rotation.IPv4, IPv6, NoFamily for none, AnyFamily for
// all: the family is decided before, TargetFamily) that skip (nil: none)
// does not refuse: with egress-rotate, the next of p's addresses for the
// request's session (or for p); with a session, the session's own
// (rendezvous hashing: the same for as long as p has it and skip takes
// it; else the next by the same hash, so a session moves only for the
// site its address is banned for); else one at random. Invalid for a
// proxy without addresses, or none of family: the proxy then leaves from
// the address it chooses itself (its own egress, which skip is asked
// about). ok false: skip refuses every address p may leave from.
func (g *Gateway) egressFor(p Proxy, o options, family int, skip func(netip.Addr) bool) (a netip.Addr, ok bool) {
	if skip != nil {
		q, filtered, refused := allowed(p, family, skip)
		if refused {
			return netip.Addr{}, false
		}
		if filtered {
			p, family = q, rotation.AnyFamily // q has those of family only
		}
	}
	switch {
	case len(p.EgressAddrs) == 0 || family == rotation.NoFamily:
		return netip.Addr{}, true
	case o.rotate:
		return rotation.EgressAt(p, g.turns.next(p.ID, o.session), family), true
	case o.session != "":
		return rotation.SessionEgress(p, o.session, family), true
	}
	return rotation.RandomEgress(p, family), true
}

// allowed is p with only the addresses of family that skip does not
// refuse (filtered; not when it refuses none: no allocation then);
// refused says skip refuses every address p may leave from: all of
// family, or its own egress when it has none of family.
func allowed(p Proxy, family int, skip func(netip.Addr) bool) (q Proxy, filtered, refused bool) {
	of, skipped := 0, 0
	for _, a := range p.EgressAddrs {
		if rotation.InFamily(a, family) {
			of++
			if skip(a) {
				skipped++
			}
		}
	}
	if of == 0 {
		own := ownEgress(p)
		return p, false, own.IsValid() && skip(own)
	}
	if skipped == 0 {
		return p, false, false
	}
	if skipped == of {
		return p, false, true
	}
	out := make([]netip.Addr, 0, of-skipped)
	for _, a := range p.EgressAddrs {
		if rotation.InFamily(a, family) && !skip(a) {
			out = append(out, a)
		}
	}
	p.EgressAddrs = out
	return p, true, false
}

// egressLine is the HeaderEgress field of a head, CRLF included; "" for
// no address. An address is all it carries (netip's text form).
func egressLine(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return HeaderEgress + ": " + a.String() + "\r\n"
}

// appendEgressLine appends egressLine(a) to b.
func appendEgressLine(b []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return b
	}
	b = append(b, HeaderEgress+": "...)
	b = a.AppendTo(b)
	return append(b, "\r\n"...)
}

// maxTurns bounds the rotation counters kept: past it they start over
// (a rotating client then may get an address twice in a row, once).
const maxTurns = 1 << 16

// turns counts the requests that asked to rotate, per proxy and session,
// so each gets the proxy's next address.
type turns struct {
	mu sync.Mutex
	m  map[string]*atomic.Uint64
}

func (t *turns) next(proxy, session string) uint64 {
	key := proxy + "\x00" + session
	t.mu.Lock()
	c := t.m[key]
	if c == nil {
		if t.m == nil || len(t.m) >= maxTurns {
			t.m = map[string]*atomic.Uint64{}
		}
		c = new(atomic.Uint64)
		t.m[key] = c
	}
	t.mu.Unlock()
	return c.Add(1)
}
