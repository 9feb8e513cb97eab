package bans

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// MaxHostLen bounds a host name handed to Site, in bytes (a DNS name's
// limit).
const MaxHostLen = 253

// ErrHost is wrapped by every refusal of Site and ParseAddr.
var ErrHost = errors.New("not a host")

// Site returns the site of host: its registrable domain (eTLD+1, by the
// public suffix list of golang.org/x/net/publicsuffix), lowercase ASCII
// (IDNA), without a trailing dot; a host that is itself a public suffix
// is a site of its own. An address literal (IPv6 with or without
// brackets) is a site of its own, in canonical form. A host with a port,
// a zone, characters no DNS name has, an empty label or a numeric last
// label that is not an address is refused (wrapping ErrHost).
func Site(host string) (string, error) {
	if host == "" {
		return "", fmt.Errorf("%w: empty", ErrHost)
	}
	if len(host) > MaxHostLen+2 {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrHost, MaxHostLen)
	}
	if a, err := ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		if strings.HasPrefix(host, "[") != strings.HasSuffix(host, "]") || (strings.HasPrefix(host, "[") && !a.Is6()) {
			return "", fmt.Errorf("%w: %q: unbalanced brackets", ErrHost, clip(host))
		}
		return a.String(), nil
	}
	name := strings.TrimSuffix(host, ".")
	if name == "" || strings.HasSuffix(name, ".") {
		return "", fmt.Errorf("%w: %q: an empty label", ErrHost, clip(host))
	}
	if !utf8.ValidString(name) {
		return "", fmt.Errorf("%w: %q: not UTF-8", ErrHost, clip(host))
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrHost, clip(host), err)
	}
	// A site must read back as itself: refuse what IDNA maps to a name
	// it would not take again.
	if again, err := idna.Lookup.ToASCII(ascii); err != nil || again != ascii {
		return "", fmt.Errorf("%w: %q: not a stable IDNA name", ErrHost, clip(host))
	}
	if ascii == "" || len(ascii) > MaxHostLen {
		return "", fmt.Errorf("%w: %q: empty or longer than %d bytes", ErrHost, clip(host), MaxHostLen)
	}
	labels := strings.Split(ascii, ".")
	for _, l := range labels {
		if l == "" {
			return "", fmt.Errorf("%w: %q: an empty label", ErrHost, clip(host))
		}
	}
	if numeric(labels[len(labels)-1]) {
		return "", fmt.Errorf("%w: %q: a numeric last label that is not an address", ErrHost, clip(host))
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(ascii)
	if err != nil {
		// The host is a public suffix itself ("co.uk", "github.io",
		// "localhost"): nothing above it, it stands alone.
		return ascii, nil
	}
	return site, nil
}

// ParseAddr parses an egress address: IPv4 or IPv6, no zone; an
// IPv4-mapped IPv6 address is its IPv4 address.
func ParseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: %q is not an address", ErrHost, clip(s))
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%w: %q has a zone", ErrHost, clip(s))
	}
	return a.Unmap(), nil
}

func numeric(label string) bool {
	for _, c := range label {
		if c < '0' || c > '9' {
			return strings.HasPrefix(label, "0x") // 0x7f is a number to some resolvers
		}
	}
	return true
}

// clip shortens hostile input for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
