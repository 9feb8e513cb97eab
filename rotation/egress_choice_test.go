package rotation

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func planned(n int) Proxy {
	p := Proxy{ID: "p1", EgressAddrs: []netip.Addr{netip.MustParseAddr("198.18.101.5")}}
	a := netip.MustParseAddr("2001:db8:101::10")
	for range n {
		p.EgressAddrs = append(p.EgressAddrs, a)
		a = a.Next()
	}
	return p
}

// A session keeps its address; 32 sessions spread over a proxy's 16 IPv6
// addresses; a family is kept to; a proxy without addresses has none.
func TestSessionEgress(t *testing.T) {
	p := planned(16)
	seen := map[netip.Addr]bool{}
	for i := range 32 {
		key := fmt.Sprintf("s%d", i)
		a := SessionEgress(p, key, IPv6)
		if !a.Is6() || SessionEgress(p, key, IPv6) != a {
			t.Fatalf("session %s: %s, then %s", key, a, SessionEgress(p, key, IPv6))
		}
		seen[a] = true
	}
	if len(seen) < 12 {
		t.Errorf("32 sessions over 16 addresses took %d of them", len(seen))
	}
	if a := SessionEgress(p, "s1", IPv4); a.String() != "198.18.101.5" {
		t.Errorf("IPv4 session egress %s", a)
	}
	if a := SessionEgress(Proxy{ID: "p2"}, "s1", AnyFamily); a.IsValid() {
		t.Errorf("a proxy without addresses gave %s", a)
	}
	// A proxy with fewer addresses (its plan changed) moves only the
	// sessions of the addresses it no longer has.
	q := planned(16)
	q.EgressAddrs = q.EgressAddrs[:9]
	for i := range 32 {
		key := fmt.Sprintf("s%d", i)
		if a := SessionEgress(p, key, IPv6); slices.Contains(q.EgressAddrs, a) && SessionEgress(q, key, IPv6) != a {
			t.Errorf("session %s moved off %s, which the proxy still has", key, a)
		}
	}
}

func TestEgressAtRotates(t *testing.T) {
	p := planned(4)
	for n := range uint64(8) {
		if a, b := EgressAt(p, n, IPv6), EgressAt(p, n+1, IPv6); a == b || !a.Is6() {
			t.Fatalf("EgressAt %d and %d: %s, %s", n, n+1, a, b)
		}
	}
	if a := RandomEgress(p, AnyFamily); !a.IsValid() {
		t.Error("no random egress")
	}
}
