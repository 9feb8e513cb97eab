package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"proxyfleet/bans"
	"proxyfleet/rotation"
)

// The choice of a request's address passes over those it may not leave
// from (skip), with every way of choosing: at random, a session's (which
// moves to the next address by its hash only while its own is refused),
// egress-rotate; a proxy whose every address is refused, or whose own
// egress is when it has no plan, has none to give.
func TestEgressForSkips(t *testing.T) {
	g := &Gateway{}
	var addrs []netip.Addr
	for i := 1; i <= 4; i++ {
		addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("198.18.7.%d", i)))
	}
	addrs = append(addrs, netip.MustParseAddr("2001:db8:7::1"))
	p := Proxy{ID: "p1", EgressAddrs: addrs}
	bad := addrs[1]
	skip := func(a netip.Addr) bool { return a == bad }
	v4 := rotation.IPv4

	for range 200 {
		if a, ok := g.egressFor(p, options{}, v4, skip); !ok || a == bad || !a.Is4() {
			t.Fatalf("at random: %s %v, want an IPv4 address but %s", a, ok, bad)
		}
	}
	var moved, kept string
	for i := 0; moved == "" || kept == ""; i++ {
		key := fmt.Sprintf("s%d", i)
		if rotation.SessionEgress(p, key, v4) == bad {
			moved = key
		} else {
			kept = key
		}
	}
	if a, ok := g.egressFor(p, options{session: kept}, v4, skip); !ok || a != rotation.SessionEgress(p, kept, v4) {
		t.Errorf("session %s whose address is not refused: %s, want its own %s", kept, a, rotation.SessionEgress(p, kept, v4))
	}
	a, ok := g.egressFor(p, options{session: moved}, v4, skip)
	if !ok || a == bad || !a.Is4() {
		t.Errorf("session %s whose address is refused: %s %v", moved, a, ok)
	}
	if again, _ := g.egressFor(p, options{session: moved}, v4, skip); again != a {
		t.Errorf("session %s moved to %s, then %s: want the same", moved, a, again)
	}
	seen := map[netip.Addr]bool{}
	for range 6 {
		a, ok := g.egressFor(p, options{rotate: true, session: "r"}, v4, skip)
		if !ok || a == bad {
			t.Fatalf("egress-rotate: %s %v", a, ok)
		}
		seen[a] = true
	}
	if len(seen) != 3 {
		t.Errorf("egress-rotate went round %v, want the 3 IPv4 addresses but %s", seen, bad)
	}
	if a, ok := g.egressFor(p, options{}, rotation.IPv6, skip); !ok || a != addrs[4] {
		t.Errorf("IPv6 target: %s %v, want %s", a, ok, addrs[4])
	}
	all := func(a netip.Addr) bool { return a.Is4() }
	for _, o := range []options{{}, {session: "s"}, {rotate: true}} {
		if a, ok := g.egressFor(p, o, v4, all); ok {
			t.Errorf("%+v: every IPv4 address refused, got %s", o, a)
		}
	}
	own := Proxy{ID: "p2", Egress: "203.0.113.9"}
	if _, ok := g.egressFor(own, options{}, v4, func(a netip.Addr) bool { return a == netip.MustParseAddr("203.0.113.9") }); ok {
		t.Error("a proxy without a plan whose own egress is refused: ok")
	}
	if a, ok := g.egressFor(own, options{}, v4, skip); !ok || a.IsValid() {
		t.Errorf("a proxy without a plan: %s %v, want none, ok", a, ok)
	}
	if a, ok := g.egressFor(p, options{}, v4, nil); !ok || !a.Is4() {
		t.Errorf("nothing refused: %s %v", a, ok)
	}
}

// A pick passes over a proxy whose every address is banned for the
// request's site, for that site only; none left is a refusal by ban.
func TestPickSkipsBannedProxies(t *testing.T) {
	a1 := netip.MustParseAddr("198.18.8.1")
	p1 := Proxy{ID: "p1", Addr: "127.0.0.1:1", EgressAddrs: []netip.Addr{a1}}
	p2 := Proxy{ID: "p2", Addr: "127.0.0.1:2", Egress: "198.18.8.2"}
	g := &Gateway{picker: newPicker(p1, p2), bans: newLocalBans(time.Now), families: rotation.NewFamilyCache(fakeLookup(nil), nil)}
	g.bans.HoldBan(a1, "shop.example", time.Hour)
	for range 4 {
		at, err := g.pick(t.Context(), options{}, g.scopeOf("www.shop.example"))
		if err != nil || at.p.ID != "p2" || at.addr != netip.MustParseAddr("198.18.8.2") {
			t.Fatalf("shop.example: %+v %v, want p2 from its own egress", at, err)
		}
	}
	ids := map[string]bool{}
	for range 4 {
		at, err := g.pick(t.Context(), options{}, g.scopeOf("other.example"))
		if err != nil {
			t.Fatal(err)
		}
		ids[at.p.ID] = true
	}
	if len(ids) != 2 {
		t.Errorf("other.example went to %v, want both", ids)
	}
	g.bans.HoldBan(netip.MustParseAddr("198.18.8.2"), "shop.example", time.Hour)
	sc := g.scopeOf("shop.example")
	if at, err := g.pick(t.Context(), options{session: "s1"}, sc); err == nil || !sc.skippedBan {
		t.Errorf("every address banned: %+v %v, skipped by ban %v", at, err, sc.skippedBan)
	}
}

// siteProxy is a proxy that answers plain requests itself, recording
// the egress and host of each, and refuses (status, body) those for
// refuseSite from refuseFrom.
type siteProxy struct {
	srv        *httptest.Server
	refuseFrom string // an egress address
	refuseSite string
	status     int
	body       string
	mu         sync.Mutex
	seen       []seenReq
}

type seenReq struct{ egress, host, body string }

func newSiteProxy(t *testing.T, refuseFrom, refuseSite string, status int, body string) *siteProxy {
	sp := &siteProxy{refuseFrom: refuseFrom, refuseSite: refuseSite, status: status, body: body}
	sp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		eg := r.Header.Get(HeaderEgress)
		site, _ := bans.Site(r.URL.Hostname())
		sp.mu.Lock()
		sp.seen = append(sp.seen, seenReq{eg, r.URL.Hostname(), string(b)})
		sp.mu.Unlock()
		if eg == sp.refuseFrom && site == sp.refuseSite {
			w.WriteHeader(sp.status)
			_, _ = io.WriteString(w, sp.body)
			return
		}
		w.Header().Set("X-Body", string(b))
		_, _ = io.WriteString(w, "ok from "+eg+" "+strings.Repeat("x", 40<<10))
	}))
	t.Cleanup(sp.srv.Close)
	return sp
}

func (sp *siteProxy) requests() []seenReq {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return slices.Clone(sp.seen)
}

// banDo sends method u (with body) through g as user, with a head that
// fits the client's reader or (large) one that does not, and returns
// the status, egress and body.
func banDo(t *testing.T, g *testGateway, user, method, u, body string, large bool, hdr map[string]string) (int, string, string) {
	t.Helper()
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	host := strings.TrimPrefix(u, "http://")
	host, _, _ = strings.Cut(host, "/")
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\nConnection: close\r\n", method, u, host, basic(user, alicePass))
	if large {
		b.WriteString(largePad) // a head over the client's reader
	}
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get(HeaderEgress), string(rb)
}

func mustRules(t *testing.T, specs ...bans.RuleSpec) *bans.Rules {
	t.Helper()
	rs, err := bans.Compile(specs)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A proxy's address that answers 403 for one site is banned for that
// site by a rule, and the request goes again from another address: the
// client gets 200, and the site's later requests never leave from that
// address; another site keeps every address. On both HTTP paths, with a
// body the gateway holds sent again.
func TestRuleBansAndRetries(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			large := path == "large head"
			addrs := []netip.Addr{netip.MustParseAddr("198.18.9.1"), netip.MustParseAddr("198.18.9.2"), netip.MustParseAddr("198.18.9.3"), netip.MustParseAddr("198.18.9.4")}
			bad := addrs[1].String()
			sp := newSiteProxy(t, bad, "shop.example", http.StatusForbidden, "go away")
			pk := newPicker(Proxy{ID: "p1", Addr: sp.srv.Listener.Addr().String(), EgressAddrs: addrs[:2]},
				Proxy{ID: "p2", Addr: sp.srv.Listener.Addr().String(), EgressAddrs: addrs[2:]})
			g := startGateway(t, pk, func(c *Config) {
				c.Rules = mustRules(t, bans.RuleSpec{Status: []int{403}, Ban: 30 * time.Minute, Retry: true})
			})
			// Until the bad address was tried for the site: every answer 200.
			refused := func() bool {
				return slices.ContainsFunc(sp.requests(), func(r seenReq) bool { return r.egress == bad && r.host == "www.shop.example" })
			}
			for i := 0; !refused(); i++ {
				if i == 200 {
					t.Fatal("200 requests, none left from the bad address")
				}
				st, eg, body := banDo(t, g, "alice", http.MethodPost, "http://www.shop.example/p", "hello body", large, nil)
				if st != 200 || eg == bad || !strings.HasPrefix(body, "ok from "+eg) {
					t.Fatalf("answer %d from %s %.20q, want 200 from another address than %s", st, eg, body, bad)
				}
			}
			n := len(sp.requests())
			last := sp.requests()[n-1]
			if last.egress == bad || last.body != "hello body" {
				t.Errorf("the retry: %+v, want the body again from another address", last)
			}
			for range 20 {
				if st, eg, _ := banDo(t, g, "alice", http.MethodGet, "http://shop.example/", "", large, nil); st != 200 || eg == bad {
					t.Fatalf("after the ban: %d from %s", st, eg)
				}
			}
			for _, r := range sp.requests()[n:] {
				if r.egress == bad {
					t.Fatalf("a request for the banned site left from %s after the ban: %+v", bad, r)
				}
			}
			// Another site: every address, the bad one included.
			used := map[string]bool{}
			for i := 0; len(used) < len(addrs); i++ {
				if i == 200 {
					t.Fatalf("200 requests for other.example used %v", used)
				}
				st, eg, _ := banDo(t, g, "alice", http.MethodGet, "http://other.example/", "", large, nil)
				if st != 200 {
					t.Fatalf("other.example: %d", st)
				}
				used[eg] = true
			}
			if got := testutil.ToFloat64(g.m.bans.WithLabelValues("0", bans.SourceRule)); got != 1 {
				t.Errorf("bans by rule 0: %v, want 1", got)
			}
			if got := testutil.ToFloat64(g.m.failovers.WithLabelValues(causeRule)); got != 1 {
				t.Errorf("retries by rule: %v, want 1", got)
			}
			if r := pk.gotReports(); len(r) != 0 {
				t.Errorf("reports %v: a refusal by rule is no proxy's failure", r)
			}
		})
	}
}

// retry: true sends the request again at most Retries times; the client
// gets the last answer when every address refused it. A request whose
// body the gateway does not hold is not sent again.
func TestRuleRetryBounds(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			large := path == "large head"
			var addrs []netip.Addr
			for i := 1; i <= 6; i++ {
				addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("198.18.10.%d", i)))
			}
			sp := newSiteProxy(t, "", "", 0, "")
			sp.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				sp.mu.Lock()
				sp.seen = append(sp.seen, seenReq{egress: r.Header.Get(HeaderEgress), host: r.URL.Hostname()})
				n := len(sp.seen)
				sp.mu.Unlock()
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "busy %d", n)
			})
			pk := newPicker(Proxy{ID: "p1", Addr: sp.srv.Listener.Addr().String(), EgressAddrs: addrs})
			g := startGateway(t, pk, func(c *Config) {
				c.Retries = 2
				c.RetryBodyBytes = 16
				c.Rules = mustRules(t, bans.RuleSpec{Status: []int{503}, Retry: true})
			})
			st, _, body := banDo(t, g, "alice", http.MethodGet, "http://a.example/", "", large, nil)
			if st != 503 || body != "busy 3" || len(sp.requests()) != 3 {
				t.Fatalf("%d %q after %d requests, want the third 503", st, body, len(sp.requests()))
			}
			eg := map[string]bool{}
			for _, r := range sp.requests() {
				eg[r.egress] = true
			}
			if len(eg) != 3 {
				t.Errorf("the retries left from %v, want 3 addresses", eg)
			}
			st, _, body = banDo(t, g, "alice", http.MethodPost, "http://a.example/", strings.Repeat("b", 17), large, nil)
			if st != 503 || body != "busy 4" {
				t.Errorf("a body over retry_body_bytes: %d %q, want the first answer", st, body)
			}
		})
	}
}

// A body rule reads the answer's body for the sites it names: a match
// bans and retries, and an answer that does not match reaches the client
// whole (longer than body_peek).
func TestBodyRule(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			large := path == "large head"
			addrs := []netip.Addr{netip.MustParseAddr("198.18.11.1"), netip.MustParseAddr("198.18.11.2")}
			sp := newSiteProxy(t, addrs[0].String(), "shop.example", http.StatusOK, "<html>please solve this CAPTCHA</html>")
			pk := newPicker(Proxy{ID: "p1", Addr: sp.srv.Listener.Addr().String(), EgressAddrs: addrs})
			g := startGateway(t, pk, func(c *Config) {
				c.BodyPeek = 1024
				c.Rules = mustRules(t, bans.RuleSpec{Sites: []string{"*.shop.example"}, Body: "(?i)captcha", Ban: time.Hour, Retry: true})
			})
			for range 10 {
				st, eg, body := banDo(t, g, "alice", http.MethodGet, "http://www.shop.example/", "", large, nil)
				if st != 200 || eg != addrs[1].String() || len(body) != len("ok from "+eg+" ")+40<<10 {
					t.Fatalf("%d from %s, %d bytes %.30q: want the whole answer from %s", st, eg, len(body), body, addrs[1])
				}
			}
			if got := testutil.ToFloat64(g.m.bans.WithLabelValues("0", bans.SourceRule)); got > 1 {
				t.Errorf("bans %v, want at most 1", got)
			}
		})
	}
}

// X-Proxyfleet-Ban on a session's request bans, for the request's site,
// the address the session left from, and the request goes from another;
// on a CONNECT (an HTTPS session, whose answer named the address) and a
// plain request, on both paths. The header never reaches a proxy or a
// target; a bad value, a request without a session or with
// egress-rotate is refused 400 naming it, and bans nothing.
func TestHeaderBan(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			large := path == "large head"
			up := newUpstream(t, "p1", "")
			var addrs []netip.Addr
			for i := 1; i <= 4; i++ {
				addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("198.18.12.%d", i)))
			}
			p := Proxy{ID: "p1", Addr: up.addr(), EgressAddrs: addrs}
			g := startGateway(t, newPicker(p), nil)
			tg := newTarget(t, false)
			const site = "127.0.0.1" // the target's
			connect := func(user string, hdr map[string]string) (*http.Response, string) {
				t.Helper()
				all := map[string]string{}
				if large {
					all["X-Pad"] = largePad[len("X-Pad: ") : len(largePad)-2] // a head over the client's reader
				}
				for k, v := range hdr {
					all[k] = v
				}
				resp, conn, _ := g.connect(t, tg.srv.Listener.Addr().String(), basic(user, alicePass), all)
				defer conn.Close()
				var body []byte
				if resp.StatusCode != http.StatusOK {
					_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
					body, _ = io.ReadAll(resp.Body)
				}
				return resp, string(body)
			}
			user := "alice-session-s1"
			resp, _ := connect(user, nil)
			a := resp.Header.Get(HeaderEgress)
			if resp.StatusCode != 200 || a != rotation.SessionEgress(p, "s1", rotation.IPv4).String() {
				t.Fatalf("CONNECT: %s from %q, want 200 from the session's address", resp.Status, a)
			}
			resp, _ = connect(user, map[string]string{HeaderBan: "30m"})
			b := resp.Header.Get(HeaderEgress)
			if resp.StatusCode != 200 || b == a || b == "" {
				t.Fatalf("CONNECT with %s: %s from %q, want 200 from another address than %s", HeaderBan, resp.Status, b, a)
			}
			if !g.bans.Banned(netip.MustParseAddr(a), site) {
				t.Fatalf("%s is not banned for %s", a, site)
			}
			if resp, _ = connect(user, nil); resp.Header.Get(HeaderEgress) != b {
				t.Errorf("the session's next CONNECT left from %s, want %s", resp.Header.Get(HeaderEgress), b)
			}
			if st, eg, _ := banDo(t, g, user, http.MethodGet, tg.srv.URL+"/", "", large, nil); st != 200 || eg != b {
				t.Errorf("a plain request of the session: %d from %s, want 200 from %s", st, eg, b)
			}
			st, c, _ := banDo(t, g, user, http.MethodGet, tg.srv.URL+"/", "", large, map[string]string{HeaderBan: "1h"})
			if st != 200 || c == a || c == b {
				t.Errorf("a plain request with %s: %d from %s, want 200 from neither %s nor %s", HeaderBan, st, c, a, b)
			}
			if !g.bans.Banned(netip.MustParseAddr(b), site) || g.bans.Banned(netip.MustParseAddr(b), "other.example") {
				t.Errorf("%s: want it banned for %s only", b, site)
			}
			up.mu.Lock()
			heads := slices.Clone(up.headers)
			up.mu.Unlock()
			for i, h := range append(heads, tg.seen()...) {
				if v := h.Get(HeaderBan); v != "" {
					t.Errorf("request %d reached a proxy or the target with %s: %q", i, HeaderBan, v)
				}
			}
			for _, c := range []struct{ user, value string }{
				{user, "5x"}, {user, "0s"}, {user, "721h"}, {user, "-1m"},
				{"alice", "30m"}, {"alice-session-s2-egress-rotate", "30m"},
			} {
				resp, body := connect(c.user, map[string]string{HeaderBan: c.value})
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, HeaderBan) {
					t.Errorf("%s with %s: %q: %s %q, want 400 naming the header", c.user, HeaderBan, c.value, resp.Status, body)
				}
			}
			if st, _, body := banDo(t, g, user, http.MethodGet, tg.srv.URL+"/", "", large, map[string]string{HeaderBan: "soon"}); st != http.StatusBadRequest || !strings.Contains(body, HeaderBan) {
				t.Errorf("a plain request with %s: soon: %d %q, want 400 naming the header", HeaderBan, st, body)
			}
			if got := testutil.ToFloat64(g.m.bans.WithLabelValues("none", bans.SourceHeader)); got != 2 {
				t.Errorf("bans by header: %v, want 2", got)
			}
		})
	}
}
