package gateway

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The target a client names (CONNECT's host:port, a SOCKS5 request's
// address, an absolute URI's authority) is written into what the gateway
// sends a proxy, ahead of the fleet's Proxy-Authorization. It is written
// only once it has passed this file's rule, so no client can end a line
// there and add fields or a request of its own (followed by the fleet's
// credential), nor make a proxy fail a request that was never the
// proxy's to carry. The rule:
//
//   - the host is a host name of LDH labels (RFC 1123: ASCII letters,
//     digits and '-', not first or last in a label; 1–63 bytes a label,
//     253 in all; the last label not all digits, so a name never looks
//     like an address, RFC 3696 2), an IPv4 address in dotted decimal
//     (four numbers 0–255, no leading zeros), or an IPv6 address without
//     a zone; in host:port and in an authority an IPv6 address is in
//     brackets, and only an IPv6 address is;
//   - a trailing dot is refused (not stripped: what passes is written as
//     the client sent it, or the address's canonical form);
//   - the port is 1–65535 in decimal digits (at most 5, leading zeros
//     allowed).
//
// Nothing else passes: no space, control byte, '@', '/', '%', '_' or
// byte over 0x7f.
//
// A target that passed is then checked against Config.Deny, once for
// every kind of request, in attempts (before a proxy is picked): a host
// that is an address (targetAddr) the list denies is refused there. The
// rule leaves an IPv4 address one form (no "127.1", no "0x7f.0.0.1", no
// decimal integer: a last label of digits is no name), and an IPv6 one
// is compared parsed, not as text, so the check sees every address a
// client can name; a host name is not resolved (the proxies' squid
// checks what it resolves to).

// hostPort is a target that passed the rule. parseHostPort and
// newHostPort, which apply it, are its only constructors; dialConnect
// takes nothing else.
type hostPort struct {
	host string // a host name, or an IP address in canonical form (IPv6 without brackets)
	port uint16 // 1–65535
}

// String is host:port, an IPv6 address in brackets (net.JoinHostPort).
func (t hostPort) String() string {
	return net.JoinHostPort(t.host, strconv.Itoa(int(t.port)))
}

// appendTo appends String's text to b.
func (t hostPort) appendTo(b []byte) []byte {
	if strings.IndexByte(t.host, ':') >= 0 {
		b = append(b, '[')
		b = append(b, t.host...)
		b = append(b, ']')
	} else {
		b = append(b, t.host...)
	}
	b = append(b, ':')
	return strconv.AppendUint(b, uint64(t.port), 10)
}

// targetRule is the rule in a refusal's words.
const targetRule = "a host name (letters, digits, '-'), an IPv4 address or an [IPv6] address, and a port 1-65535"

// errTarget is every refusal of a target; errAuthority of an authority.
var (
	errTarget    = errors.New("want host:port: " + targetRule)
	errAuthority = errors.New("want host or host:port: " + targetRule)
)

// parseHostPort parses CONNECT's target: host:port, an IPv6 address in
// brackets.
func parseHostPort(s string) (hostPort, error) {
	host, port, hasPort := cutPort(s)
	if !hasPort {
		return hostPort{}, errTarget
	}
	p, ok := parsePort(port)
	if !ok {
		return hostPort{}, errTarget
	}
	switch hostKind(host) {
	case hostName, hostIPv4:
		return hostPort{host, p}, nil
	case hostIPv6:
		a, _ := netip.ParseAddr(host[1 : len(host)-1])
		return hostPort{a.String(), p}, nil
	}
	return hostPort{}, errTarget
}

// newHostPort makes a SOCKS5 request's target: host is a name or an IP
// address, an IPv6 one without brackets.
func newHostPort(host string, port uint16) (hostPort, error) {
	if port == 0 {
		return hostPort{}, errTarget
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		if a.Zone() != "" {
			return hostPort{}, errTarget
		}
		return hostPort{a.String(), port}, nil
	}
	switch hostKind(host) {
	case hostName, hostIPv4:
		return hostPort{host, port}, nil
	}
	return hostPort{}, errTarget
}

// validAuthority says whether an absolute URI's authority, host or
// host:port, passes the rule (its port may be left out: the scheme's).
// It allocates nothing for a name or an IPv4 address (every plain
// request's is checked).
func validAuthority[T string | []byte](a T) bool {
	host, port, hasPort := cutPort(a)
	if hasPort {
		if _, ok := parsePort(port); !ok {
			return false
		}
	}
	return hostKind(host) != hostBad
}

// targetAddr is the address a host that passed the rule is (an IPv6
// one with or without brackets); false for a host name.
func targetAddr(host string) (netip.Addr, bool) {
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if !isIPv4(host) && strings.IndexByte(host, ':') < 0 {
		return netip.Addr{}, false // a name: no need to parse (nor allocate an error)
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// What a host is.
const (
	hostBad = iota
	hostName
	hostIPv4
	hostIPv6 // in brackets
)

// hostKind says what host is by the rule, an IPv6 address in brackets.
func hostKind[T string | []byte](h T) int {
	if len(h) >= 2 && h[0] == '[' && h[len(h)-1] == ']' {
		a, err := netip.ParseAddr(string(h[1 : len(h)-1]))
		if err == nil && a.Is6() && a.Zone() == "" {
			return hostIPv6
		}
		return hostBad
	}
	if isIPv4(h) {
		return hostIPv4
	}
	if isHostName(h) {
		return hostName
	}
	return hostBad
}

// cutPort splits host:port at the last ':' that is not inside brackets;
// hasPort false: there is none (host is s).
func cutPort[T string | []byte](s T) (host, port T, hasPort bool) {
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case ':':
			return s[:i], s[i+1:], true
		case ']':
			return s, s[len(s):], false
		}
	}
	return s, s[len(s):], false
}

// parsePort parses 1–65535 in decimal digits (at most 5).
func parsePort[T string | []byte](s T) (uint16, bool) {
	if len(s) == 0 || len(s) > 5 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// isIPv4 says whether s is four numbers 0–255 in decimal, without
// leading zeros, separated by dots (netip.ParseAddr's IPv4 form).
func isIPv4[T string | []byte](s T) bool {
	parts, n, digits := 0, 0, 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			if digits == 0 {
				return false
			}
			parts++
			n, digits = 0, 0
			continue
		}
		c := s[i]
		if c < '0' || c > '9' || digits > 0 && n == 0 {
			return false // not a digit, or a leading zero
		}
		n = n*10 + int(c-'0')
		digits++
		if n > 255 {
			return false
		}
	}
	return parts == 4
}

// isHostName says whether s is a host name of LDH labels (the rule
// above).
func isHostName[T string | []byte](s T) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	start, allDigits := 0, true
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '.' {
			l := i - start
			if l == 0 || l > 63 || s[start] == '-' || s[i-1] == '-' {
				return false
			}
			start = i + 1
			if i < len(s) {
				allDigits = true
			}
			continue
		}
		switch c := s[i]; {
		case '0' <= c && c <= '9':
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '-':
			allDigits = false
		default:
			return false
		}
	}
	return !allDigits // the last label's
}
