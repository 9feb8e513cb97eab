package messages

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func seq6(first string, n int) []netip.Addr {
	a := netip.MustParseAddr(first)
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

func TestCompactEgressRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		in   []netip.Addr
		want string
	}{
		{nil, ""},
		{addrs("198.18.101.5"), "198.18.101.5"},
		{append(addrs("198.18.101.5"), seq6("2001:db8::10", 16)...), "198.18.101.5 2001:db8::10/124"},
		{seq6("2001:db8::10", 3), "2001:db8::10/127 2001:db8::12"},
		{seq6("2001:db8::11", 4), "2001:db8::11 2001:db8::12/127 2001:db8::14"},
		{seq6("2001:db8::100", 256), "2001:db8::100/120"},
		{addrs("198.18.101.4", "198.18.101.5"), "198.18.101.4/31"},
		{addrs("198.18.101.5", "198.18.101.4"), "198.18.101.5 198.18.101.4"},
	} {
		got := CompactEgress(tc.in)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("CompactEgress(%v) = %v, want %s", tc.in, got, tc.want)
		}
		back, err := ExpandEgress(got)
		if err != nil || !slices.Equal(back, tc.in) {
			t.Errorf("ExpandEgress(%v) = %v, %v; want %v", got, back, err, tc.in)
		}
	}
}

func TestExpandEgressRefusesTooMuch(t *testing.T) {
	for _, in := range [][]string{
		{"2001:db8::/64"},
		{"2001:db8::/119"},
		{"2001:db8::/120", "2001:db8:1::/120", "198.18.0.1"},
		{"nope"},
		{"fe80::1%eth0"},
		{"2001:db8::1/120"},
	} {
		if got, err := ExpandEgress(in); err == nil {
			t.Errorf("ExpandEgress(%v) = %d addresses, want an error", in, len(got))
		}
	}
}

func TestEgressContains(t *testing.T) {
	items := []string{"198.18.101.5", "2001:db8:101::10/124"}
	for addr, want := range map[string]bool{
		"198.18.101.5": true, "::ffff:198.18.101.5": true, "2001:db8:101::1f": true,
		"2001:db8:101::20": false, "198.18.101.6": false, "nope": false, "": false,
	} {
		if got := EgressContains(items, addr); got != want {
			t.Errorf("EgressContains(%q) = %v, want %v", addr, got, want)
		}
	}
}

// BenchmarkExpandEgress is a proxy's egress list of a plan with an IPv4
// address and sixteen IPv6 addresses read back (a sim host's Get).
func BenchmarkExpandEgress(b *testing.B) {
	items := []string{"198.18.0.5", "2001:db8:1f4::640/124"}
	b.ReportAllocs()
	for b.Loop() {
		if as, err := ExpandEgress(items); err != nil || len(as) != 17 {
			b.Fatal(len(as), err)
		}
	}
}
