package main

import (
	"net"
	"reflect"
	"strings"
	"testing"
)

// proxyfleetNetworkConfig is what the kvm provider writes for a proxy with
// an address plan: one entry matched by MAC, static /32 and /128s,
// on-link default routes.
const proxyfleetNetworkConfig = `version: 2
ethernets:
  eth0:
    match: {macaddress: "52:54:00:12:34:56"}
    set-name: eth0
    dhcp4: false
    addresses: [198.18.101.5/32, "2001:db8:101::10/128", "2001:db8:101::11/128"]
    routes:
      - {to: 0.0.0.0/0, via: 198.18.100.1, on-link: true}
      - {to: "::/0", via: "2001:db8:100::1", on-link: true}
`

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func planStrings(steps []NetStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.String())
	}
	return out
}

func TestNetworkConfigProxyfleet(t *testing.T) {
	nc, err := ParseNetworkConfig([]byte(proxyfleetNetworkConfig))
	if err != nil {
		t.Fatal(err)
	}
	if len(nc.Ethernets) != 1 || len(nc.Ignored) != 0 {
		t.Fatalf("%+v", nc)
	}
	if e := nc.Select("eth0", mustMAC(t, "52:54:00:00:00:01")); e != nil {
		t.Fatalf("another MAC selected %+v", e)
	}
	e := nc.Select("ens3", mustMAC(t, "52:54:00:12:34:56"))
	if e == nil {
		t.Fatal("no entry for the MAC")
	}
	if got := e.Summary(); got != "198.18.101.5/32, 2001:db8:101::10/128, 2001:db8:101::11/128, 0.0.0.0/0 via 198.18.100.1 on-link, ::/0 via 2001:db8:100::1 on-link" {
		t.Fatalf("summary %q", got)
	}
	steps, iface := e.Plan("ens3")
	if iface != "eth0" {
		t.Fatalf("iface %q", iface)
	}
	want := []string{
		"ip link set dev ens3 down",
		"ip link set dev ens3 name eth0",
		"ip link set dev eth0 up",
		`/proc/sys/net/ipv6/conf/eth0/disable_ipv6="0"`,
		`/proc/sys/net/ipv6/conf/eth0/accept_dad="0"`,
		`/proc/sys/net/ipv6/conf/eth0/accept_ra="0"`,
		"ip -4 addr add 198.18.101.5/32 dev eth0",
		"ip -6 addr add 2001:db8:101::10/128 dev eth0",
		"ip -6 addr add 2001:db8:101::11/128 dev eth0",
		"ip -4 route replace 198.18.100.1 dev eth0",
		"ip -4 route replace default via 198.18.100.1 dev eth0",
		"ip -6 route replace 2001:db8:100::1 dev eth0",
		"ip -6 route replace default via 2001:db8:100::1 dev eth0",
	}
	if got := planStrings(steps); !reflect.DeepEqual(got, want) {
		t.Fatalf("plan\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Already named as set-name says: no rename.
	steps, _ = e.Plan("eth0")
	if got := planStrings(steps); got[0] != "ip link set dev eth0 up" {
		t.Fatalf("plan %v", got)
	}
}

func TestNetworkConfigForms(t *testing.T) {
	// Under network:, no match (the only entry), gateway4, a route whose
	// gateway is inside the address's prefix (no on-link route), a metric,
	// a route without via, nameservers, unknown keys, YAML 1.1 booleans,
	// netplan's address-with-options form.
	nc, err := ParseNetworkConfig([]byte(`network:
  version: 2
  renderer: networkd
  ethernets:
    id0:
      dhcp4: no
      optional: true
      addresses:
        - 192.0.2.10/24
        - "2001:db8:1::5/64": {lifetime: forever}
      gateway4: 192.0.2.1
      routes:
        - to: 198.51.100.0/24
          via: 192.0.2.254
          metric: 50
        - to: 203.0.113.7
          scope: link
        - to: default
          via: "2001:db8:1::1"
      nameservers: {addresses: [192.0.2.53], search: [example.test]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(nc.Ignored, ","); got != "renderer,ethernets.id0.optional" {
		t.Fatalf("ignored %q", got)
	}
	e := nc.Select("eth0", mustMAC(t, "52:54:00:00:00:01"))
	if e == nil || e.ID != "id0" {
		t.Fatalf("the only entry without a match is not selected: %+v", e)
	}
	steps, iface := e.Plan("eth0")
	want := []string{
		"ip link set dev eth0 up",
		`/proc/sys/net/ipv6/conf/eth0/disable_ipv6="0"`,
		`/proc/sys/net/ipv6/conf/eth0/accept_dad="0"`,
		`/proc/sys/net/ipv6/conf/eth0/accept_ra="0"`,
		"ip -4 addr add 192.0.2.10/24 dev eth0",
		"ip -6 addr add 2001:db8:1::5/64 dev eth0",
		"ip -4 route replace 198.51.100.0/24 via 192.0.2.254 dev eth0 metric 50",
		"ip -4 route replace 203.0.113.7/32 dev eth0",
		"ip -6 route replace default via 2001:db8:1::1 dev eth0",
		"ip -4 route replace default via 192.0.2.1 dev eth0",
		`/etc/resolv.conf="search example.test\nnameserver 192.0.2.53\n"`,
	}
	if got := planStrings(steps); iface != "eth0" || !reflect.DeepEqual(got, want) {
		t.Fatalf("plan (%s)\n%s\nwant\n%s", iface, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNetworkConfigSelect(t *testing.T) {
	nc, err := ParseNetworkConfig([]byte(`version: 2
ethernets:
  a: {match: {macaddress: "52:54:00:AA:00:01"}, addresses: [198.18.101.1/32]}
  b: {match: {name: "en*"}, addresses: [198.18.101.2/32]}
  eth1: {addresses: [198.18.101.3/32]}
  c: {match: {macaddress: "52:54:00:aa:00:04", name: "eth9"}, addresses: [198.18.101.4/32]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, mac, want string }{
		{"eth0", "52:54:00:aa:00:01", "a"}, // MAC, any case
		{"ens3", "52:54:00:aa:00:01", "a"}, // MAC before name
		{"ens3", "52:54:00:00:00:09", "b"},
		{"eth1", "52:54:00:00:00:09", "eth1"},
		{"eth0", "52:54:00:aa:00:04", ""}, // MAC and name must both match
		{"eth9", "52:54:00:aa:00:04", "c"},
		{"eth0", "52:54:00:00:00:09", ""}, // several entries: no fallback
	} {
		e := nc.Select(c.name, mustMAC(t, c.mac))
		got := ""
		if e != nil {
			got = e.ID
		}
		if got != c.want {
			t.Errorf("Select(%s, %s) = %q, want %q", c.name, c.mac, got, c.want)
		}
	}
}

func TestNetworkConfigDHCPEntry(t *testing.T) {
	nc, err := ParseNetworkConfig([]byte("version: 2\nethernets:\n  eth0: {dhcp4: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := nc.Select("eth0", nil)
	if e == nil || !e.DHCP4 || e.Configured {
		t.Fatalf("%+v", e)
	}
	steps, _ := e.Plan("eth0")
	if got := planStrings(steps); !reflect.DeepEqual(got, []string{"ip link set dev eth0 up"}) {
		t.Fatalf("plan %v", got)
	}
}

func TestNetworkConfigErrors(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"v1", "version: 1\nconfig:\n  - type: physical\n    name: eth0\n", "version 1"},
		{"v1 under network", "network:\n  version: 1\n  config: []\n", "version 1"},
		{"no version", "ethernets:\n  eth0: {dhcp4: true}\n", "version 0, want 2"},
		{"no ethernets", "version: 2\n", "no ethernets"},
		{"bonds", "version: 2\nethernets: {eth0: {}}\nbonds:\n  bond0: {interfaces: [eth0]}\n", "bonds are not supported"},
		{"not yaml", "version: 2\nethernets: [\n", "network-config:"},
		{"address without length", "version: 2\nethernets:\n  eth0: {addresses: [198.18.101.5]}\n", "not an address with a prefix length"},
		{"bad address", "version: 2\nethernets:\n  eth0: {addresses: [nope/32]}\n", "addresses[0]"},
		{"bad mac", "version: 2\nethernets:\n  eth0: {match: {macaddress: xx}}\n", "match.macaddress"},
		{"dhcp6", "version: 2\nethernets:\n  eth0: {dhcp6: true}\n", "dhcp6"},
		{"route family", "version: 2\nethernets:\n  eth0: {routes: [{to: 0.0.0.0/0, via: \"2001:db8::1\"}]}\n", "different families"},
		{"route table", "version: 2\nethernets:\n  eth0: {routes: [{to: 0.0.0.0/0, via: 192.0.2.1, table: 100}]}\n", "table 100"},
		{"route type", "version: 2\nethernets:\n  eth0: {routes: [{to: 192.0.2.0/24, type: blackhole}]}\n", "blackhole"},
		{"route no to", "version: 2\nethernets:\n  eth0: {routes: [{via: 192.0.2.1}]}\n", "no to"},
		{"default without via", "version: 2\nethernets:\n  eth0: {routes: [{to: default}]}\n", "needs a via"},
		{"route host bits", "version: 2\nethernets:\n  eth0: {routes: [{to: 192.0.2.1/24, via: 192.0.2.254}]}\n", "bits set"},
		{"gateway4 family", "version: 2\nethernets:\n  eth0: {gateway4: \"2001:db8::1\"}\n", "gateway4"},
		{"wrong type", "version: 2\nethernets:\n  eth0: {dhcp4: maybe}\n", "network-config:"},
	} {
		_, err := ParseNetworkConfig([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
}

func TestNetStatus(t *testing.T) {
	var n NetStatus
	if got := n.Status(); got["network"] != "pending" || len(got) != 1 {
		t.Fatalf("%v", got)
	}
	n.Set("network-config", "eth0", "198.18.101.5/32", []string{"renderer"}, nil)
	got := n.Status()
	if got["network"] != "network-config" || got["network_interface"] != "eth0" || got["network_config"] != "198.18.101.5/32" || got["network_error"] != nil {
		t.Fatalf("%v", got)
	}
}
