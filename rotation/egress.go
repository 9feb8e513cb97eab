package rotation

import (
	"math/rand/v2"
	"net/netip"
)

// Egress families a target may need: an address literal's, or any for a
// name (the proxy resolves it).
const (
	AnyFamily = 0
	IPv4      = 4
	IPv6      = 6
)

// egressOf are p's egress addresses of family (all for AnyFamily), in
// their order; it allocates only when it filters.
func egressOf(p Proxy, family int) []netip.Addr {
	if family == AnyFamily {
		return p.EgressAddrs
	}
	n := 0
	for _, a := range p.EgressAddrs {
		if (family == IPv4) == a.Is4() {
			n++
		}
	}
	if n == len(p.EgressAddrs) {
		return p.EgressAddrs
	}
	out := make([]netip.Addr, 0, n)
	for _, a := range p.EgressAddrs {
		if (family == IPv4) == a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

// FamilyOf is the address family a target host needs: an address
// literal's (IPv4, IPv6; an IPv6 one in brackets or not), or AnyFamily for
// a name (the proxy resolves it).
func FamilyOf(host string) int {
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	a, err := netip.ParseAddr(host)
	switch {
	case err != nil:
		return AnyFamily
	case a.Is4() || a.Is4In6():
		return IPv4
	}
	return IPv6
}

// SessionEgress is the address of p that session key leaves from, among
// those of family: the one whose rendezvous hash with the key is highest,
// so a session keeps its address for as long as its proxy has it, and a
// proxy's sessions spread over its addresses. Invalid when p has none of
// family.
func SessionEgress(p Proxy, key string, family int) netip.Addr {
	as := egressOf(p, family)
	if len(as) == 0 {
		return netip.Addr{}
	}
	kh := hashString(key)
	best, bestW := 0, uint64(0)
	for i, a := range as {
		if w := mix(kh ^ hashAddr(a)); i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return as[best]
}

// EgressAt is p's address number n of family, counted round its addresses
// (a caller that rotates passes a counter); invalid when p has none.
func EgressAt(p Proxy, n uint64, family int) netip.Addr {
	as := egressOf(p, family)
	if len(as) == 0 {
		return netip.Addr{}
	}
	return as[n%uint64(len(as))]
}

// RandomEgress is one of p's addresses of family, at random; invalid when
// p has none.
func RandomEgress(p Proxy, family int) netip.Addr {
	return EgressAt(p, rand.Uint64(), family)
}

func hashAddr(a netip.Addr) uint64 {
	b := a.As16()
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix(h)
}
