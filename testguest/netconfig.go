package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// NetworkConfig is the part of a NoCloud seed's network-config (cloud-init's
// networking config version 2, the netplan format) that the test guest acts
// on: its ethernets. proxyfleet writes one entry per proxy, matched by MAC,
// with static addresses (/32, /128) and on-link default routes.
type NetworkConfig struct {
	Ethernets []Ethernet // sorted by ID
	// Ignored lists what the guest read but does not act on (keys and
	// sections), for the console.
	Ignored []string
}

// Ethernet is one entry of a network-config's ethernets.
type Ethernet struct {
	ID         string // the entry's key
	MatchMAC   net.HardwareAddr
	MatchName  string // a shell glob, as netplan's match.name
	HasMatch   bool
	SetName    string
	DHCP4      bool
	MTU        int
	AcceptRA   *bool
	Addresses  []netip.Prefix
	Routes     []Route
	DNS        []netip.Addr
	DNSSearch  []string
	Configured bool // it configures something static (addresses or routes)
}

// Route is a network-config route. A route with On-link (or whose via is
// inside none of the interface's prefixes, as with /32 addresses) gets a
// route to its gateway on the link first.
type Route struct {
	To     netip.Prefix
	Via    netip.Addr // invalid: a route on the link (no gateway)
	OnLink bool
	Metric int // 0: none given
}

type ncBody struct {
	Version   int                  `yaml:"version"`
	Ethernets map[string]yaml.Node `yaml:"ethernets"`
	Config    yaml.Node            `yaml:"config"` // version 1
	Renderer  string               `yaml:"renderer"`
	Bonds     yaml.Node            `yaml:"bonds"`
	Bridges   yaml.Node            `yaml:"bridges"`
	Vlans     yaml.Node            `yaml:"vlans"`
	Wifis     yaml.Node            `yaml:"wifis"`
}

type ncEthernet struct {
	Match struct {
		MACAddress string `yaml:"macaddress"`
		Name       string `yaml:"name"`
		Driver     string `yaml:"driver"`
	} `yaml:"match"`
	SetName     string      `yaml:"set-name"`
	DHCP4       bool        `yaml:"dhcp4"`
	DHCP6       bool        `yaml:"dhcp6"`
	Addresses   []yaml.Node `yaml:"addresses"`
	Gateway4    string      `yaml:"gateway4"`
	Gateway6    string      `yaml:"gateway6"`
	Routes      []ncRoute   `yaml:"routes"`
	MTU         int         `yaml:"mtu"`
	AcceptRA    *bool       `yaml:"accept-ra"`
	Nameservers struct {
		Addresses []string `yaml:"addresses"`
		Search    []string `yaml:"search"`
	} `yaml:"nameservers"`
}

type ncRoute struct {
	To     string `yaml:"to"`
	Via    string `yaml:"via"`
	OnLink bool   `yaml:"on-link"`
	Metric *int   `yaml:"metric"`
	Type   string `yaml:"type"`
	Table  *int   `yaml:"table"`
	From   string `yaml:"from"`
	Scope  string `yaml:"scope"`
}

// knownEthernetKeys are the keys of an ethernets entry the guest acts on
// (dhcp6 only when false); others are listed in Ignored.
var knownEthernetKeys = map[string]bool{
	"match": true, "set-name": true, "dhcp4": true, "dhcp6": true, "addresses": true,
	"gateway4": true, "gateway6": true, "routes": true, "mtu": true, "accept-ra": true,
	"nameservers": true,
}

// ParseNetworkConfig reads a NoCloud network-config: a version 2 config,
// at the top level or under `network:` (cloud-init takes both). Unknown keys
// are tolerated (and listed in Ignored); what the guest would have to
// configure and cannot (version 1, bonds, bridges, vlans, dhcp6, a route in
// another table or from a source, an address without a prefix length) is an
// error, as is anything malformed.
func ParseNetworkConfig(b []byte) (*NetworkConfig, error) {
	b = bytes.TrimPrefix(b, []byte("\ufeff"))
	var outer struct {
		Network yaml.Node `yaml:"network"`
	}
	if err := yaml.Unmarshal(b, &outer); err != nil {
		return nil, fmt.Errorf("network-config: %w", err)
	}
	var body ncBody
	var err error
	if outer.Network.Kind != 0 {
		err = outer.Network.Decode(&body)
	} else {
		err = yaml.Unmarshal(b, &body)
	}
	if err != nil {
		return nil, fmt.Errorf("network-config: %w", err)
	}
	switch {
	case body.Version == 1 || body.Config.Kind != 0:
		return nil, errors.New("network-config: version 1 is not supported by the test guest (want version: 2)")
	case body.Version != 2:
		return nil, fmt.Errorf("network-config: version %d, want 2", body.Version)
	}
	nc := &NetworkConfig{}
	for name, n := range map[string]yaml.Node{"bonds": body.Bonds, "bridges": body.Bridges, "vlans": body.Vlans} {
		if n.Kind != 0 && len(n.Content) > 0 {
			return nil, fmt.Errorf("network-config: %s are not supported by the test guest", name)
		}
	}
	if body.Wifis.Kind != 0 {
		nc.Ignored = append(nc.Ignored, "wifis")
	}
	if body.Renderer != "" {
		nc.Ignored = append(nc.Ignored, "renderer")
	}
	ids := make([]string, 0, len(body.Ethernets))
	for id := range body.Ethernets {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		node := body.Ethernets[id]
		e, ignored, err := parseEthernet(id, &node)
		if err != nil {
			return nil, fmt.Errorf("network-config: ethernets.%s: %w", id, err)
		}
		for _, k := range ignored {
			nc.Ignored = append(nc.Ignored, "ethernets."+id+"."+k)
		}
		nc.Ethernets = append(nc.Ethernets, e)
	}
	if len(nc.Ethernets) == 0 {
		return nil, errors.New("network-config: no ethernets")
	}
	return nc, nil
}

func parseEthernet(id string, node *yaml.Node) (Ethernet, []string, error) {
	e := Ethernet{ID: id}
	var ignored []string
	if node.Kind != yaml.MappingNode {
		return e, nil, errors.New("not a mapping")
	}
	for i := 0; i+1 < len(node.Content); i += 2 {
		if k := node.Content[i].Value; !knownEthernetKeys[k] {
			ignored = append(ignored, k)
		}
	}
	var raw ncEthernet
	if err := node.Decode(&raw); err != nil {
		return e, nil, err
	}
	if raw.Match.MACAddress != "" {
		mac, err := net.ParseMAC(raw.Match.MACAddress)
		if err != nil || len(mac) != 6 {
			return e, nil, fmt.Errorf("match.macaddress %q is not a MAC address", raw.Match.MACAddress)
		}
		e.MatchMAC = mac
		e.HasMatch = true
	}
	if raw.Match.Name != "" {
		if _, err := filepath.Match(raw.Match.Name, ""); err != nil {
			return e, nil, fmt.Errorf("match.name %q: %v", raw.Match.Name, err)
		}
		e.MatchName = raw.Match.Name
		e.HasMatch = true
	}
	if raw.Match.Driver != "" {
		ignored = append(ignored, "match.driver")
		e.HasMatch = true
	}
	if raw.SetName != "" {
		if len(raw.SetName) > 15 || strings.ContainsAny(raw.SetName, "/: \t") {
			return e, nil, fmt.Errorf("set-name %q is not an interface name", raw.SetName)
		}
		e.SetName = raw.SetName
	}
	if raw.DHCP6 {
		return e, nil, errors.New("dhcp6 is not supported by the test guest")
	}
	e.DHCP4 = raw.DHCP4
	if raw.MTU < 0 || raw.MTU > 65535 {
		return e, nil, fmt.Errorf("mtu %d", raw.MTU)
	}
	e.MTU = raw.MTU
	e.AcceptRA = raw.AcceptRA
	for i, n := range raw.Addresses {
		s := n.Value
		if n.Kind == yaml.MappingNode && len(n.Content) == 2 {
			s = n.Content[0].Value // netplan's "ADDR/LEN: {lifetime: …, label: …}"
		} else if n.Kind != yaml.ScalarNode {
			return e, nil, fmt.Errorf("addresses[%d] is not an address", i)
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return e, nil, fmt.Errorf("addresses[%d] %q is not an address with a prefix length", i, s)
		}
		e.Addresses = append(e.Addresses, p)
	}
	for i, r := range raw.Routes {
		rt, err := parseRoute(r)
		if err != nil {
			return e, nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		e.Routes = append(e.Routes, rt)
	}
	for _, gw := range []struct{ key, s string }{{"gateway4", raw.Gateway4}, {"gateway6", raw.Gateway6}} {
		if gw.s == "" {
			continue
		}
		a, err := netip.ParseAddr(gw.s)
		if err != nil || a.Zone() != "" || (gw.key == "gateway4") != a.Is4() {
			return e, nil, fmt.Errorf("%s %q is not an address of its family", gw.key, gw.s)
		}
		to := netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		if a.Is4() {
			to = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		e.Routes = append(e.Routes, Route{To: to, Via: a})
	}
	for i, s := range raw.Nameservers.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return e, nil, fmt.Errorf("nameservers.addresses[%d] %q is not an address", i, s)
		}
		e.DNS = append(e.DNS, a)
	}
	e.DNSSearch = raw.Nameservers.Search
	e.Configured = len(e.Addresses) > 0 || len(e.Routes) > 0
	return e, ignored, nil
}

func parseRoute(r ncRoute) (Route, error) {
	var rt Route
	switch r.Type {
	case "", "unicast":
	default:
		return rt, fmt.Errorf("type %q is not supported by the test guest", r.Type)
	}
	if r.Table != nil && *r.Table != 0 && *r.Table != 254 {
		return rt, fmt.Errorf("table %d is not supported by the test guest", *r.Table)
	}
	if r.From != "" {
		return rt, errors.New("from is not supported by the test guest")
	}
	if r.To == "" {
		return rt, errors.New("no to")
	}
	if r.To == "default" {
		if r.Via == "" {
			return rt, errors.New("to: default needs a via (its family)")
		}
	} else {
		p, err := netip.ParsePrefix(r.To)
		if err != nil {
			a, err2 := netip.ParseAddr(r.To)
			if err2 != nil || a.Zone() != "" {
				return rt, fmt.Errorf("to %q is not a prefix or an address", r.To)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Masked() != p {
			return rt, fmt.Errorf("to %q has bits set past its prefix length", r.To)
		}
		rt.To = p
	}
	if r.Via != "" {
		a, err := netip.ParseAddr(r.Via)
		if err != nil || a.Zone() != "" {
			return rt, fmt.Errorf("via %q is not an address", r.Via)
		}
		rt.Via = a
		if r.To == "default" {
			rt.To = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			if a.Is4() {
				rt.To = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			}
		}
		if rt.To.Addr().Is4() != a.Is4() {
			return rt, fmt.Errorf("to %s and via %s are of different families", rt.To, a)
		}
	} else if r.Scope != "" && r.Scope != "link" {
		return rt, fmt.Errorf("a route without via with scope %q", r.Scope)
	}
	rt.OnLink = r.OnLink
	if r.Metric != nil {
		if *r.Metric < 0 {
			return rt, fmt.Errorf("metric %d", *r.Metric)
		}
		rt.Metric = *r.Metric
	}
	return rt, nil
}

// Select returns the entry for the interface named name with MAC mac, or
// nil: the first (by ID) whose match.macaddress is mac; else one whose
// match.name matches name; else one without a match whose ID is name; else,
// when the config has a single entry and it has no match, that entry (the
// test guest has one NIC).
func (nc *NetworkConfig) Select(name string, mac net.HardwareAddr) *Ethernet {
	for i := range nc.Ethernets {
		e := &nc.Ethernets[i]
		if e.MatchMAC != nil && bytes.Equal(e.MatchMAC, mac) {
			if e.MatchName == "" || globMatch(e.MatchName, name) {
				return e
			}
		}
	}
	for i := range nc.Ethernets {
		e := &nc.Ethernets[i]
		if e.MatchMAC == nil && e.MatchName != "" && globMatch(e.MatchName, name) {
			return e
		}
	}
	for i := range nc.Ethernets {
		if e := &nc.Ethernets[i]; !e.HasMatch && e.ID == name {
			return e
		}
	}
	if len(nc.Ethernets) == 1 && !nc.Ethernets[0].HasMatch {
		return &nc.Ethernets[0]
	}
	return nil
}

func globMatch(pat, name string) bool {
	ok, _ := filepath.Match(pat, name)
	return ok
}

// NetStep is one step of applying an Ethernet entry: an `ip` command
// (busybox's applet; IP holds its arguments), a write of Value to the file
// Path (a /proc/sys setting, /etc/resolv.conf).
type NetStep struct {
	IP    []string
	Path  string
	Value string
}

func (s NetStep) String() string {
	if s.IP != nil {
		return "ip " + strings.Join(s.IP, " ")
	}
	return fmt.Sprintf("%s=%q", s.Path, s.Value)
}

// Plan lists the steps that configure iface from e, and the interface's
// name afterwards (e's set-name, if any). In order: the name (the link goes
// down for it, which drops IPv6 addresses, so it comes first); the IPv6
// settings (no duplicate address detection, as `nodad`, since busybox's ip
// has no such flag; no router advertisements unless accept-ra says so); the
// MTU; the addresses; the routes, each gateway that is on-link, or that
// no prefix of the interface holds, getting a route on the link first; the
// nameservers.
func (e *Ethernet) Plan(iface string) ([]NetStep, string) {
	var steps []NetStep
	ipc := func(args ...string) { steps = append(steps, NetStep{IP: args}) }
	if e.SetName != "" && e.SetName != iface {
		ipc("link", "set", "dev", iface, "down")
		ipc("link", "set", "dev", iface, "name", e.SetName)
		iface = e.SetName
	}
	ipc("link", "set", "dev", iface, "up")
	has6 := false
	for _, a := range e.Addresses {
		has6 = has6 || a.Addr().Is6()
	}
	for _, r := range e.Routes {
		has6 = has6 || r.To.Addr().Is6()
	}
	conf6 := "/proc/sys/net/ipv6/conf/" + iface + "/"
	if has6 {
		steps = append(steps, NetStep{Path: conf6 + "disable_ipv6", Value: "0"}, NetStep{Path: conf6 + "accept_dad", Value: "0"})
	}
	ra := "0"
	if e.AcceptRA != nil && *e.AcceptRA {
		ra = "1"
	}
	if e.AcceptRA != nil || e.Configured {
		steps = append(steps, NetStep{Path: conf6 + "accept_ra", Value: ra})
	}
	if e.MTU > 0 {
		ipc("link", "set", "dev", iface, "mtu", fmt.Sprint(e.MTU))
	}
	fam := func(a netip.Addr) string {
		if a.Is4() {
			return "-4"
		}
		return "-6"
	}
	for _, a := range e.Addresses {
		ipc(fam(a.Addr()), "addr", "add", a.String(), "dev", iface)
	}
	onLinkDone := map[netip.Addr]bool{}
	for _, r := range e.Routes {
		f := fam(r.To.Addr())
		to := r.To.String()
		if r.To.Bits() == 0 {
			to = "default"
		}
		var metric []string
		if r.Metric > 0 {
			metric = []string{"metric", fmt.Sprint(r.Metric)}
		}
		if !r.Via.IsValid() {
			ipc(append([]string{f, "route", "replace", to, "dev", iface}, metric...)...)
			continue
		}
		if (r.OnLink || !e.holds(r.Via)) && !onLinkDone[r.Via] {
			onLinkDone[r.Via] = true
			ipc(f, "route", "replace", r.Via.String(), "dev", iface)
		}
		ipc(append([]string{f, "route", "replace", to, "via", r.Via.String(), "dev", iface}, metric...)...)
	}
	if len(e.DNS) > 0 || len(e.DNSSearch) > 0 {
		var b strings.Builder
		if len(e.DNSSearch) > 0 {
			fmt.Fprintf(&b, "search %s\n", strings.Join(e.DNSSearch, " "))
		}
		for _, a := range e.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", a)
		}
		steps = append(steps, NetStep{Path: "/etc/resolv.conf", Value: b.String()})
	}
	return steps, iface
}

// holds reports whether a prefix of e's addresses contains a (a gateway
// the kernel finds on the link without a route of its own).
func (e *Ethernet) holds(a netip.Addr) bool {
	for _, p := range e.Addresses {
		if p.Bits() < p.Addr().BitLen() && p.Masked().Contains(a) {
			return true
		}
	}
	return false
}

// Summary is a one-line description of e for the console and /healthz.
func (e *Ethernet) Summary() string {
	var parts []string
	for _, a := range e.Addresses {
		parts = append(parts, a.String())
	}
	for _, r := range e.Routes {
		s := r.To.String()
		if r.Via.IsValid() {
			s += " via " + r.Via.String()
		}
		if r.OnLink {
			s += " on-link"
		}
		parts = append(parts, s)
	}
	if e.DHCP4 {
		parts = append(parts, "dhcp4")
	}
	return strings.Join(parts, ", ")
}

// NetStatus is how the guest set up its network, for /healthz.
type NetStatus struct {
	mu      sync.Mutex
	source  string // "pending", "dhcp", "network-config"
	iface   string
	summary string
	err     string
	ignored []string
}

// Set records the set-up: source is "dhcp" or "network-config", summary
// what was configured, err why a network-config was not (or not fully) applied.
func (n *NetStatus) Set(source, iface, summary string, ignored []string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.source, n.iface, n.summary, n.ignored = source, iface, summary, ignored
	n.err = ""
	if err != nil {
		n.err = err.Error()
	}
}

// Status is the network part of /healthz: network (pending, dhcp or
// network-config), network_interface, network_config (the static set-up in
// one line), network_ignored, network_error.
func (n *NetStatus) Status() map[string]any {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := map[string]any{"network": n.source}
	if n.source == "" {
		st["network"] = "pending"
	}
	if n.iface != "" {
		st["network_interface"] = n.iface
	}
	if n.summary != "" {
		st["network_config"] = n.summary
	}
	if len(n.ignored) > 0 {
		st["network_ignored"] = n.ignored
	}
	if n.err != "" {
		st["network_error"] = n.err
	}
	return st
}
