package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"go.yaml.in/yaml/v3"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// A proxy's static network (fleet.Spec.Network, from its host's address
// plan): what the provider checks, what it writes into the seed for the
// guest, and how Get decides that the guest took the planned address.
//
// The zero Network is the host network's DHCP, as before the plans: no MAC
// in the domain (the hypervisor chooses), no network-config in the seed, and
// the address read from the guest agent, the lease and ARP.

// checkNetwork validates n and returns it with its MAC in canonical form
// (lowercase, colon-separated), the form the domain and the seed carry. A
// static network needs a MAC: the seed's network-config finds the interface
// by it. Every address must be one a guest can hold as its own (no zone, no
// IPv4-mapped IPv6, no unspecified, loopback or multicast address; no
// link-local egress address), each family with addresses has an on-link
// gateway of its family and a family without addresses has none, and no
// address appears twice. The IPv6 gateway may be link-local (fe80::1 is a
// common router address); the interface it is on is implied.
func checkNetwork(n fleet.Network) (fleet.Network, error) {
	if n.MAC != "" {
		hw, err := net.ParseMAC(n.MAC)
		switch {
		case err != nil:
			return n, fmt.Errorf("network: mac %q: %w", n.MAC, err)
		case len(hw) != 6:
			return n, fmt.Errorf("network: mac %q is not a 48-bit ethernet address", n.MAC)
		case hw[0]&1 != 0:
			return n, fmt.Errorf("network: mac %q is a multicast address", n.MAC)
		case slices.Equal(hw, net.HardwareAddr{0, 0, 0, 0, 0, 0}):
			return n, fmt.Errorf("network: mac %q is all zeros", n.MAC)
		}
		n.MAC = hw.String()
	}
	switch {
	case n.IPv4Gateway.IsValid() && !n.IPv4.IsValid():
		return n, fmt.Errorf("network: ipv4 gateway %s without an ipv4 address", n.IPv4Gateway)
	case n.IPv6Gateway.IsValid() && len(n.IPv6) == 0:
		return n, fmt.Errorf("network: ipv6 gateway %s without an ipv6 address", n.IPv6Gateway)
	case len(n.Nameservers) > 0 && !n.Static():
		return n, errors.New("network: nameservers without an address")
	case !n.Static():
		return n, nil
	case n.MAC == "":
		return n, errors.New("network: a static network needs a mac (the guest's network-config matches its interface by it)")
	}
	seen := map[netip.Addr]bool{}
	if n.IPv4.IsValid() {
		if err := guestAddr("ipv4", n.IPv4, true, false); err != nil {
			return n, err
		}
		if !n.IPv4Gateway.IsValid() {
			return n, fmt.Errorf("network: ipv4 %s has no gateway", n.IPv4)
		}
		seen[n.IPv4] = true
	}
	if n.IPv4Gateway.IsValid() {
		if err := guestAddr("ipv4 gateway", n.IPv4Gateway, true, false); err != nil {
			return n, err
		}
	}
	for _, a := range n.IPv6 {
		if err := guestAddr("ipv6", a, false, false); err != nil {
			return n, err
		}
		if seen[a] {
			return n, fmt.Errorf("network: ipv6 %s twice", a)
		}
		seen[a] = true
	}
	if len(n.IPv6) > 0 && !n.IPv6Gateway.IsValid() {
		return n, fmt.Errorf("network: ipv6 %s has no gateway", n.IPv6[0])
	}
	if n.IPv6Gateway.IsValid() {
		if err := guestAddr("ipv6 gateway", n.IPv6Gateway, false, true); err != nil {
			return n, err
		}
	}
	if seen[n.IPv4Gateway] || seen[n.IPv6Gateway] {
		return n, errors.New("network: a gateway is one of the proxy's own addresses")
	}
	if len(n.Nameservers) > maxNameservers {
		return n, fmt.Errorf("network: %d nameservers, at most %d", len(n.Nameservers), maxNameservers)
	}
	for _, a := range n.Nameservers {
		if err := guestAddr("nameserver", a, a.Is4(), false); err != nil {
			return n, err
		}
	}
	return n, nil
}

// maxNameservers bounds a static network's nameservers: glibc reads the
// first three of resolv.conf.
const maxNameservers = 3

// guestAddr checks one address of a static network: of its family (IPv4
// when v4, else IPv6 that is not IPv4-mapped), without a zone, and neither
// unspecified, loopback nor multicast; link-local only where linkLocal.
func guestAddr(what string, a netip.Addr, v4, linkLocal bool) error {
	switch {
	case v4 && !a.Is4(), !v4 && (!a.Is6() || a.Is4In6()):
		return fmt.Errorf("network: %s %s is not an address of that family", what, a)
	case a.Zone() != "":
		return fmt.Errorf("network: %s %s has a zone", what, a)
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast():
		return fmt.Errorf("network: %s %s is not a unicast address", what, a)
	case !linkLocal && a.IsLinkLocalUnicast():
		return fmt.Errorf("network: %s %s is link-local", what, a)
	}
	return nil
}

// guestInterface is the name the seed's network-config gives the proxy's
// interface (cloud-init renames the interface with the network's MAC to it
// before bringing it up).
const guestInterface = "eth0"

// networkConfig returns the seed's network-config for a static network n
// (checked by checkNetwork): cloud-init network config version 2, built as
// typed values and encoded by a YAML encoder, every string double-quoted.
//
// What it says: the interface with n's MAC is named eth0, gets no DHCP of
// either family and no router advertisements, holds n's IPv4 address as a
// /32 and each IPv6 address as a /128, and has a default route per family
// to that family's gateway, on-link (the gateway is outside every prefix
// the guest holds), and n's nameservers. eni renders those as
// dns-nameservers, which only resolvconf (not in Debian's cloud image)
// acts on: squid, the one program that resolves names for a proxy, is
// given them in its own configuration (squidConf), which holds whatever
// the image's resolver does.
//
// Why this form (cloud-init 22.4.2 of Debian 12, whose image renders
// network config for ifupdown, its "eni" renderer, read in
// cloudinit/net/network_state.py and eni.py at tag 22.4.2, and run on
// this config):
//   - v2 "routes" lose everything but "to" and "via" ("on-link" and
//     "metric" are dropped), and eni renders them as "post-up route add
//     default gw GW || true": net-tools' route, which the image does not
//     have, without onlink, and "::/0" comes out as "::/64". A default
//     route there silently never exists.
//   - "gateway4" and "gateway6" become the "gateway" option of the first
//     static stanza of their family, and ifupdown 0.8.41 (Debian 12)
//     brings that up as "ip route add default via GW dev eth0 onlink"
//     (IPv4) and "ip -6 route replace default via GW dev eth0 onlink"
//     (IPv6): the on-link default routes this config wants.
//   - Each address becomes a stanza of its own ("iface eth0 inet static",
//     "iface eth0 inet6 static"), which ifupdown brings up in order, so a
//     list of /128s is fine.
//   - "accept-ra: false" is written only into the first stanza, as
//     "accept_ra 0", and only if that stanza is IPv6: so the IPv6
//     addresses are listed first. (ifupdown's inet6 static leaves
//     accept_ra at the kernel's default otherwise, and stateless
//     autoconfiguration off.) An IPv4-only network has no IPv6 stanza,
//     so its eth0 keeps the kernel's accept_ra 1 and autoconf 1 (seen in
//     the guest): on a link whose router advertises a prefix the guest
//     would take an IPv6 address and route the plan does not know. No v2
//     key changes that through this renderer: the default user-data
//     turns IPv6 off on eth0 for such a plan (ipv4Only).
//
// "gateway4" and "gateway6" are deprecated in netplan (Ubuntu's renderer),
// which still honours them; other renderers were not checked.
func networkConfig(n fleet.Network) (string, error) {
	if !n.Static() || n.MAC == "" {
		return "", errors.New("network-config: not a static network with a mac")
	}
	type match struct {
		MACAddress string `yaml:"macaddress"`
	}
	type dns struct {
		Addresses []string `yaml:"addresses"`
	}
	type ethernet struct {
		Match     match    `yaml:"match"`
		SetName   string   `yaml:"set-name"`
		DHCP4     bool     `yaml:"dhcp4"`
		DHCP6     bool     `yaml:"dhcp6"`
		AcceptRA  bool     `yaml:"accept-ra"`
		Addresses []string `yaml:"addresses"`
		Gateway4  string   `yaml:"gateway4,omitempty"`
		Gateway6  string   `yaml:"gateway6,omitempty"`
		DNS       *dns     `yaml:"nameservers,omitempty"`
	}
	type config struct {
		Version   int                 `yaml:"version"`
		Ethernets map[string]ethernet `yaml:"ethernets"`
	}
	eth := ethernet{Match: match{MACAddress: n.MAC}, SetName: guestInterface}
	for _, a := range n.IPv6 {
		eth.Addresses = append(eth.Addresses, netip.PrefixFrom(a, 128).String())
	}
	if n.IPv6Gateway.IsValid() {
		eth.Gateway6 = n.IPv6Gateway.String()
	}
	if n.IPv4.IsValid() {
		eth.Addresses = append(eth.Addresses, netip.PrefixFrom(n.IPv4, 32).String())
		eth.Gateway4 = n.IPv4Gateway.String()
	}
	if len(n.Nameservers) > 0 {
		eth.DNS = &dns{}
		for _, a := range n.Nameservers {
			eth.DNS.Addresses = append(eth.DNS.Addresses, a.String())
		}
	}
	var doc yaml.Node
	if err := doc.Encode(config{Version: 2, Ethernets: map[string]ethernet{guestInterface: eth}}); err != nil {
		return "", fmt.Errorf("network-config: %w", err)
	}
	quoteValues(&doc)
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return "", fmt.Errorf("network-config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("network-config: %w", err)
	}
	return b.String(), nil
}

// quoteValues double-quotes every string value under n (the keys are the
// format's own names). cloud-init reads YAML 1.1 (PyYAML), where a plain
// 52:54:00:12:34:56 or 1:2:3:4:5:6:7:8 is a base-60 integer; quoted, every
// value is the string written.
func quoteValues(n *yaml.Node) {
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		if c.Kind == yaml.ScalarNode && c.ShortTag() == "!!str" {
			c.Style = yaml.DoubleQuotedStyle
		}
		quoteValues(c)
	}
}

// planState decides the state of an active domain with a static network
// whose address of record is addr, from the guest agent's answer
// (ifaces, or agentErr if it did not answer).
//
// The address is the plan's, known before the guest boots, so the proxy is
// running unless the guest says otherwise: an agent that errors (not
// started yet, not installed, not responding) does not hold it back. An
// agent that answers without addr on any interface but loopback means the
// guest has not (yet) configured it, or configured another: provisioning,
// with the addresses it reports in the reason, so the worker never
// publishes an address the guest does not hold.
func planState(addr netip.Addr, ifaces []libvirt.DomainInterface, agentErr error) (state, reason string) {
	if agentErr != nil {
		return messages.StateRunning, ""
	}
	var seen []string
	for _, ifc := range ifaces {
		if ifc.Name == "lo" {
			continue
		}
		for _, a := range ifc.Addrs {
			ip, err := netip.ParseAddr(a.Addr)
			if err != nil {
				continue
			}
			if ip.WithZone("") == addr {
				return messages.StateRunning, ""
			}
			if !ip.IsLoopback() {
				seen = append(seen, ip.String())
			}
		}
	}
	const most = 8 // a reason stays short
	list := "no address"
	switch {
	case len(seen) > most:
		list = strings.Join(seen[:most], ", ") + fmt.Sprintf(" and %d more", len(seen)-most)
	case len(seen) > 0:
		list = strings.Join(seen, ", ")
	}
	return messages.StateProvisioning, fmt.Sprintf("address mismatch: agent reports %s, plan has %s", list, addr)
}

// networkAddrs are the addresses a libvirt network's definition (doc)
// gives itself: its first IPv4 and its first IPv6 `<ip>`, invalid where it
// has none. They are a plan's default gateways: the host routes a plan's
// addresses to that network, whose own address is on-link for its guests.
// dns says whether libvirt's dnsmasq answers DNS on them (a network with
// addresses, unless its `<dns enable="no">`).
func networkAddrs(doc string) (v4, v6 netip.Addr, dns bool, err error) {
	var nw libvirtxml.Network
	if err := nw.Unmarshal(doc); err != nil {
		return v4, v6, false, fmt.Errorf("read its definition: %w", err)
	}
	for _, ip := range nw.IPs {
		a, err := netip.ParseAddr(ip.Address)
		switch {
		case err != nil:
		case a.Is4() && !v4.IsValid():
			v4 = a
		case a.Is6() && !a.Is4In6() && !v6.IsValid():
			v6 = a
		}
	}
	dns = (v4.IsValid() || v6.IsValid()) && (nw.DNS == nil || nw.DNS.Enable != "no")
	return v4, v6, dns, nil
}

// withNetworkDefaults fills in what a static n leaves to the host's
// network, from the definition of the libvirt network the host entry's
// proxies use: the gateways are its addresses, and with no nameservers,
// its addresses of the families the guest has are, where its DNS answers
// (none otherwise: the guest image's resolver). A network with no
// address of a family whose gateway n needs is a permanent error naming
// the setting to give instead.
func (p *Provider) withNetworkDefaults(ctx context.Context, n fleet.Network) (fleet.Network, error) {
	need4 := n.IPv4.IsValid() && !n.IPv4Gateway.IsValid()
	need6 := len(n.IPv6) > 0 && !n.IPv6Gateway.IsValid()
	needDNS := n.Static() && len(n.Nameservers) == 0
	if !need4 && !need6 && !needDNS {
		return n, nil
	}
	name := p.opts.Host.Network
	var doc string
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		nw, err := l.NetworkLookupByName(name)
		if err != nil {
			return fmt.Errorf("look up network %s: %w", name, err)
		}
		doc, err = l.NetworkGetXMLDesc(nw, 0)
		if err != nil {
			return fmt.Errorf("read network %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	v4, v6, dns, err := networkAddrs(doc)
	if err != nil {
		return n, fleet.Permanent(fmt.Errorf("network %s: %w", name, err))
	}
	if need4 {
		if !v4.IsValid() {
			return n, fleet.Permanent(fmt.Errorf("network %s has no IPv4 address to be the guests' gateway: set the plan's ipv4_gateway", name))
		}
		n.IPv4Gateway = v4
	}
	if need6 {
		if !v6.IsValid() {
			return n, fleet.Permanent(fmt.Errorf("network %s has no IPv6 address to be the guests' gateway: set the plan's ipv6_gateway", name))
		}
		n.IPv6Gateway = v6
	}
	if needDNS && dns {
		if n.IPv4.IsValid() && v4.IsValid() {
			n.Nameservers = append(n.Nameservers, v4)
		}
		if len(n.IPv6) > 0 && v6.IsValid() {
			n.Nameservers = append(n.Nameservers, v6)
		}
	}
	return n, nil
}
