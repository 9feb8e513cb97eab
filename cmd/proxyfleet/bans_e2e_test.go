package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/config"
	"proxyfleet/gateway"
	"proxyfleet/messages"
)

// The sites of the bans test: names that only the host network's DNS
// (libvirt's dnsmasq) knows, each its own registrable domain, all
// resolving to the root namespace's IPv6 address alone.
const (
	banSiteA = "bans-a.test" // answers 403 to an address after its fifth request, once armed
	banSiteB = "bans-b.test" // never refuses
	banSiteC = "bans-c.test" // a ban by the CLI
	banSiteD = "bans-d.test" // the TLS target of the header ban
	banSiteE = "bans-e.test" // the pool's burn, with F
	banSiteF = "bans-f.test"
)

// banHit is a request as the bans test's target received it.
type banHit struct {
	at     time.Time
	site   string
	src    string // the source address, netip's text form
	status int
}

// siteTarget is a target in the root namespace that records every
// request's site (its Host) and source, and, once armed, answers 403 to
// a source after its fifth request for banSiteA.
type siteTarget struct {
	token string
	mu    sync.Mutex
	armed bool
	count map[string]int
	hits  []banHit
}

func (b *siteTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	site, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		site = r.Host
	}
	h, _, _ := net.SplitHostPort(r.RemoteAddr)
	src := h
	if a, err := netip.ParseAddr(h); err == nil {
		src = a.Unmap().String()
	}
	status := http.StatusOK
	b.mu.Lock()
	if b.armed && site == banSiteA {
		b.count[src]++
		if b.count[src] > 5 {
			status = http.StatusForbidden
		}
	}
	b.hits = append(b.hits, banHit{at: time.Now(), site: site, src: src, status: status})
	b.mu.Unlock()
	w.WriteHeader(status)
	io.WriteString(w, b.token)
}

// arm starts the 403s for banSiteA, every source's count at zero.
func (b *siteTarget) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed, b.count = true, map[string]int{}
}

func (b *siteTarget) since(n int) []banHit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]banHit(nil), b.hits[n:]...)
}

func (b *siteTarget) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.hits)
}

// banAnswer is what a client of the gateway saw of one request and the
// target of it.
type banAnswer struct {
	status int
	named  string // X-Proxyfleet-Egress of the answer
	seen   []banHit
	end    time.Time
}

// TestGatewayBansOverRealGuests runs a pool of two real Debian guests,
// each with seventeen egress addresses, behind two gateways, gw1 with the
// rule {status: [403], ban: 30m, retry: true} and gw2 with no rule, in
// front of a target that refuses an address after its fifth request for
// site A. The names resolve to the target's IPv6 address only, for the
// guests (the network's DNS) and for the gateways (an /etc/hosts of
// their own): the gateways name an IPv6 address for every request.
func TestGatewayBansOverRealGuests(t *testing.T) {
	root6 := os.Getenv("TESTHOST_ROOT_IP6")
	if root6 == "" {
		t.Fatal("TESTHOST_ROOT_IP6 is not set: run make testhost")
	}
	gw1, gw2 := freePort(t), freePort(t)
	pwFile := filepath.Join(t.TempDir(), "alice-password")
	const pw = "alice-gateway-secret"
	writeFile(t, pwFile, pw+"\n")
	e, rot := realGuestRig(t, "th-bans", func(c *config.Config) {
		c.Hosts[0].Addresses = egressPlan(t, 3)
		c.Pools = config.Pools{Interval: 500 * time.Millisecond, LeaseTTL: 3 * time.Second, BackoffInitial: 2 * time.Second, BackoffMax: 10 * time.Second}
		c.Gateway = config.Gateway{Listen: gw1, Users: []config.GatewayUser{{Name: "alice", PasswordFile: pwFile}},
			ConnectTimeout: 5 * time.Second, ResponseTimeout: 10 * time.Second, Retries: new(10),
			Rules: []bans.RuleSpec{{Status: []int{http.StatusForbidden}, Ban: 30 * time.Minute, Retry: true}}}
	})
	e.cleanupProxiesLike("bans-")
	// gw2: the same fleet, no rule of its own, so what keeps it off an
	// address is the bans it follows.
	c2 := *e.cfg
	c2.Gateway.Listen, c2.Gateway.Rules = gw2, nil
	b, err := yaml.Marshal(&c2)
	if err != nil {
		t.Fatal(err)
	}
	path2 := filepath.Join(e.dir, "config-gw2.yaml")
	writeFile(t, path2, string(b))

	// The targets: plain HTTP and TLS, on the root namespace's IPv6
	// address, by names the network's DNS gives only that address.
	tgt := &siteTarget{token: fmt.Sprintf("bans-%d", time.Now().UnixNano()), count: map[string]int{}}
	ln, err := net.Listen("tcp", net.JoinHostPort(root6, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: tgt}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	siteURL := func(site string) string { return "http://" + site + ":" + port + "/" }
	tlsLn, err := net.Listen("tcp", net.JoinHostPort(root6, "0"))
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv := httptest.NewUnstartedServer(tgt)
	tlsSrv.Listener = tlsLn
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	tlsURL := "https://" + banSiteD + ":" + fmt.Sprint(tlsLn.Addr().(*net.TCPAddr).Port) + "/"
	sites := []string{banSiteA, banSiteB, banSiteC, banSiteD, banSiteE, banSiteF}
	addDNSHost(t, e.cfg.Hosts[0].Network, root6, sites...)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cli := func(args ...string) (string, string, int) {
		return runCLI(ctx, append(args, "--server", e.srv.ClientURL())...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		o, errOut, code := cli(args...)
		wantCLI(t, strings.Join(args, " "), code == 0, o, errOut)
		return o
	}
	banAdd := func(addr, site string, d time.Duration) bans.Ban {
		t.Helper()
		var b bans.Ban
		o := mustCLI("ban", "add", addr, site, "--for", d.String(), "--json")
		if err := json.Unmarshal([]byte(o), &b); err != nil {
			t.Fatalf("ban add --json: %q: %v", o, err)
		}
		return b
	}
	banList := func() []bans.Ban {
		t.Helper()
		var bs []bans.Ban
		o := mustCLI("ban", "ls", "--json")
		if err := json.Unmarshal([]byte(o), &bs); err != nil {
			t.Fatalf("ban ls --json: %q: %v", o, err)
		}
		return bs
	}

	// A pool of two, not recycling for bans yet.
	e.start("pools", nil, "pools", "--config", e.path, "--http", freePort(t))
	began := time.Now()
	if o, errOut, code := cli("pool", "set", "bans", "--size", "2", "--image", "proxy-debian", "--memory-mib", "512", "--ready-timeout", "10m", "--wait"); code != 0 {
		// Why the pool did not fill, as the pool says.
		get, _, _ := cli("pool", "get", "bans")
		t.Fatalf("pool set bans --size 2 --wait: exit %d\n%s\n%s\npool get bans:\n%s", code, o, errOut, get)
	}
	cl, err := client.New(e.nc, "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := cl.Pool(ctx, "bans")
	if err != nil || len(st.Record.Members) != 2 {
		t.Fatalf("pool bans: %+v %v", st.Record, err)
	}
	t.Logf("a pool of 2 Debian guests in the rotation after %s", time.Since(began).Round(time.Second))
	members := map[string][]netip.Addr{} // id -> its egress addresses
	var all, all6 []netip.Addr
	for _, m := range st.Record.Members {
		as, err := messages.ExpandEgress(e.lastEvent(m.ID).Egress)
		if err != nil || len(as) != 17 || !as[0].Is4() {
			t.Fatalf("member %s's egress %v (%v), want an IPv4 address and 16 IPv6 ones", m.ID, e.lastEvent(m.ID).Egress, err)
		}
		members[m.ID] = as
		all = append(all, as...)
		all6 = append(all6, as[1:]...)
	}
	hosts := filepath.Join(e.dir, "hosts")
	writeFile(t, hosts, "127.0.0.1 localhost\n::1 localhost\n"+root6+" "+strings.Join(sites, " ")+"\n")
	e.startResolving("gateway", hosts, "gateway", "--config", e.path, "--http", freePort(t), "--debug")
	e.startResolving("gateway2", hosts, "gateway", "--config", path2, "--http", freePort(t), "--debug")

	// get sends one request for u through gw as user, with extra
	// headers, and says what came back and what the target saw of it.
	get := func(gw, user, u string) banAnswer {
		t.Helper()
		n := tgt.len()
		resp, err := throughAs(gw, u, url.UserPassword(user, pw))
		if err != nil {
			t.Fatalf("through %s as %s to %s: %v", gw, user, u, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a := banAnswer{status: resp.StatusCode, named: resp.Header.Get(messages.HeaderEgress), seen: tgt.since(n), end: time.Now()}
		if len(a.seen) > 0 && string(body) != tgt.token {
			t.Fatalf("through %s to %s: %d %q, not the target's answer", gw, u, resp.StatusCode, body)
		}
		return a
	}
	// last is the source of the request that made the answer (the last
	// the target saw); "" when it saw none.
	last := func(a banAnswer) string {
		if len(a.seen) == 0 {
			return ""
		}
		return a.seen[len(a.seen)-1].src
	}
	// usesBoth waits until gw carries requests over both members: they
	// are in its rotation (health may take one out for a while on a busy
	// machine).
	usesBoth := func(t *testing.T, gw string) {
		t.Helper()
		waitUntil(t, "the gateway at "+gw+" to use both members", 2*time.Minute, func() bool {
			used := map[string]bool{}
			for range 20 {
				resp, err := throughAs(gw, siteURL(banSiteB), url.UserPassword("alice", pw))
				if err != nil {
					return false
				}
				resp.Body.Close()
				used[resp.Header.Get("X-Proxyfleet-Proxy")] = resp.StatusCode == http.StatusOK
			}
			return len(used) == 2 && !used[""]
		})
	}
	usesBoth(t, gw1)
	usesBoth(t, gw2)

	t.Run("a ban of 5s expires", func(t *testing.T) {
		first := get(gw1, "alice-session-exp", siteURL(banSiteA))
		x := first.named
		if first.status != http.StatusOK || last(first) != x {
			t.Fatalf("session exp: %d from %q, named %q", first.status, last(first), x)
		}
		ban := banAdd(x, banSiteA, 5*time.Second)
		// The CLI's ban reaches gw1 through health and PROXY_BANS.
		var moved time.Time
		waitUntil(t, "gw1 to leave the session's address", 10*time.Second, func() bool {
			a := get(gw1, "alice-session-exp", siteURL(banSiteA))
			if a.named != x {
				moved = a.end
				return true
			}
			return false
		})
		t.Logf("gw1 honoured the CLI's ban %s after it was made", moved.Sub(ban.At).Round(time.Millisecond))
		var back banAnswer
		waitUntil(t, x+" to serve "+banSiteA+" again", 30*time.Second, func() bool {
			a := get(gw1, "alice-session-exp", siteURL(banSiteA))
			if a.status != http.StatusOK || last(a) != a.named {
				t.Fatalf("session exp: %d from %q, named %q", a.status, last(a), a.named)
			}
			if a.named == x && a.end.Before(ban.Until) {
				t.Fatalf("a request left from %s at %s, before its ban's end %s", x, a.end.Format(time.StampMilli), ban.Until.Format(time.StampMilli))
			}
			back = a
			return a.named == x
		})
		t.Logf("%s served %s again %s after its ban's end", x, banSiteA, back.end.Sub(ban.Until).Round(time.Millisecond))
	})

	t.Run("rules ban and retry", func(t *testing.T) {
		tgt.arm()
		n := tgt.len()
		for i := range 100 {
			// Ten sessions in turn: each keeps its address until the
			// target refuses it, so bans come for certain.
			a := get(gw1, fmt.Sprintf("alice-session-a%d", i%10), siteURL(banSiteA))
			if a.status != http.StatusOK {
				t.Errorf("request %d to %s: %d (named %s); %d addresses refused so far", i, banSiteA, a.status, a.named, len(refused(tgt.since(n))))
			}
			if last(a) != a.named {
				t.Fatalf("request %d: the target saw %q, the answer names %q", i, last(a), a.named)
			}
		}
		hits := tgt.since(n)
		ref := refused(hits)
		if len(ref) == 0 {
			t.Fatal("the target refused no address: the test proved nothing")
		}
		for src, at := range ref {
			for _, h := range hits {
				if h.site == banSiteA && h.src == src && h.at.After(at) {
					t.Errorf("a request for %s left from %s at %s, banned at %s", banSiteA, src, h.at.Format(time.StampMilli), at.Format(time.StampMilli))
				}
			}
		}
		for _, h := range hits {
			if a, _ := netip.ParseAddr(h.src); !slices.Contains(all6, a) {
				t.Errorf("a request left from %s, not an IPv6 address of the pool", h.src)
			}
		}
		waitUntil(t, "the rules' bans listed", 10*time.Second, func() bool {
			got := 0
			for _, b := range banList() {
				if b.Site == banSiteA && b.Source == bans.SourceRule && ref[b.Address] != (time.Time{}) {
					got++
				}
			}
			return got == len(ref)
		})
		t.Logf("100 requests to %s: %d addresses refused and banned, %d requests in all reached the target", banSiteA, len(ref), len(hits))

		// Site B: every IPv6 address of both members (the family the
		// name resolves to), those banned for A among them.
		named := map[string]bool{}
		for i := 0; len(named) < len(all6) && i < 400; i++ {
			a := get(gw1, "alice-egress-rotate", siteURL(banSiteB))
			if a.status != http.StatusOK {
				t.Fatalf("request to %s: %d", banSiteB, a.status)
			}
			if last(a) != a.named {
				t.Fatalf("a request to %s named %s and left from %s", banSiteB, a.named, last(a))
			}
			named[a.named] = true
		}
		for _, a := range all6 {
			if !named[a.String()] {
				t.Errorf("no request to %s left from %s", banSiteB, a)
			}
		}
	})

	t.Run("a second gateway honours the bans", func(t *testing.T) {
		// Both gateways hash a session alike: gw2's address for session
		// g2 is gw1's, until gw1's rule bans it. (A 403 here, gw2 having
		// no rule, is passed on: the address had had its five.)
		before := get(gw2, "alice-session-g2", siteURL(banSiteA))
		x := before.named
		if (before.status != http.StatusOK && before.status != http.StatusForbidden) || last(before) != x {
			t.Fatalf("gw2, session g2: %d from %q, named %q", before.status, last(before), x)
		}
		var banned time.Time
		for i := 0; banned.IsZero(); i++ {
			if i == 10 {
				t.Fatalf("gw1's session g2 never got a 403 from %s", x)
			}
			a := get(gw1, "alice-session-g2", siteURL(banSiteA))
			if a.status != http.StatusOK {
				t.Fatalf("gw1, session g2: %d", a.status)
			}
			if a.named != x {
				if !slices.ContainsFunc(a.seen, func(h banHit) bool { return h.src == x && h.status == http.StatusForbidden }) {
					t.Fatalf("gw1's session g2 left %s without a 403 from it: %+v", x, a.seen)
				}
				banned = a.end
			}
		}
		stale := 0
		var moved time.Time
		waitUntil(t, "gw2 to leave "+x, 10*time.Second, func() bool {
			a := get(gw2, "alice-session-g2", siteURL(banSiteA))
			if a.named == x {
				stale++
				return false
			}
			// The address gw2 moves to (gw1's, both hashing the session
			// alike) may have had its five requests to A already: gw2,
			// with no rule, passes the 403 on.
			if (a.status != http.StatusOK && a.status != http.StatusForbidden) || last(a) != a.named {
				t.Fatalf("gw2, session g2: %d from %q, named %q", a.status, last(a), a.named)
			}
			moved = a.end
			return true
		})
		t.Logf("gw2 left %s, banned by gw1's rule, %s after gw1's answer (%d requests of gw2 still left from it)",
			x, moved.Sub(banned).Round(time.Millisecond), stale)
		// And it keeps off every address banned for A.
		bs := banList()
		n := tgt.len()
		for range 30 {
			get(gw2, "alice", siteURL(banSiteA))
		}
		for _, h := range tgt.since(n) {
			for _, b := range bs {
				if b.Site == banSiteA && b.Address == h.src {
					t.Errorf("gw2 sent a request for %s from %s, banned since %s", banSiteA, h.src, b.At.Format(time.StampMilli))
				}
			}
		}
	})

	t.Run("a ban by the CLI", func(t *testing.T) {
		first := get(gw1, "alice-session-c1", siteURL(banSiteC))
		x := first.named
		banAdd(x, banSiteC, 10*time.Minute)
		for _, gw := range []string{gw1, gw2} {
			waitUntil(t, gw+" to leave "+x, 10*time.Second, func() bool {
				return get(gw, "alice-session-c1", siteURL(banSiteC)).named != x
			})
			n := tgt.len()
			for i := range 30 {
				user := "alice"
				if i%2 == 0 {
					user = "alice-session-c1"
				}
				get(gw, user, siteURL(banSiteC))
			}
			for _, h := range tgt.since(n) {
				if h.src == x {
					t.Errorf("%s sent a request for %s from %s, banned by the CLI", gw, banSiteC, x)
				}
			}
		}
	})

	t.Run("a ban by X-Proxyfleet-Ban on a tunnel", func(t *testing.T) {
		usesBoth(t, gw1)
		roots := tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
		// tunnel GETs tlsURL through a CONNECT of gw as user, with the
		// ban header when ban is set, and returns the egress the
		// CONNECT's answer named and the source the target saw.
		tunnel := func(gw, user string, ban bool) (named, saw string) {
			t.Helper()
			hdr := http.Header{}
			if ban {
				hdr.Set(gateway.HeaderBan, "10m")
			}
			tr := &http.Transport{
				Proxy:              http.ProxyURL(&url.URL{Scheme: "http", Host: gw, User: url.UserPassword(user, pw)}),
				ProxyConnectHeader: hdr,
				OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, r *http.Response) error {
					named = r.Header.Get(messages.HeaderEgress)
					return nil
				},
				DisableKeepAlives: true,
				// httptest's certificate names example.com.
				TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "example.com"},
			}
			defer tr.CloseIdleConnections()
			n := tgt.len()
			resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get(tlsURL)
			if err != nil {
				t.Fatalf("through a tunnel of %s as %s: %v", gw, user, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			seen := tgt.since(n)
			if resp.StatusCode != http.StatusOK || string(body) != tgt.token || len(seen) != 1 {
				t.Fatalf("through a tunnel of %s: %s %q, the target saw %+v", gw, resp.Status, body, seen)
			}
			return named, seen[0].src
		}
		x, saw := tunnel(gw1, "alice-session-h1", false)
		if x == "" || saw != x {
			t.Fatalf("the tunnel's answer named %q, the target saw %s", x, saw)
		}
		y, saw := tunnel(gw1, "alice-session-h1", true)
		if y == x || saw != y {
			t.Fatalf("with %s the tunnel left from %s (named %q), want another than %s", gateway.HeaderBan, saw, y, x)
		}
		waitUntil(t, "the header's ban listed", 10*time.Second, func() bool {
			for _, b := range banList() {
				if b.Address == x && b.Site == banSiteD && b.Source == bans.SourceHeader {
					return true
				}
			}
			return false
		})
		for _, gw := range []string{gw1, gw2} {
			waitUntil(t, gw+" to leave "+x+" in session h1", 10*time.Second, func() bool {
				named, _ := tunnel(gw, "alice-session-h1", false)
				return named != x
			})
			for i := range 10 {
				user := "alice"
				if i%2 == 0 {
					user = "alice-session-h1"
				}
				if named, saw := tunnel(gw, user, false); named == x || saw == x {
					t.Errorf("%s tunnelled to %s from %s (named %s), banned by the header", gw, banSiteD, saw, named)
				}
			}
		}
	})

	t.Run("a pool recycles a member banned on two sites", func(t *testing.T) {
		for _, b := range banList() {
			mustCLI("ban", "rm", b.Address, b.Site)
		}
		waitUntil(t, "no ban left", 10*time.Second, func() bool { return len(banList()) == 0 })
		mustCLI("pool", "set", "bans", "--size", "2", "--image", "proxy-debian", "--memory-mib", "512", "--ready-timeout", "10m",
			"--recycle-after-bans", "2", "--wait")
		ids := make([]string, 0, len(members))
		for id := range members {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		burned, kept := ids[0], ids[1]
		banAdd(members[burned][3].String(), banSiteE, 10*time.Minute)
		banAdd(members[burned][9].String(), banSiteF, 10*time.Minute)
		began := time.Now()
		var fresh string
		var made, entered time.Duration // since the bans, when seen
		waitUntil(t, burned+" replaced and deleted", 10*time.Minute, func() bool {
			st, err := cl.Pool(ctx, "bans")
			if err != nil {
				return false
			}
			var live []string
			for _, m := range st.Record.Members {
				if m.Retired == nil {
					live = append(live, m.ID)
				}
			}
			doms, _ := e.hostObjects(burned)
			for _, id := range live {
				if id != kept && id != burned {
					fresh = id
				}
			}
			if fresh != "" && made == 0 {
				made = time.Since(began)
			}
			if fresh != "" && entered == 0 && rot.has(fresh) {
				entered = time.Since(began)
			}
			return fresh != "" && !slices.Contains(live, burned) && rot.has(fresh, kept) && rot.lacks(burned) && len(doms) == 0
		})
		t.Logf("%s, banned on 2 sites: replacement %s a member after %s, in the rotation after %s, %s deleted after %s",
			burned, fresh, made.Round(time.Second), entered.Round(time.Second), burned, time.Since(began).Round(time.Second))
		if st, err := cl.Pool(ctx, "bans"); err != nil || !slices.ContainsFunc(st.Record.Members, func(m messages.PoolMember) bool { return m.ID == kept && m.Retired == nil }) {
			t.Errorf("%s, banned nowhere, is no longer a member: %+v %v", kept, st.Record.Members, err)
		}
		as, err := messages.ExpandEgress(e.lastEvent(fresh).Egress)
		if err != nil || len(as) != 17 {
			t.Fatalf("%s's egress %v: %v", fresh, e.lastEvent(fresh).Egress, err)
		}
		for _, a := range as {
			if slices.Contains(all, a) {
				t.Errorf("the replacement %s got %s, an address of the first members", fresh, a)
			}
		}
		// Through the gateway, requests leave from the replacement's
		// addresses, never again from the burned member's.
		waitUntil(t, "a request to leave from "+fresh, time.Minute, func() bool {
			a := get(gw1, "alice-egress-rotate", siteURL(banSiteB))
			ad, _ := netip.ParseAddr(last(a))
			if slices.Contains(members[burned], ad) {
				t.Fatalf("a request left from %s, the burned member's", ad)
			}
			return slices.Contains(as, ad)
		})
	})
}

// refused is, by source, when the target first refused it for banSiteA.
func refused(hits []banHit) map[string]time.Time {
	out := map[string]time.Time{}
	for _, h := range hits {
		if h.site == banSiteA && h.status == http.StatusForbidden {
			if _, ok := out[h.src]; !ok {
				out[h.src] = h.at
			}
		}
	}
	return out
}
