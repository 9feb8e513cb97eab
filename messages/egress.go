package messages

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// MaxEgress bounds the addresses one proxy's egress list may stand for
// (its IPv4 address and up to 256 IPv6 addresses of its plan).
const MaxEgress = 1 + 256

// CompactEgress writes a proxy's egress addresses as the wire carries
// them (StateEvent.Egress, RotationEntry.EgressAddrs): in their order,
// each run of consecutive addresses that fills an aligned block written
// as that block's prefix ("2001:db8::10/124" for sixteen), any other
// address alone. ExpandEgress reads it back.
func CompactEgress(as []netip.Addr) []string {
	out := make([]string, 0, len(as))
	for i := 0; i < len(as); {
		a := as[i]
		bits := a.BitLen()
		// The longest aligned block starting at a whose addresses all
		// follow in as.
		best := 0
		for size := 1; size <= bits && 1<<size <= len(as)-i; size++ {
			if netip.PrefixFrom(a, bits-size).Masked().Addr() != a || !consecutive(as[i:i+1<<size]) {
				break
			}
			best = size
		}
		if best == 0 {
			out = append(out, a.String())
			i++
			continue
		}
		out = append(out, netip.PrefixFrom(a, bits-best).String())
		i += 1 << best
	}
	return out
}

// consecutive says whether as are one address after another.
func consecutive(as []netip.Addr) bool {
	for j := 1; j < len(as); j++ {
		if as[j] != as[j-1].Next() {
			return false
		}
	}
	return true
}

// EgressContains says whether an egress list written by CompactEgress
// holds addr; false for an addr that is not an address.
func EgressContains(items []string, addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, s := range items {
		if !strings.Contains(s, "/") {
			if b, err := netip.ParseAddr(s); err == nil && b == a {
				return true
			}
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}

// ExpandEgress reads an egress list written by CompactEgress: each item an
// address or a prefix standing for all of its addresses, MaxEgress
// addresses at most in all.
func ExpandEgress(items []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, expandedLen(items))
	for i, s := range items {
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("egress[%d]: %q is not an address", i, s)
			}
			out = append(out, a)
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Masked() != p {
			return nil, fmt.Errorf("egress[%d]: %q is not a prefix", i, s)
		}
		n := p.Addr().BitLen() - p.Bits()
		if n > 9 || len(out)+(1<<n) > MaxEgress {
			return nil, fmt.Errorf("egress[%d]: %s: more than %d addresses", i, s, MaxEgress)
		}
		for a, k := p.Addr(), 0; k < 1<<n; a, k = a.Next(), k+1 {
			out = append(out, a)
		}
	}
	if len(out) > MaxEgress {
		return nil, fmt.Errorf("egress: %d addresses, more than %d", len(out), MaxEgress)
	}
	return out, nil
}

// expandedLen is how many addresses ExpandEgress makes of items, as far
// as their text tells (each prefix's addresses, each other item one),
// bounded by MaxEgress: the capacity of its result, allocated once.
func expandedLen(items []string) int {
	n := 0
	for _, s := range items {
		k := 1
		if i := strings.LastIndexByte(s, '/'); i >= 0 {
			bits, err := strconv.Atoi(s[i+1:])
			w := 32
			if strings.Contains(s[:i], ":") {
				w = 128
			}
			if err == nil && bits <= w && w-bits <= 9 {
				k = 1 << (w - bits)
			}
		}
		n += k
		if n >= MaxEgress {
			return MaxEgress
		}
	}
	return n
}

// HeaderEgress is the request header by which a client of a proxy (the
// gateway) names the proxy's address the request is to leave from: one
// of its egress addresses, written as netip.Addr writes it (an IPv4
// address in dotted decimal, an IPv6 one in RFC 5952's lowercase
// compressed form). The proxy removes it before the target sees it. A
// request without it, or naming an address that is not the proxy's,
// leaves from the proxy's default address of the target's family. The
// address is used only for a target reached over its family: one of IPv6
// for a target reached over IPv4 is not. On a gateway's answer it names
// the address the request left from.
const HeaderEgress = "X-Proxyfleet-Egress"
