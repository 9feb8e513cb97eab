package defaults

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
)

// Targets are the health process's probe targets, as its settings name
// them: Target (an http(s) URL) or ProbeListen (host:port, health serving
// the target itself) for probes through a proxy's IPv4 addresses, and
// TargetIPv6 or ProbeListenIPv6 for probes through its IPv6 addresses.
type Targets struct {
	Target, ProbeListen         string
	TargetIPv6, ProbeListenIPv6 string
}

// CheckIPv6 checks the IPv6 addresses' target against the IPv4 one, the
// rules config and health both hold: an IPv6 target only beside an IPv4
// one that is not itself an IPv6 address; TargetIPv6 an http(s) URL whose
// host is not an IPv4 address; ProbeListenIPv6, with no TargetIPv6, an
// IPv6 address the guests can reach (not a name, an IPv4 address or a
// wildcard). On failure it returns the setting at fault (its key under
// health:, e.g. "target_ipv6") and why; on success, two empty strings.
func (t Targets) CheckIPv6() (field, reason string) {
	if t.TargetIPv6 == "" && t.ProbeListenIPv6 == "" {
		return "", ""
	}
	field = "target_ipv6"
	if t.TargetIPv6 == "" {
		field = "probe_listen_ipv6"
	}
	if t.Target == "" && t.ProbeListen == "" {
		return field, "set without target or probe_listen, the target of the IPv4 addresses"
	}
	main := t.Target
	if main == "" {
		main = "http://" + t.ProbeListen
	}
	if u, err := url.Parse(main); err == nil {
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && a.Unmap().Is6() {
			return field, fmt.Sprintf("set while the IPv4 addresses' target %s is an IPv6 address (it is the IPv6 target already)", u.Host)
		}
	}
	if t.TargetIPv6 != "" {
		u, err := url.Parse(t.TargetIPv6)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "target_ipv6", fmt.Sprintf("%q: want http(s)://host[:port]/path", t.TargetIPv6)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && a.Unmap().Is4() {
			return "target_ipv6", fmt.Sprintf("%q: its host is an IPv4 address (want an IPv6 address or a name)", t.TargetIPv6)
		}
		return "", ""
	}
	host, _, err := net.SplitHostPort(t.ProbeListenIPv6)
	if err != nil {
		return "probe_listen_ipv6", err.Error()
	}
	if a, err := netip.ParseAddr(host); err != nil || !a.Is6() || a.Is4In6() || a.IsUnspecified() {
		return "probe_listen_ipv6", fmt.Sprintf("%q: with no target_ipv6, an IPv6 address the guests can reach (not a name, an IPv4 address or a wildcard)", t.ProbeListenIPv6)
	}
	return "", ""
}
