package deny

import (
	"fmt"
	"net/netip"
	"strings"
)

// List is a set of denied destination networks, each valid and masked
// (its constructors make sure of it). The zero List denies nothing.
type List struct {
	nets []netip.Prefix
}

// defaultNets is Default's list, in the order it is written out.
var defaultNets = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("::1/128"),        // loopback
	netip.MustParsePrefix("0.0.0.0/8"),      // "this host" (0.0.0.0 reaches the local machine)
	netip.MustParsePrefix("::/128"),         // the unspecified address, likewise
	netip.MustParsePrefix("169.254.0.0/16"), // link-local: a cloud's metadata service
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("10.0.0.0/8"),     // RFC 1918
	netip.MustParsePrefix("172.16.0.0/12"),  // RFC 1918
	netip.MustParsePrefix("192.168.0.0/16"), // RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("fc00::/7"),       // unique local addresses
}

// Default is the list a config that names none gets: loopback, 0.0.0.0/8
// and ::/128, link-local, RFC 1918, 100.64.0.0/10 and fc00::/7.
func Default() List {
	return List{nets: append([]netip.Prefix(nil), defaultNets...)}
}

// ParseEntry reads one entry of a list: a CIDR ("10.0.0.0/8"; masked, so
// "10.1.2.3/8" is 10.0.0.0/8) or a single address ("192.0.2.1", meaning
// /32, or /128 for IPv6), without a zone. An IPv4-mapped IPv6 entry
// (::ffff:a.b.c.d, or a prefix of at least /96 of them) is taken as the
// IPv4 network it maps, since Denies unmaps the addresses it is asked
// about.
func ParseEntry(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or address", s)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or address", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Parse reads a config's list (field is its name, for errors:
// "gateway.deny[2]: \"x\" is not a CIDR or address"). An empty or nil
// entries is the empty List: nothing denied.
func Parse(field string, entries []string) (List, error) {
	l := List{nets: make([]netip.Prefix, 0, len(entries))}
	for i, s := range entries {
		p, err := ParseEntry(s)
		if err != nil {
			return List{}, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		l.nets = append(l.nets, p)
	}
	return l, nil
}

// With is l and the single addresses as (invalid ones left out, zones
// dropped, IPv4-mapped ones unmapped); l itself is unchanged.
func (l List) With(as ...netip.Addr) List {
	out := List{nets: append(make([]netip.Prefix, 0, len(l.nets)+len(as)), l.nets...)}
	for _, a := range as {
		if a = a.WithZone("").Unmap(); a.IsValid() {
			out.nets = append(out.nets, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

// Denies says whether a is in the list. An IPv4-mapped IPv6 address is
// unmapped first (::ffff:127.0.0.1 is 127.0.0.1) and a zone is ignored
// (fe80::1%eth0 is fe80::1); the zero Addr is never denied.
func (l List) Denies(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	if !a.IsValid() {
		return false
	}
	for _, p := range l.nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Len is the number of networks in the list.
func (l List) Len() int { return len(l.nets) }

// Prefixes are the networks, masked, in the list's order (a copy).
func (l List) Prefixes() []netip.Prefix { return append([]netip.Prefix(nil), l.nets...) }

// Strings are the networks as CIDRs ("127.0.0.0/8", "::1/128"), in the
// list's order; empty, not nil, for none.
func (l List) Strings() []string {
	out := make([]string, len(l.nets))
	for i, p := range l.nets {
		out[i] = p.String()
	}
	return out
}
