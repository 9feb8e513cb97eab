package rotation

import (
	"math/rand/v2"
	"net/netip"
)

// Egress families: the addresses of a proxy a request may be told to
// leave from.
//
// AnyFamily is every address of the proxy, IPv4 and IPv6 alike: right
// only where the proxy leaves from whichever address it is told. A proxy
// of the fleet (squid) leaves by the address it is told only over the
// family it reaches the target with, so a target given by name must not
// be given AnyFamily: its family is decided first (TargetFamily,
// Families.EgressFamily), and with none decided the proxy is told
// nothing (NoFamily).
//
// NoFamily is none of a proxy's addresses: the proxy leaves from the
// address it chooses itself, as one without addresses does.
const (
	AnyFamily = 0
	IPv4      = 4
	IPv6      = 6
	NoFamily  = -1
)

// InFamily says whether a is of family: IPv4 an IPv4 address, IPv6 any
// other, AnyFamily every one, NoFamily none.
func InFamily(a netip.Addr, family int) bool {
	switch family {
	case AnyFamily:
		return true
	case IPv4:
		return a.Is4()
	case IPv6:
		return !a.Is4()
	}
	return false
}

// egressOf are p's egress addresses of family (all for AnyFamily, none
// for NoFamily), in their order; it allocates only when it filters.
func egressOf(p Proxy, family int) []netip.Addr {
	n := 0
	for _, a := range p.EgressAddrs {
		if InFamily(a, family) {
			n++
		}
	}
	if n == len(p.EgressAddrs) {
		return p.EgressAddrs
	}
	out := make([]netip.Addr, 0, n)
	for _, a := range p.EgressAddrs {
		if InFamily(a, family) {
			out = append(out, a)
		}
	}
	return out
}

// Families are the address families a target name resolves to.
type Families struct{ V4, V6 bool }

// FamiliesOf are the families of addrs (a name's addresses).
func FamiliesOf(addrs []netip.Addr) Families {
	var f Families
	for _, a := range addrs {
		if a.Unmap().Is4() {
			f.V4 = true
		} else {
			f.V6 = true
		}
	}
	return f
}

// EgressFamily is the family of p's addresses a request to a target of
// families f is told to leave from: IPv6 when the target has an IPv6
// address and p an IPv6 address, else IPv4 when the target has an IPv4
// address and p an IPv4 one, else NoFamily (p leaves from its own
// choice: nothing it is told would be used). IPv6 comes first when the
// target has both: a proxy's IPv6 addresses are the many ones (squid
// still may reach such a target over IPv4, and then leaves from its
// IPv4 default: docs/DECISIONS.md).
func (f Families) EgressFamily(p Proxy) int {
	var has4, has6 bool
	for _, a := range p.EgressAddrs {
		if a.Is4() {
			has4 = true
		} else {
			has6 = true
		}
	}
	switch {
	case f.V6 && has6:
		return IPv6
	case f.V4 && has4:
		return IPv4
	}
	return NoFamily
}

// FamilyOf is the address family a target host needs: an address
// literal's (IPv4, IPv6; an IPv6 one in brackets or not), or AnyFamily for
// a name: undecided, not a family to choose from (TargetFamily decides a
// name's).
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
