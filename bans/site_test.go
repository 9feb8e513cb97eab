package bans

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestSite(t *testing.T) {
	for _, c := range []struct{ host, want string }{
		{"www.shop.example", "shop.example"},
		{"Shop.Example.", "shop.example"},
		{"a.b.c.example.co.uk", "example.co.uk"},
		{"WWW.BÜCHER.de", "xn--bcher-kva.de"},
		{"xn--bcher-kva.de", "xn--bcher-kva.de"},
		{"user.github.io", "user.github.io"},
		{"github.io", "github.io"}, // a public suffix stands alone
		{"co.uk", "co.uk"},
		{"localhost", "localhost"},
		{"203.0.113.7", "203.0.113.7"},
		{"2001:DB8::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
	} {
		got, err := Site(c.host)
		if err != nil || got != c.want {
			t.Errorf("Site(%q) = %q, %v; want %q", c.host, got, err, c.want)
		}
	}
	for _, host := range []string{
		"", ".", "a..example", "shop.example..", "shop.example:443", "fe80::1%eth0",
		"[203.0.113.7]", "[2001:db8::1", "a b.example", "shop_x.example", "=203-0-113-7",
		"evil\x00.example", "1.2.3", "0x7f.1", "x.0x7f", strings.Repeat("a.", 200) + "example",
		"*.shop.example", "shop.example/path",
	} {
		if got, err := Site(host); err == nil {
			t.Errorf("Site(%q) = %q, want an error", host, got)
		} else if !errors.Is(err, ErrHost) {
			t.Errorf("Site(%q): %v does not wrap ErrHost", host, err)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, c := range []struct{ addr, host, key string }{
		{"203.0.113.7", "www.shop.example", "203-0-113-7.shop.example"},
		{"2001:db8::1", "shop.example", "2001_db8__1.shop.example"},
		{"203.0.113.7", "198.51.100.1", "203-0-113-7.=198-51-100-1"},
		{"2001:db8::1", "[2001:db8::2]", "2001_db8__1.=2001_db8__2"},
		{"::ffff:203.0.113.7", "bücher.de", "203-0-113-7.xn--bcher-kva.de"},
	} {
		a, err := ParseAddr(c.addr)
		if err != nil {
			t.Fatal(err)
		}
		site, err := Site(c.host)
		if err != nil {
			t.Fatal(err)
		}
		key := Key(a, site)
		if key != c.key {
			t.Errorf("Key(%s, %s) = %q, want %q", a, site, key, c.key)
		}
		ga, gs, err := ParseKey(key)
		if err != nil || ga != a.Unmap() || gs != site {
			t.Errorf("ParseKey(%q) = %s, %q, %v; want %s, %q", key, ga, gs, err, a, site)
		}
		for _, r := range key {
			if !strings.ContainsRune("-/_=.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", r) {
				t.Errorf("key %q has %q, outside NATS KV's key characters", key, r)
			}
		}
	}
	for _, key := range []string{
		"", "203-0-113-7", "203-0-113-7.", "203.0.113.7.shop.example", "2001:db8::1.shop.example",
		"203-0-113-7.Shop.example", "203-0-113-7.www.shop.example", "203-0-113-007.shop.example",
		"203-0-113-7.=shop", "x.shop.example", "203-0-113-7.=2001_db8__0001",
	} {
		if a, s, err := ParseKey(key); err == nil {
			t.Errorf("ParseKey(%q) = %s, %q; want an error", key, a, s)
		}
	}
}

func FuzzKey(f *testing.F) {
	f.Add("203.0.113.7", "www.shop.example")
	f.Add("2001:db8::1", "[::1]")
	f.Fuzz(func(t *testing.T, addr, host string) {
		a, err := ParseAddr(addr)
		if err != nil {
			return
		}
		site, err := Site(host)
		if err != nil {
			return
		}
		if again, err := Site(site); err != nil || again != site {
			t.Fatalf("Site(%q) = %q, but Site of that = %q, %v", host, site, again, err)
		}
		ga, gs, err := ParseKey(Key(a, site))
		if err != nil || ga != a || gs != site {
			t.Fatalf("ParseKey(Key(%s, %q)) = %s, %q, %v", a, site, ga, gs, err)
		}
	})
}

func TestAddrFilters(t *testing.T) {
	a := netip.MustParseAddr("2001:db8::1")
	if got := AddrFilter(a); got != "2001_db8__1.>" {
		t.Errorf("AddrFilter = %q", got)
	}
	if got := SiteFilter("198.51.100.1"); got != "*.=198-51-100-1" {
		t.Errorf("SiteFilter = %q", got)
	}
}
