package kvm

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"go.yaml.in/yaml/v3"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

var (
	addr = netip.MustParseAddr
	gw4  = addr("198.18.101.1")
)

// testNetwork is a dual-stack static network from the test host's ranges.
func testNetwork() fleet.Network {
	return fleet.Network{
		MAC:  "52:54:00:12:34:56",
		IPv4: addr("198.18.101.5"), IPv4Gateway: gw4,
		IPv6:        []netip.Addr{addr("2001:db8:101::5"), addr("2001:db8:101::6")},
		IPv6Gateway: addr("fe80::1"),
	}
}

func TestCheckNetwork(t *testing.T) {
	n, err := checkNetwork(fleet.Network{})
	if err != nil || !reflect.DeepEqual(n, fleet.Network{}) {
		t.Fatalf("zero network: %+v, %v", n, err)
	}
	// A MAC alone pins the interface's address; DHCP configures it.
	if n, err := checkNetwork(fleet.Network{MAC: "52-54-00-AB-CD-EF"}); err != nil || n.MAC != "52:54:00:ab:cd:ef" {
		t.Fatalf("mac only: %+v, %v", n, err)
	}
	good := testNetwork()
	good.MAC = "52:54:00:12:34:5A"
	n, err = checkNetwork(good)
	if err != nil || n.MAC != "52:54:00:12:34:5a" || n.IPv4 != good.IPv4 || !reflect.DeepEqual(n.IPv6, good.IPv6) {
		t.Fatalf("dual stack: %+v, %v", n, err)
	}
	v4only := fleet.Network{MAC: "52:54:00:12:34:56", IPv4: addr("203.0.113.7"), IPv4Gateway: addr("203.0.113.1")}
	v6only := fleet.Network{MAC: "52:54:00:12:34:56", IPv6: []netip.Addr{addr("2001:db8::7")}, IPv6Gateway: addr("2001:db8::1")}
	for _, n := range []fleet.Network{v4only, v6only} {
		if _, err := checkNetwork(n); err != nil {
			t.Errorf("%+v: %v", n, err)
		}
	}
	for name, f := range map[string]func(*fleet.Network){
		"no mac":               func(n *fleet.Network) { n.MAC = "" },
		"bad mac":              func(n *fleet.Network) { n.MAC = "52:54:00:12:34" },
		"long mac":             func(n *fleet.Network) { n.MAC = "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01" },
		"multicast mac":        func(n *fleet.Network) { n.MAC = "01:00:5e:00:00:01" },
		"zero mac":             func(n *fleet.Network) { n.MAC = "00:00:00:00:00:00" },
		"ipv4 is ipv6":         func(n *fleet.Network) { n.IPv4 = addr("2001:db8::9") },
		"ipv4 mapped":          func(n *fleet.Network) { n.IPv4 = addr("::ffff:198.18.101.5") },
		"ipv4 no gateway":      func(n *fleet.Network) { n.IPv4Gateway = netip.Addr{} },
		"ipv4 gateway alone":   func(n *fleet.Network) { n.IPv4 = netip.Addr{} },
		"ipv4 loopback":        func(n *fleet.Network) { n.IPv4 = addr("127.0.0.2") },
		"ipv4 unspecified":     func(n *fleet.Network) { n.IPv4 = addr("0.0.0.0") },
		"ipv4 multicast":       func(n *fleet.Network) { n.IPv4 = addr("224.0.0.1") },
		"ipv4 link-local":      func(n *fleet.Network) { n.IPv4 = addr("169.254.1.1") },
		"ipv4 gateway is ipv6": func(n *fleet.Network) { n.IPv4Gateway = addr("fe80::1") },
		"gateway is own":       func(n *fleet.Network) { n.IPv4Gateway = n.IPv4 },
		"ipv6 is ipv4":         func(n *fleet.Network) { n.IPv6 = []netip.Addr{addr("198.18.101.9")} },
		"ipv6 mapped":          func(n *fleet.Network) { n.IPv6 = []netip.Addr{addr("::ffff:198.18.101.9")} },
		"ipv6 zone":            func(n *fleet.Network) { n.IPv6 = []netip.Addr{addr("2001:db8::5%eth0")} },
		"ipv6 link-local":      func(n *fleet.Network) { n.IPv6 = []netip.Addr{addr("fe80::5")} },
		"ipv6 invalid":         func(n *fleet.Network) { n.IPv6 = []netip.Addr{{}} },
		"ipv6 twice":           func(n *fleet.Network) { n.IPv6 = []netip.Addr{addr("2001:db8::5"), addr("2001:db8::5")} },
		"ipv6 no gateway":      func(n *fleet.Network) { n.IPv6Gateway = netip.Addr{} },
		"ipv6 gateway alone":   func(n *fleet.Network) { n.IPv6 = nil },
		"ipv6 gateway zone":    func(n *fleet.Network) { n.IPv6Gateway = addr("fe80::1%eth0") },
		"ipv6 gateway is own":  func(n *fleet.Network) { n.IPv6Gateway = n.IPv6[1] },
		"ipv6 gateway is ipv4": func(n *fleet.Network) { n.IPv6Gateway = gw4 },
		"gateways, no address": func(n *fleet.Network) { n.IPv4, n.IPv6 = netip.Addr{}, nil },
		"dns, no address": func(n *fleet.Network) {
			n.IPv4, n.IPv6, n.IPv4Gateway, n.IPv6Gateway = netip.Addr{}, nil, netip.Addr{}, netip.Addr{}
			n.Nameservers = []netip.Addr{addr("198.18.0.1")}
		},
		"dns unspecified": func(n *fleet.Network) { n.Nameservers = []netip.Addr{addr("0.0.0.0")} },
		"dns multicast":   func(n *fleet.Network) { n.Nameservers = []netip.Addr{addr("ff02::fb")} },
		"dns zone":        func(n *fleet.Network) { n.Nameservers = []netip.Addr{addr("fe80::1%eth0")} },
		"dns four": func(n *fleet.Network) {
			n.Nameservers = []netip.Addr{addr("198.18.0.1"), addr("198.18.0.2"), addr("198.18.0.3"), addr("198.18.0.4")}
		},
	} {
		n := testNetwork()
		f(&n)
		if got, err := checkNetwork(n); err == nil {
			t.Errorf("%s: accepted as %+v", name, got)
		}
	}
}

// netCfgV2 is the part of cloud-init's network config v2 networkConfig
// writes, read back.
type netCfgV2 struct {
	Version   int `yaml:"version"`
	Ethernets map[string]struct {
		Match struct {
			MACAddress string `yaml:"macaddress"`
		} `yaml:"match"`
		SetName   string   `yaml:"set-name"`
		DHCP4     *bool    `yaml:"dhcp4"`
		DHCP6     *bool    `yaml:"dhcp6"`
		AcceptRA  *bool    `yaml:"accept-ra"`
		Addresses []string `yaml:"addresses"`
		Gateway4  string   `yaml:"gateway4"`
		Gateway6  string   `yaml:"gateway6"`
		Routes    []any    `yaml:"routes"`
		DNS       *struct {
			Addresses []string `yaml:"addresses"`
		} `yaml:"nameservers"`
	} `yaml:"ethernets"`
}

// checkNetCfg reads network-config s back and checks it says exactly n:
// version 2, the interface matched by n's MAC and named eth0, no DHCP or
// router advertisements, the IPv6 addresses (as /128s) first and then the
// IPv4 one (a /32), and a gateway for each family present. Every string is
// double-quoted, so YAML 1.1 (cloud-init's PyYAML) reads it as the string
// written too.
func checkNetCfg(t *testing.T, s string, n fleet.Network) {
	t.Helper()
	var c netCfgV2
	dec := yaml.NewDecoder(strings.NewReader(s))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("network-config does not read back: %v\n%s", err, s)
	}
	eth, ok := c.Ethernets["eth0"]
	if c.Version != 2 || !ok || len(c.Ethernets) != 1 {
		t.Fatalf("network-config: version %d, ethernets %v\n%s", c.Version, c.Ethernets, s)
	}
	var want []string
	for _, a := range n.IPv6 {
		want = append(want, a.String()+"/128")
	}
	if n.IPv4.IsValid() {
		want = append(want, n.IPv4.String()+"/32")
	}
	gw := func(a netip.Addr) string {
		if a.IsValid() {
			return a.String()
		}
		return ""
	}
	off := func(b *bool) bool { return b != nil && !*b }
	if eth.Match.MACAddress != n.MAC || eth.SetName != "eth0" || !off(eth.DHCP4) || !off(eth.DHCP6) || !off(eth.AcceptRA) ||
		!reflect.DeepEqual(eth.Addresses, want) || eth.Gateway4 != gw(n.IPv4Gateway) || eth.Gateway6 != gw(n.IPv6Gateway) || eth.Routes != nil {
		t.Fatalf("network-config reads as %+v, want addresses %q, gateways %v %v:\n%s", eth, want, n.IPv4Gateway, n.IPv6Gateway, s)
	}
	var dns []string
	if eth.DNS != nil {
		dns = eth.DNS.Addresses
	}
	if len(dns) != len(n.Nameservers) || (len(dns) > 0 && !reflect.DeepEqual(dns, addrStrings(n.Nameservers))) || (eth.DNS != nil && len(dns) == 0) {
		t.Fatalf("network-config's nameservers %v, want %v:\n%s", dns, n.Nameservers, s)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v *yaml.Node)
	walk = func(v *yaml.Node) {
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Style != yaml.DoubleQuotedStyle {
			t.Fatalf("%q is not double-quoted:\n%s", v.Value, s)
		}
		for i, c := range v.Content {
			if v.Kind == yaml.MappingNode && i%2 == 0 {
				continue // a key: the fixed names of the format
			}
			walk(c)
		}
	}
	walk(&doc)
}

func TestNetworkConfig(t *testing.T) {
	dual := testNetwork()
	v4 := fleet.Network{MAC: "52:54:00:00:00:01", IPv4: addr("198.18.101.5"), IPv4Gateway: gw4}
	v6 := fleet.Network{MAC: "52:54:00:00:00:02", IPv6: []netip.Addr{addr("2001:db8:101::5")}, IPv6Gateway: addr("2001:db8:101::1")}
	// 1:2:3:4:5:6:7:8 and a MAC of decimal digits are base-60 integers to
	// YAML 1.1 unless quoted.
	sexagesimal := fleet.Network{MAC: "12:34:56:12:34:56", IPv6: []netip.Addr{addr("1:2:3:4:5:6:7:8")}, IPv6Gateway: addr("1:2:3:4:5:6:7:1")}
	withDNS := v4
	withDNS.Nameservers = []netip.Addr{addr("198.18.101.1"), addr("2001:db8:101::1")}
	for _, n := range []fleet.Network{dual, v4, v6, sexagesimal, withDNS} {
		s, err := networkConfig(n)
		if err != nil {
			t.Fatal(err)
		}
		checkNetCfg(t, s, n)
	}
	s, _ := networkConfig(dual)
	want := `version: 2
ethernets:
  eth0:
    match:
      macaddress: "52:54:00:12:34:56"
    set-name: "eth0"
    dhcp4: false
    dhcp6: false
    accept-ra: false
    addresses:
      - "2001:db8:101::5/128"
      - "2001:db8:101::6/128"
      - "198.18.101.5/32"
    gateway4: "198.18.101.1"
    gateway6: "fe80::1"
`
	if s != want {
		t.Fatalf("network-config:\n%s\nwant\n%s", s, want)
	}
	for _, n := range []fleet.Network{{}, {MAC: "52:54:00:00:00:01"}, {IPv4: gw4}} {
		if s, err := networkConfig(n); err == nil {
			t.Errorf("%+v: rendered\n%s", n, s)
		}
	}
}

// A static network adds network-config to the seed, next to meta-data and
// user-data as they were; the zero one leaves the two files alone
// (TestSeed_readsBack).
func TestSeed_networkConfig(t *testing.T) {
	n := testNetwork()
	ud := "#cloud-config\nhostname: pf-p1\n"
	img, err := seedISO("p1-3f2a9c", "pf-p1", ud, n)
	if err != nil {
		t.Fatal(err)
	}
	files := readISO(t, img)
	if len(files) != 3 || files["user-data"] != ud || files["meta-data"] != "instance-id: \"p1-3f2a9c\"\nlocal-hostname: \"pf-p1\"\n" {
		t.Fatalf("files %q", files)
	}
	checkNetCfg(t, files["network-config"], n)
	if !bytes.Contains(img, []byte("network-config;1")) {
		t.Fatal(`no directory record "network-config;1": the guest would not see network-config`)
	}
	zero, err := seedISO("p1-3f2a9c", "pf-p1", ud, fleet.Network{})
	if err != nil {
		t.Fatal(err)
	}
	if files := readISO(t, zero); len(files) != 2 || files["user-data"] != ud {
		t.Fatalf("zero network: files %q", files)
	}
	if bytes.Contains(zero, []byte("network")) {
		t.Fatal("zero network: the seed mentions a network")
	}
	// An unchecked static network without a MAC cannot be matched.
	n.MAC = ""
	if _, err := seedISO("p1-3f2a9c", "pf-p1", ud, n); err == nil {
		t.Fatal("static network without a mac: seed written")
	}
}

func agentIfaces(addrs ...string) []libvirt.DomainInterface {
	lo := libvirt.DomainInterface{Name: "lo", Addrs: []libvirt.DomainIPAddr{
		{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "127.0.0.1", Prefix: 8},
		{Type: int32(libvirt.IPAddrTypeIpv6), Addr: "::1", Prefix: 128},
	}}
	eth := libvirt.DomainInterface{Name: "eth0", Hwaddr: libvirt.OptString{"52:54:00:12:34:56"}}
	for _, a := range addrs {
		typ := libvirt.IPAddrTypeIpv4
		if strings.Contains(a, ":") {
			typ = libvirt.IPAddrTypeIpv6
		}
		eth.Addrs = append(eth.Addrs, libvirt.DomainIPAddr{Type: int32(typ), Addr: a})
	}
	return []libvirt.DomainInterface{lo, eth}
}

// planState: a static proxy is running unless its guest agent answers
// without the address of record.
func TestPlanState(t *testing.T) {
	v4, v6 := addr("198.18.101.5"), addr("2001:db8:101::5")
	for _, c := range []struct {
		name   string
		addr   netip.Addr
		ifaces []libvirt.DomainInterface
		err    error
		state  string
		reason string
	}{
		{"agent holds it", v4, agentIfaces("fe80::5054:ff:fe12:3456", "198.18.101.5", "2001:db8:101::5"), nil, messages.StateRunning, ""},
		{"ipv6 of record", v6, agentIfaces("2001:db8:101::5"), nil, messages.StateRunning, ""},
		{"ipv6 written long", v6, agentIfaces("2001:0db8:0101:0000:0000:0000:0000:0005"), nil, messages.StateRunning, ""},
		{"agent not connected", v4, nil, errors.New("Guest agent is not responding: QEMU guest agent is not connected"), messages.StateRunning, ""},
		{"agent errors, answer irrelevant", v4, agentIfaces("198.18.100.9"), errors.New("agent error"), messages.StateRunning, ""},
		{"another address", v4, agentIfaces("fe80::5054:ff:fe12:3456", "198.18.100.9"), nil, messages.StateProvisioning,
			"address mismatch: agent reports fe80::5054:ff:fe12:3456, 198.18.100.9, plan has 198.18.101.5"},
		{"not configured yet", v4, agentIfaces(), nil, messages.StateProvisioning,
			"address mismatch: agent reports no address, plan has 198.18.101.5"},
		{"no interfaces at all", v4, nil, nil, messages.StateProvisioning,
			"address mismatch: agent reports no address, plan has 198.18.101.5"},
		{"only on loopback", v4, []libvirt.DomainInterface{{Name: "lo", Addrs: []libvirt.DomainIPAddr{{Addr: "198.18.101.5"}}}}, nil,
			messages.StateProvisioning, "address mismatch: agent reports no address, plan has 198.18.101.5"},
		{"ipv6 of record missing", v6, agentIfaces("198.18.101.5", "2001:db8:101::6"), nil, messages.StateProvisioning,
			"address mismatch: agent reports 198.18.101.5, 2001:db8:101::6, plan has 2001:db8:101::5"},
		{"garbage from the agent", v4, agentIfaces("not an address"), nil, messages.StateProvisioning,
			"address mismatch: agent reports no address, plan has 198.18.101.5"},
		{"many", v4, agentIfaces("198.19.9.1", "198.19.9.2", "198.19.9.3", "198.19.9.4", "198.19.9.5", "198.19.9.6", "198.19.9.7", "198.19.9.8", "198.19.9.9", "198.19.9.10"), nil,
			messages.StateProvisioning, "address mismatch: agent reports 198.19.9.1, 198.19.9.2, 198.19.9.3, 198.19.9.4, 198.19.9.5, 198.19.9.6, 198.19.9.7, 198.19.9.8 and 2 more, plan has 198.18.101.5"},
	} {
		state, reason := planState(c.addr, c.ifaces, c.err)
		if state != c.state || reason != c.reason {
			t.Errorf("%s: %s %q, want %s %q", c.name, state, reason, c.state, c.reason)
		}
	}
}

// A plan's default gateways are its network's own addresses, the first of
// each family, and so are its default nameservers unless the network's DNS
// is off.
func TestNetworkAddrs(t *testing.T) {
	v4, v6, dns, err := networkAddrs(`<network><name>pf</name><forward mode='open'/>
  <ip address='198.18.100.1' netmask='255.255.255.0'/>
  <ip family='ipv6' address='2001:db8:100::1' prefix='64'/>
  <ip family='ipv6' address='2001:db8:200::1' prefix='64'/></network>`)
	if err != nil || v4.String() != "198.18.100.1" || v6.String() != "2001:db8:100::1" || !dns {
		t.Errorf("networkAddrs = %s, %s, dns %v, %v", v4, v6, dns, err)
	}
	_, _, dns, err = networkAddrs(`<network><name>pf</name><forward mode='route'/><dns enable='no'/>
  <ip address='198.18.100.1' netmask='255.255.255.0'/></network>`)
	if err != nil || dns {
		t.Errorf("a network with DNS off: dns %v, %v", dns, err)
	}
	v4, v6, dns, err = networkAddrs(`<network><name>br</name><forward mode='bridge'/><bridge name='br0'/></network>`)
	if err != nil || v4.IsValid() || v6.IsValid() || dns {
		t.Errorf("a bridge network: %s, %s, dns %v, %v; want none", v4, v6, dns, err)
	}
	if _, _, _, err := networkAddrs(`<network`); err == nil {
		t.Error("a broken definition read")
	}
}
