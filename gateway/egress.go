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
// those of family (rotation.IPv4, IPv6, or AnyFamily for a name): with
// egress-rotate, the next of p's addresses for the request's session (or
// for p); with a session, the session's own (rendezvous hashing: the same
// for as long as p has it); else one at random. Invalid for a proxy
// without addresses, or none of family: the proxy then leaves from the
// address it chooses itself.
func (g *Gateway) egressFor(p Proxy, o options, family int) netip.Addr {
	switch {
	case len(p.EgressAddrs) == 0:
		return netip.Addr{}
	case o.rotate:
		return rotation.EgressAt(p, g.turns.next(p.ID, o.session), family)
	case o.session != "":
		return rotation.SessionEgress(p, o.session, family)
	}
	return rotation.RandomEgress(p, family)
}

// egressLine is the HeaderEgress field of a head, CRLF included; "" for
// no address. An address is all it carries (netip's text form).
func egressLine(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return HeaderEgress + ": " + a.String() + "\r\n"
}

// familyOf is the address family a target host needs (rotation.FamilyOf).
func familyOf(host string) int { return rotation.FamilyOf(host) }

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
