package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"proxyfleet/bans"
	"proxyfleet/rotation"
)

// familyProxy is a proxy that records the HeaderEgress of each request
// it gets, answers a CONNECT 200 (and closes), a plain request 403 for a
// host starting with "shop." and 200 otherwise.
type familyProxy struct {
	srv  *httptest.Server
	mu   sync.Mutex
	told []string
}

func newFamilyProxy(t *testing.T) *familyProxy {
	fp := &familyProxy{}
	fp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp.mu.Lock()
		fp.told = append(fp.told, r.Header.Get(HeaderEgress))
		fp.mu.Unlock()
		if r.Method == http.MethodConnect {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				c.Close()
			}
			return
		}
		if strings.HasPrefix(r.URL.Hostname(), "shop.") {
			http.Error(w, "go away", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(fp.srv.Close)
	return fp
}

// last is the HeaderEgress of the last request the proxy got.
func (fp *familyProxy) last() string {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if len(fp.told) == 0 {
		return "<none>"
	}
	return fp.told[len(fp.told)-1]
}

// A target given by name gets an address of the family the proxy will
// reach it over, decided from the name's addresses as the gateway
// resolves them: only A records, an IPv4 address of a proxy that has
// both families; only AAAA, an IPv6 one; both, an IPv6 one; a name that
// does not resolve, none (the proxy chooses). Plain requests and
// CONNECT alike, with or without a session or egress-rotate; the answer
// names the address the proxy was told. A rule's ban for a named site
// lands on that address.
func TestEgressFamilyOfANamedTarget(t *testing.T) {
	v4 := []netip.Addr{netip.MustParseAddr("198.18.0.10")}
	v6 := []netip.Addr{netip.MustParseAddr("2001:db8::10")}
	both := append(slices.Clone(v4), v6...)
	names := map[string][]netip.Addr{
		"www.v4only.example":  v4,
		"shop.v4only.example": v4,
		"www.v6only.example":  v6,
		"shop.v6only.example": v6,
		"www.dual.example":    both,
		"shop.dual.example":   both,
		"www.nx.example":      nil,
	}
	fp := newFamilyProxy(t)
	own := netip.MustParseAddr("198.18.20.99")
	p := Proxy{ID: "p1", Addr: fp.srv.Listener.Addr().String(), Egress: own.String(), EgressAddrs: []netip.Addr{
		netip.MustParseAddr("198.18.20.1"),
		netip.MustParseAddr("2001:db8:20::1"), netip.MustParseAddr("2001:db8:20::2"), netip.MustParseAddr("2001:db8:20::3"),
	}}
	g := startGateway(t, newPicker(p), func(c *Config) {
		c.LookupNetIP = fakeLookup(names)
		c.Rules = mustRules(t, bans.RuleSpec{Status: []int{403}, Ban: 30 * time.Minute})
	})
	wantFamily := map[string]int{"v4only": rotation.IPv4, "v6only": rotation.IPv6, "dual": rotation.IPv6, "nx": rotation.NoFamily}
	check := func(what, name, answer string) {
		t.Helper()
		want := wantFamily[strings.Split(name, ".")[1]]
		told := fp.last()
		if answer != told {
			t.Fatalf("%s %s: the answer names %q, the proxy was told %q", what, name, answer, told)
		}
		if want == rotation.NoFamily {
			if told != "" {
				t.Fatalf("%s %s (does not resolve): the proxy was told %q, want nothing", what, name, told)
			}
			return
		}
		a, err := netip.ParseAddr(told)
		if err != nil || !slices.Contains(p.EgressAddrs, a) || !rotation.InFamily(a, want) {
			t.Fatalf("%s %s: the proxy was told %q, want one of its IPv%d addresses", what, name, told, want)
		}
	}
	for _, name := range []string{"www.v4only.example", "www.v6only.example", "www.dual.example", "www.nx.example"} {
		for _, user := range []string{"alice", "alice-session-s1", "alice-session-s2-egress-rotate"} {
			for range 6 {
				st, eg, _ := banDo(t, g, user, http.MethodGet, "http://"+name+"/", "", false, nil)
				if st != http.StatusOK {
					t.Fatalf("GET %s as %s: %d", name, user, st)
				}
				check("GET as "+user, name, eg)
				resp, conn, _ := g.connect(t, name+":443", basic(user, alicePass), nil)
				conn.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("CONNECT %s as %s: %s", name, user, resp.Status)
				}
				check("CONNECT as "+user, name, resp.Header.Get(HeaderEgress))
			}
		}
	}
	// A 403 for a named site bans the address the request left from, and
	// no other.
	for _, name := range []string{"shop.v4only.example", "shop.v6only.example", "shop.dual.example"} {
		st, eg, _ := banDo(t, g, "alice-session-b1", http.MethodGet, "http://"+name+"/", "", false, nil)
		if st != http.StatusForbidden {
			t.Fatalf("GET %s: %d, want the 403", name, st)
		}
		check("banned GET", name, eg)
		site, _ := bans.Site(name)
		for _, a := range append(slices.Clone(p.EgressAddrs), own) {
			if banned := g.bans.Banned(a, site); banned != (a.String() == eg) {
				t.Errorf("%s: %s banned %v; the request left from %s", site, a, banned, eg)
			}
		}
	}
}
