package rotation

import (
	"fmt"
	"net/http"
	"net/http/httptest"
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

// Proxy chooses the egress with the proxy (the session's own, of the
// target's family), and ProxyConnectHeader puts it on the CONNECT; a
// proxy without addresses gets no header.
func TestProxyFuncChoosesTheEgress(t *testing.T) {
	r, err := newRotation(Config{User: "fleet", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	p := planned(16)
	p.Addr = "198.18.101.5:3128"
	r.idx.put(p, 1)
	req := httptest.NewRequest(http.MethodGet, "https://[2001:db8::1]:443/", nil)
	req = req.WithContext(WithSession(req.Context(), "s7"))
	u, err := r.Proxy(req)
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.ProxyConnectHeader(req.Context(), u, "[2001:db8::1]:443")
	want := SessionEgress(p, "s7", IPv6).String()
	if err != nil || h.Get(HeaderEgress) != want || u.Host != p.Addr {
		t.Fatalf("proxy URL %s, CONNECT header %v, %v; want %s", u, h, err, want)
	}
	r.idx.del(p.ID)
	r.idx.put(Proxy{ID: "bare", Addr: "198.18.100.9:3128"}, 2)
	u, _ = r.Proxy(req)
	if h, err := r.ProxyConnectHeader(req.Context(), u, "x:443"); err != nil || h != nil {
		t.Fatalf("a proxy without addresses: %v, %v", h, err)
	}
}
