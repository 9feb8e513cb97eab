package kvm

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

var (
	goldenAuthProxy = GuestProxy{Port: 3128, User: "fleet", Password: "x", Allow: []netip.Prefix{
		netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8::/32")}}
	goldenOpenProxy = GuestProxy{Port: 8080, Open: true}
)

// A proxy whose network is the host's DHCP has no egress addresses: its
// squid.conf has no egress rule and no dns_nameservers, and is byte for
// byte the golden file of its access settings (credential and allow-list,
// or open; the default deny list), whether egress is nil or empty.
func TestSquidConf_noEgressUnchanged(t *testing.T) {
	for _, c := range []struct {
		golden, id string
		gp         GuestProxy
	}{
		{"squid-dhcp-auth.conf", "p1", goldenAuthProxy},
		{"squid-dhcp-open.conf", "p2", goldenOpenProxy},
	} {
		want, err := os.ReadFile("testdata/golden/" + c.golden)
		if err != nil {
			t.Fatal(err)
		}
		for _, egress := range [][]netip.Addr{nil, {}} {
			if got := squidConf(c.id, "pf-"+c.id, c.gp, egress, nil); got != string(want) {
				t.Errorf("%s: the configuration changed:\n%s\nwant\n%s", c.golden, got, want)
			}
		}
	}
}

func TestSquidConf_egress(t *testing.T) {
	n := goldenNetwork()
	got := squidConf("p1", "pf-p1", goldenAuthProxy, n.Egress(), n.Nameservers)
	want, err := os.ReadFile("testdata/golden/squid-egress.conf")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("the configuration changed:\n%s\nwant\n%s", got, want)
	}
	// Its lines beyond the DHCP one's are the egress rules alone.
	base := squidConf("p1", "pf-p1", goldenAuthProxy, nil, nil)
	var extra []string
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if !strings.Contains(base, l+"\n") {
			extra = append(extra, l)
		}
	}
	wantExtra := []string{
		`acl proxyfleet_egress_0 req_header X-Proxyfleet-Egress ^198\.18\.101\.200$`,
		`tcp_outgoing_address 198.18.101.200 proxyfleet_egress_0`,
		`acl proxyfleet_egress_1 req_header X-Proxyfleet-Egress ^2001:db8:101:0:8000::ff00$`,
		`tcp_outgoing_address 2001:db8:101:0:8000::ff00 proxyfleet_egress_1`,
		`acl proxyfleet_egress_2 req_header X-Proxyfleet-Egress ^2001:db8:101:0:8000::ff01$`,
		`tcp_outgoing_address 2001:db8:101:0:8000::ff01 proxyfleet_egress_2`,
		`tcp_outgoing_address 198.18.101.200`,
		`tcp_outgoing_address 2001:db8:101:0:8000::ff00`,
		`request_header_access X-Proxyfleet-Egress deny all`,
		`dns_nameservers 198.18.101.1 2001:db8:101::1`,
	}
	if strings.Join(extra, "\n") != strings.Join(wantExtra, "\n") {
		t.Fatalf("egress lines:\n%s\nwant\n%s", strings.Join(extra, "\n"), strings.Join(wantExtra, "\n"))
	}
	if !strings.Contains(got, "request_header_access "+messages.HeaderEgress+" deny all\n") {
		t.Fatal("the header reaches the target")
	}
}

// One family alone gets one default, of that family.
func TestSquidConf_egressOneFamily(t *testing.T) {
	v6 := []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}
	got := squidConf("p1", "pf-p1", goldenOpenProxy, v6, nil)
	if !strings.Contains(got, "\ntcp_outgoing_address 2001:db8::1\n") {
		t.Errorf("no IPv6 default:\n%s", got)
	}
	if strings.Count(got, "tcp_outgoing_address") != 3 {
		t.Errorf("want 2 chosen and 1 default tcp_outgoing_address:\n%s", got)
	}
	v4 := []netip.Addr{netip.MustParseAddr("198.18.101.201")}
	got = squidConf("p1", "pf-p1", goldenOpenProxy, v4, nil)
	if !strings.Contains(got, `req_header X-Proxyfleet-Egress ^198\.18\.101\.201$`) || !strings.Contains(got, "\ntcp_outgoing_address 198.18.101.201\n") {
		t.Errorf("IPv4 alone:\n%s", got)
	}
}

func TestUserData_egressForTemplates(t *testing.T) {
	n := goldenNetwork()
	got, err := userData("{{range .Egress}}{{.}},{{end}}{{len .Egress}}", testGuestProxy, "p1", "pf-p1", n)
	if err != nil {
		t.Fatal(err)
	}
	if want := "198.18.101.200,2001:db8:101:0:8000::ff00,2001:db8:101:0:8000::ff01,3"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got, err = userData("{{len .Egress}} {{len .Nameservers}}", testGuestProxy, "p1", "pf-p1", fleet.Network{}); err != nil || got != "0 0" {
		t.Fatalf("no egress: %q, %v", got, err)
	}
	if got, err = userData("{{range .Nameservers}}{{.}},{{end}}", testGuestProxy, "p1", "pf-p1", n); err != nil || got != "198.18.101.1,2001:db8:101::1," {
		t.Fatalf("nameservers: %q, %v", got, err)
	}
	// The default user-data carries the rules.
	ud, err := userData("", testGuestProxy, "p1", "pf-p1", n)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ud, "    tcp_outgoing_address 2001:db8:101:0:8000::ff01 proxyfleet_egress_2\n") {
		t.Fatalf("default user-data without the egress rules:\n%s", ud)
	}
}

func goldenNetwork() fleet.Network {
	return fleet.Network{
		MAC:         "52:54:00:aa:bb:cc",
		IPv4:        netip.MustParseAddr("198.18.101.200"),
		IPv4Gateway: netip.MustParseAddr("198.18.101.1"),
		IPv6:        []netip.Addr{netip.MustParseAddr("2001:db8:101:0:8000::ff00"), netip.MustParseAddr("2001:db8:101:0:8000::ff01")},
		IPv6Gateway: netip.MustParseAddr("2001:db8:101::1"),
		Nameservers: []netip.Addr{netip.MustParseAddr("198.18.101.1"), netip.MustParseAddr("2001:db8:101::1")},
	}
}
