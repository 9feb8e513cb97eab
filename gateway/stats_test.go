package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"
	"time"

	"proxyfleet/bans"
)

// The stats count each site's requests, answers by class, bans and
// retries over the last StatsWindow (whole minutes, by the clock they
// are given), and list the busiest first, at most n; a request without
// a site is not counted.
func TestSiteStatsCounts(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 30, 0, time.UTC)
	s := newSiteStats(func() time.Time { return now })
	for range 3 {
		s.request("a.example", class2xx, 0)
	}
	s.request("a.example", class4xx, 1)
	s.request("a.example", classFailed, 2)
	s.ban("a.example")
	s.request("b.example", class5xx, 0)
	s.request("c.example", class3xx, 0)
	s.request("c.example", class3xx, 0)
	s.request("", class2xx, 0)
	s.ban("")

	got := s.snapshot(StatsTop)
	want := []SiteStats{
		{Site: "a.example", Requests: 5, Answers: Answers{C2xx: 3, C4xx: 1, Failed: 1}, Bans: 1, Retries: 3},
		{Site: "c.example", Requests: 2, Answers: Answers{C3xx: 2}},
		{Site: "b.example", Requests: 1, Answers: Answers{C5xx: 1}},
	}
	if !slices.Equal(got.Sites, want) || got.Tracked != 3 || got.Window != "10m0s" || !got.At.Equal(now) {
		t.Fatalf("stats:\n%+v\nwant sites\n%+v", got, want)
	}
	if got := s.snapshot(2).Sites; len(got) != 2 || got[1].Site != "c.example" {
		t.Errorf("top 2: %+v", got)
	}

	// Nine minutes on, all of it still counts; at ten, the first
	// minute's counts are out of the window.
	now = now.Add(9 * time.Minute)
	s.request("a.example", class2xx, 0)
	if got := s.snapshot(StatsTop).Sites; len(got) != 3 || got[0].Requests != 6 {
		t.Fatalf("nine minutes on: %+v, want a.example's 6 and the others", got)
	}
	now = now.Add(time.Minute)
	got = s.snapshot(StatsTop)
	if len(got.Sites) != 1 || got.Sites[0] != (SiteStats{Site: "a.example", Requests: 1, Answers: Answers{C2xx: 1}}) {
		t.Fatalf("ten minutes on: %+v, want a.example's last request only", got.Sites)
	}
	// A slot counting a new minute starts from nothing.
	now = now.Add(9 * time.Minute)
	s.request("a.example", class5xx, 0)
	if got := s.snapshot(StatsTop).Sites; len(got) != 1 || got[0] != (SiteStats{Site: "a.example", Requests: 1, Answers: Answers{C5xx: 1}}) {
		t.Fatalf("nineteen minutes on: %+v, want the new request only", got)
	}
}

// At most statsMaxSites sites are counted: a flood of new sites drops the
// least busy, never the busiest, and the top list stays right.
func TestSiteStatsBounded(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	s := newSiteStats(func() time.Time { return now })
	// Sites s0..s149, site i with 150-i requests: the top 100 are s0..s99.
	for i := range 150 {
		for range 150 - i {
			s.request(fmt.Sprintf("s%d.example", i), class2xx, 0)
		}
	}
	for i := range 3 * statsMaxSites {
		s.request(fmt.Sprintf("new%d.example", i), class2xx, 0)
		if n := len(s.sites); n > statsMaxSites {
			t.Fatalf("%d sites counted, want at most %d", n, statsMaxSites)
		}
	}
	got := s.snapshot(StatsTop)
	if len(got.Sites) != StatsTop || got.Tracked > statsMaxSites {
		t.Fatalf("%d sites listed, %d tracked", len(got.Sites), got.Tracked)
	}
	for i, st := range got.Sites {
		if want := fmt.Sprintf("s%d.example", i); st.Site != want || st.Requests != uint64(150-i) {
			t.Fatalf("site %d: %s with %d requests, want %s with %d", i, st.Site, st.Requests, want, 150-i)
		}
	}
}

// A request's answer class: the status passed on (none: a tunnel opened),
// a target's answer to CONNECT, or failed.
func TestAnswerClass(t *testing.T) {
	at := func(status int) *attempt { return &attempt{status: status} }
	for _, c := range []struct {
		last *attempt
		err  error
		want int
	}{
		{at(0), nil, class2xx},
		{at(204), nil, class2xx},
		{at(302), nil, class3xx},
		{at(429), nil, class4xx},
		{at(503), nil, class5xx},
		{at(0), fmt.Errorf("dial: %w", &targetAnswer{status: 502}), class5xx},
		{at(0), &allFailed{}, classFailed},
		{at(200), &bannedError{site: "a.example"}, classFailed},
		{nil, &emptyError{}, classFailed},
	} {
		if got := answerClass(c.last, c.err); got != c.want {
			t.Errorf("answerClass(%+v, %v) = %d, want %d", c.last, c.err, got, c.want)
		}
	}
}

// /stats, with a small and a large head and for a tunnel: a rule's 403 answer from
// one address is a ban and a retry of the site, the request a 2xx; a
// 404 passed on is a 4xx; the sites apart, the busiest first.
func TestStatsHandler(t *testing.T) {
	for _, path := range []string{"small head", "large head"} {
		t.Run(path, func(t *testing.T) {
			large := path == "large head"
			addrs := []netip.Addr{netip.MustParseAddr("198.18.13.1"), netip.MustParseAddr("198.18.13.2")}
			bad := addrs[0].String()
			sp := newSiteProxy(t, bad, "shop.example", http.StatusForbidden, "go away")
			base := sp.srv.Config.Handler
			sp.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Hostname() == "gone.example" {
					http.NotFound(w, r)
					return
				}
				base.ServeHTTP(w, r)
			})
			pk := newPicker(Proxy{ID: "p1", Addr: sp.srv.Listener.Addr().String(), EgressAddrs: addrs})
			g := startGateway(t, pk, func(c *Config) {
				c.Rules = mustRules(t, bans.RuleSpec{Status: []int{403}, Ban: 30 * time.Minute, Retry: true})
			})
			n := 0
			for !g.bans.Banned(addrs[0], "shop.example") {
				if n == 200 {
					t.Fatal("200 requests, none left from the bad address")
				}
				if st, _, _ := banDo(t, g, "alice", http.MethodGet, "http://www.shop.example/", "", large, nil); st != 200 {
					t.Fatalf("answer %d, want 200", st)
				}
				n++
			}
			for range 5 { // after the ban: no retry
				if st, _, _ := banDo(t, g, "alice", http.MethodGet, "http://shop.example/", "", large, nil); st != 200 {
					t.Fatalf("answer %d, want 200", st)
				}
				n++
			}
			if st, _, _ := banDo(t, g, "alice", http.MethodGet, "http://other.example/x", "", large, nil); st != 200 {
				t.Fatalf("other.example: %d", st)
			}
			for range 2 {
				if st, _, _ := banDo(t, g, "alice", http.MethodGet, "http://gone.example/", "", large, nil); st != 404 {
					t.Fatalf("gone.example: %d, want the proxy's 404", st)
				}
			}
			if st, _, _ := banDo(t, g, "alice", http.MethodGet, "http://other.example/y", "", large, map[string]string{HeaderBan: "bad"}); st != 400 {
				t.Fatalf("a bad %s: %d, want 400", HeaderBan, st)
			}

			rec := httptest.NewRecorder()
			g.StatsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/stats", nil))
			var got Stats
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("GET /stats: %d %q %q: %v", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), err)
			}
			want := []SiteStats{
				{Site: "shop.example", Requests: uint64(n), Answers: Answers{C2xx: uint64(n)}, Bans: 1, Retries: 1},
				{Site: "gone.example", Requests: 2, Answers: Answers{C4xx: 2}},
				{Site: "other.example", Requests: 1, Answers: Answers{C2xx: 1}},
			}
			if !slices.Equal(got.Sites, want) {
				t.Errorf("/stats sites:\n%+v\nwant\n%+v", got.Sites, want)
			}
		})
	}
}

// A tunnel opened counts as a 2xx of its site, one that no proxy could
// carry as failed.
func TestStatsTunnels(t *testing.T) {
	up := newUpstream(t, "p1", "")
	tg := newTarget(t, false)
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	resp, _, _ := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	dead := startGateway(t, newPicker(Proxy{ID: "p1", Addr: refusingAddr(t)}), nil)
	resp, _, _ = dead.connect(t, "198.18.13.9:443", basic("alice", alicePass), nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("CONNECT through a refusing proxy: %s, want 502", resp.Status)
	}
	if got := g.Stats().Sites; len(got) != 1 || got[0] != (SiteStats{Site: "127.0.0.1", Requests: 1, Answers: Answers{C2xx: 1}}) {
		t.Errorf("stats of a tunnel: %+v", got)
	}
	if got := dead.Stats().Sites; len(got) != 1 || got[0] != (SiteStats{Site: "198.18.13.9", Requests: 1, Answers: Answers{Failed: 1}}) {
		t.Errorf("stats of a failed tunnel: %+v", got)
	}
}
