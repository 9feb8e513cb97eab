package bans

import (
	"fmt"
	"net/netip"
	"strings"
)

// The key of a ban in PROXY_BANS is <address>.<site>: NATS KV keys allow
// [-/_=.A-Za-z0-9] in dot-separated tokens, so an address is written as
// one token ('.' as '-', ':' as '_'; neither is in a written address) and
// a site by name keeps its dots (its labels are [a-z0-9-] once Site has
// normalized it), while a site that is an address is "=" followed by the
// address's token ('=' is in no DNS label). The encoding is reversible:
// ParseKey gives back what Key took.

// addrToken is a's one-token form.
func addrToken(a netip.Addr) string {
	return strings.NewReplacer(".", "-", ":", "_").Replace(a.String())
}

func parseAddrToken(t string) (netip.Addr, error) {
	if strings.ContainsAny(t, ".:") {
		return netip.Addr{}, fmt.Errorf("address token %q: has '.' or ':'", clip(t))
	}
	a, err := ParseAddr(strings.NewReplacer("-", ".", "_", ":").Replace(t))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("address token: %w", err)
	}
	if addrToken(a) != t {
		return netip.Addr{}, fmt.Errorf("address token %q: not canonical", clip(t))
	}
	return a, nil
}

// siteKey is the key form of a site Site returned.
func siteKey(site string) string {
	if a, err := netip.ParseAddr(site); err == nil {
		return "=" + addrToken(a)
	}
	return site
}

// Key is the key of the ban of addr for site (site as Site returns it).
func Key(addr netip.Addr, site string) string {
	return addrToken(addr.Unmap()) + "." + siteKey(site)
}

// AddrFilter is the key filter of every ban of addr.
func AddrFilter(addr netip.Addr) string { return addrToken(addr.Unmap()) + ".>" }

// SiteFilter is the key filter of every ban for site.
func SiteFilter(site string) string { return "*." + siteKey(site) }

// ParseKey splits a key Key made back into the address and the site; any
// other string is refused.
func ParseKey(key string) (netip.Addr, string, error) {
	at, st, ok := strings.Cut(key, ".")
	if !ok || st == "" {
		return netip.Addr{}, "", fmt.Errorf("key %q: want <address>.<site>", clip(key))
	}
	addr, err := parseAddrToken(at)
	if err != nil {
		return netip.Addr{}, "", fmt.Errorf("key %q: %w", clip(key), err)
	}
	var site string
	if t, ok := strings.CutPrefix(st, "="); ok {
		a, err := parseAddrToken(t)
		if err != nil {
			return netip.Addr{}, "", fmt.Errorf("key %q: site %w", clip(key), err)
		}
		site = a.String()
	} else {
		s, err := Site(st)
		if err != nil || s != st {
			return netip.Addr{}, "", fmt.Errorf("key %q: site %q is not a normalized site", clip(key), clip(st))
		}
		site = st
	}
	return addr, site, nil
}
