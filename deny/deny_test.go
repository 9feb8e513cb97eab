package deny

import (
	"net/netip"
	"slices"
	"testing"
)

func TestDefaultDenies(t *testing.T) {
	d := Default()
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"::1", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"::", true},
		{"169.254.169.254", true}, // a cloud's metadata service
		{"fe80::1", true},
		{"fe80::1%eth0", true}, // a zone is ignored
		{"febf:ffff::1", true},
		{"100.64.0.1", true},
		{"100.127.255.255", true},
		{"::ffff:127.0.0.1", true}, // IPv4-mapped: unmapped first
		{"::ffff:169.254.169.254", true},

		{"198.18.0.1", false}, // benchmarking (the tests' own)
		{"198.19.255.255", false},
		{"2001:db8::1", false},
		{"172.15.255.255", false},
		{"172.32.0.0", false},
		{"100.63.255.255", false},
		{"100.128.0.0", false},
		{"1.1.1.1", false},
		{"::2", false},
		{"fec0::1", false},
		{"fe00::1", false},
		{"::ffff:198.18.0.1", false},
		{"2606:4700::1111", false},
	} {
		if got := d.Denies(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Default().Denies(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	if d.Denies(netip.Addr{}) {
		t.Error("the zero Addr is denied")
	}
}

// Every address the standard library calls private (RFC 1918, ULA) is
// denied, as is its IPv4-mapped form: a sweep of the first and last
// address of every IPv4 /16, and of every /16 of fc00::/7.
func TestDefaultDeniesEveryPrivateAddress(t *testing.T) {
	d := Default()
	private := 0
	for hi := range 1 << 16 {
		a, b := byte(hi>>8), byte(hi)
		for _, ip := range []netip.Addr{netip.AddrFrom4([4]byte{a, b, 0, 1}), netip.AddrFrom4([4]byte{a, b, 255, 254})} {
			if !ip.IsPrivate() {
				continue
			}
			private++
			if !d.Denies(ip) || !d.Denies(netip.AddrFrom16(ip.As16())) {
				t.Errorf("Default() lets %s (or its IPv4-mapped form) through", ip)
			}
		}
	}
	for hi := 0xfc00; hi <= 0xfdff; hi++ {
		ip := netip.AddrFrom16([16]byte{byte(hi >> 8), byte(hi), 15: 1})
		if !ip.IsPrivate() {
			t.Fatalf("%s: not private by the standard library", ip)
		}
		private++
		if !d.Denies(ip) {
			t.Errorf("Default() lets %s through", ip)
		}
	}
	if want := 2*(256+16+1) + 512; private != want {
		t.Errorf("swept %d private addresses, want %d", private, want)
	}
}

func TestDefaultList(t *testing.T) {
	// RFC 1918's three blocks, built from their octets.
	private := func(a, b byte, bits int) string {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{a, b, 0, 0}), bits).String()
	}
	want := []string{"127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "169.254.0.0/16", "fe80::/10",
		private(10, 0, 8), private(172, 16, 12), private(192, 168, 16), "100.64.0.0/10", "fc00::/7"}
	if got := Default().Strings(); !slices.Equal(got, want) {
		t.Fatalf("Default() = %v, want %v", got, want)
	}
	// Each call is a list of its own.
	a := Default()
	a.nets[0] = netip.MustParsePrefix("198.18.0.0/15")
	if Default().Strings()[0] != "127.0.0.0/8" {
		t.Fatal("a caller changed the default list")
	}
}

func TestZeroAndEmptyDenyNothing(t *testing.T) {
	empty, err := Parse("gateway.deny", []string{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []List{{}, empty} {
		if l.Len() != 0 || len(l.Strings()) != 0 || l.Strings() == nil {
			t.Errorf("%+v: Len %d, Strings %#v", l, l.Len(), l.Strings())
		}
		for _, a := range []string{"127.0.0.1", "::1", "169.254.169.254", "0.0.0.0"} {
			if l.Denies(netip.MustParseAddr(a)) {
				t.Errorf("an empty list denies %s", a)
			}
		}
	}
}

func TestParseEntry(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"198.18.0.0/15", "198.18.0.0/15"},
		{"198.19.2.3/15", "198.18.0.0/15"}, // masked
		{"192.0.2.1", "192.0.2.1/32"},
		{"2001:db8::1", "2001:db8::1/128"},
		{"2001:db8::/32", "2001:db8::/32"},
		{"2001:DB8::1/48", "2001:db8::/48"},
		{"::ffff:127.0.0.1", "127.0.0.1/32"},       // IPv4-mapped: the IPv4 address
		{"::ffff:198.18.0.0/111", "198.18.0.0/15"}, // and network
		{"::ffff:0:0/96", "0.0.0.0/0"},             // every IPv4 address
		{"::/0", "::/0"},                           // every IPv6 address
		{"0.0.0.0/0", "0.0.0.0/0"},                 // every IPv4 address
		{"fe80::/10", "fe80::/10"},
		{"::ffff:0:0/95", "::fffe:0:0/95"}, // wider than the mapped range: as written
		{"169.254.169.254/32", "169.254.169.254/32"},
	} {
		p, err := ParseEntry(c.in)
		if err != nil || p.String() != c.want {
			t.Errorf("ParseEntry(%q) = %v, %v; want %s", c.in, p, err, c.want)
		}
	}
	for _, in := range []string{
		"", "x", "example.com", "198.18.0.0/33", "2001:db8::/129", "198.18.0.0/", "/8", "198.18.0.256",
		"198.018.0.1", "198.18", "fe80::1%eth0", "fe80::1%eth0/64", "198.18.0.0/15 ", " 198.18.0.0/15", "198.18.0.0-198.18.0.9",
		"198.18.0.0/255.254.0.0",
	} {
		if p, err := ParseEntry(in); err == nil {
			t.Errorf("ParseEntry(%q) = %v, want an error", in, p)
		}
	}
}

func TestParse(t *testing.T) {
	l, err := Parse("proxy.deny", []string{"198.18.0.0/15", "2001:db8::1", "::ffff:203.0.113.7"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Strings(), []string{"198.18.0.0/15", "2001:db8::1/128", "203.0.113.7/32"}; !slices.Equal(got, want) {
		t.Fatalf("Strings() = %v, want %v", got, want)
	}
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"198.19.1.2", true}, {"2001:db8::1", true}, {"2001:db8::2", false}, {"203.0.113.7", true},
		{"::ffff:203.0.113.7", true}, {"127.0.0.1", false}, {"169.254.169.254", false},
	} {
		if got := l.Denies(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Denies(%s) = %v, want %v", c.addr, got, c.want)
		}
	}

	for _, c := range []struct {
		field   string
		entries []string
		want    string
	}{
		{"gateway.deny", []string{"198.18.0.0/15", "fd00::/8", "x"}, `gateway.deny[2]: "x" is not a CIDR or address`},
		{"proxy.deny", []string{"example.com"}, `proxy.deny[0]: "example.com" is not a CIDR or address`},
		{"proxy.deny", []string{"198.18.0.0/33"}, `proxy.deny[0]: "198.18.0.0/33" is not a CIDR or address`},
	} {
		_, err := Parse(c.field, c.entries)
		if err == nil || err.Error() != c.want {
			t.Errorf("Parse(%s, %q): %v, want %s", c.field, c.entries, err, c.want)
		}
	}
}

func TestWith(t *testing.T) {
	base, err := Parse("gateway.deny", []string{"fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	l := base.With(netip.MustParseAddr("198.18.0.5"), netip.MustParseAddr("fe80::1%eth0"),
		netip.MustParseAddr("::ffff:198.18.0.6"), netip.Addr{})
	if got, want := l.Strings(), []string{"fd00::/8", "198.18.0.5/32", "fe80::1/128", "198.18.0.6/32"}; !slices.Equal(got, want) {
		t.Fatalf("With: %v, want %v", got, want)
	}
	if !l.Denies(netip.MustParseAddr("198.18.0.5")) || l.Denies(netip.MustParseAddr("198.18.0.4")) {
		t.Error("With: a single address is not denied alone")
	}
	if base.Len() != 1 {
		t.Errorf("With changed its receiver: %v", base.Strings())
	}
	// Prefixes is a copy.
	ps := l.Prefixes()
	ps[0] = netip.MustParsePrefix("0.0.0.0/0")
	if l.Strings()[0] != "fd00::/8" {
		t.Error("Prefixes shares the list's networks")
	}
}
