package kvm

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// TestEgress_debianGuest: squid in the stock Debian guest, with a static
// IPv4 address and four IPv6 ones from the test host's free blocks,
// leaves from the IPv6 address each request names in
// messages.HeaderEgress, to a server on the root namespace's IPv6
// address, and removes the header; without it, or naming an address that
// is not the proxy's, or an IPv4 one for this IPv6 target, it leaves from
// its first IPv6 address. To a server on the root namespace's IPv4
// address it leaves from its IPv4 address whatever is asked for. The
// client keeps one connection to squid and
// the server keeps its connections alive, so squid's idle server
// connections are there to be reused: a request must still leave from the
// address it names (docs/ARCHITECTURE.md, "The proxy in the guest").
func TestEgress_debianGuest(t *testing.T) {
	env := testhostAll(t)
	for _, k := range []string{"TESTHOST_ROOT_IP", "TESTHOST_ROOT_IP6", "TESTHOST_EGRESS_IPV4_FREE", "TESTHOST_EGRESS_IPV6_FREE"} {
		if env[k] == "" {
			t.Fatalf("%s is not set\n%s", k, testhostHint)
		}
	}
	free4 := netip.MustParsePrefix(env["TESTHOST_EGRESS_IPV4_FREE"])
	free6 := netip.MustParsePrefix(env["TESTHOST_EGRESS_IPV6_FREE"])
	// .200 to .210 of the IPv4 block, and four consecutive addresses of
	// ::ff00/120 of the IPv6 one: no other test takes them.
	ip4 := netip.MustParseAddr(fmt.Sprintf("198.18.101.%d", 200+rand.IntN(11)))
	base6 := netip.MustParseAddr("2001:db8:101:0:8000::ff00").As16()
	base6[15] = byte(4 * rand.IntN(64))
	var ip6 []netip.Addr
	for a, i := netip.AddrFrom16(base6), 0; i < 4; a, i = a.Next(), i+1 {
		ip6 = append(ip6, a)
	}
	if !free4.Contains(ip4) || !free6.Contains(ip6[0]) || !free6.Contains(ip6[3]) {
		t.Fatalf("%s or %v outside the free blocks %s, %s", ip4, ip6, free4, free6)
	}
	root6 := netip.MustParseAddr(env["TESTHOST_ROOT_IP6"])

	p, img := netProvider(t, env)
	id := testID("egress")
	cleanupProxy(t, p, id)
	gw4, gw6 := bridgeAddrs(t, p)
	n := fleet.Network{
		MAC:  fmt.Sprintf("52:54:00:%02x:%02x:%02x", rand.IntN(256), rand.IntN(256), rand.IntN(256)),
		IPv4: ip4, IPv4Gateway: gw4, IPv6: ip6, IPv6Gateway: gw6,
	}
	if !routedToTestHost(t, ip4, env) || !routedToTestHost(t, ip6[0], env) {
		t.Skipf("the test host routes no prefix of %s or %s to its bridge", ip4, ip6[0])
	}

	// The target: the address each connection came from, and the header
	// if it got one.
	ln, err := net.Listen("tcp6", net.JoinHostPort(root6.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[string]int{} // remote address -> requests on it
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr]++
		mu.Unlock()
		fmt.Fprintf(w, "%s|%s", r.RemoteAddr, r.Header.Get(messages.HeaderEgress))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	target := "http://" + ln.Addr().String() + "/"

	spec := fleet.Spec{ID: id, Image: img.Name, CPUs: 1, MemoryMiB: 512, CommandID: "cmd-" + id, SpecHash: "0123456789abcdef", Network: n}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := p.Create(ctx, spec); err != nil {
		t.Fatalf("create: %v", err)
	}

	// Through squid on the proxy's IPv4 address (the tests' allow-list
	// holds the root namespace's IPv4 address), with the tests' credential.
	pu := &url.URL{Scheme: "http", User: url.UserPassword(testGuestProxy.User, testGuestProxy.Password), Host: net.JoinHostPort(ip4.String(), "3128")}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), MaxConnsPerHost: 1}, Timeout: 15 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	get := func(header string) (netip.AddrPort, string, error) {
		req, _ := http.NewRequest("GET", target, nil)
		if header != "" {
			req.Header.Set(messages.HeaderEgress, header)
		}
		resp, err := c.Do(req)
		if err != nil {
			return netip.AddrPort{}, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return netip.AddrPort{}, "", fmt.Errorf("%s: %.200s", resp.Status, b)
		}
		remote, seen, _ := strings.Cut(string(b), "|")
		ap, err := netip.ParseAddrPort(remote)
		return ap, seen, err
	}
	// Until squid serves and every address left duplicate address
	// detection (a tentative one cannot be bound).
	var lastErr error
	if !poll.WaitEvery(6*time.Minute, 2*time.Second, func() bool {
		for _, a := range ip6 {
			if _, _, lastErr = get(a.String()); lastErr != nil {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("no answer through %s: %v; console: virsh console %s", pu.Host, lastErr, domainName(id))
	}
	t.Logf("%5.1fs squid serves from every address", time.Since(start).Seconds())

	type try struct{ header, want string }
	var tries []try
	for round := 0; round < 3; round++ {
		for _, a := range ip6 {
			tries = append(tries, try{a.String(), a.String()})
		}
		tries = append(tries,
			try{"", ip6[0].String()},                               // no header: the IPv6 default
			try{ip4.String(), ip6[0].String()},                     // an IPv4 address for an IPv6 target
			try{"2001:db8:101::dead", ip6[0].String()},             // not the proxy's
			try{strings.ToUpper(ip6[2].String()), ip6[0].String()}) // not netip's form
	}
	// An IPv4 target: the IPv4 address, whatever is asked for.
	ln4, err := net.Listen("tcp4", net.JoinHostPort(env["TESTHOST_ROOT_IP"], "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv4 := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: srv.Handler}
	go srv4.Serve(ln4)
	t.Cleanup(func() { srv4.Close() })
	for _, h := range []string{ip4.String(), ip6[1].String(), ""} {
		req, _ := http.NewRequest("GET", "http://"+ln4.Addr().String()+"/", nil)
		if h != "" {
			req.Header.Set(messages.HeaderEgress, h)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("IPv4 target, header %q: %v", h, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(b), ip4.String()+":") || !strings.HasSuffix(string(b), "|") {
			t.Errorf("IPv4 target, header %q: the target saw %q, want %s and no header", h, b, ip4)
		}
	}

	reused := 0
	seenPorts := map[netip.AddrPort]bool{}
	for _, tr := range tries {
		src, seen, err := get(tr.header)
		if err != nil {
			t.Fatalf("header %q: %v", tr.header, err)
		}
		if src.Addr().String() != tr.want {
			t.Errorf("header %q: the target saw %s, want %s", tr.header, src.Addr(), tr.want)
		}
		if seen != "" {
			t.Errorf("header %q: the target got %s: %q", tr.header, messages.HeaderEgress, seen)
		}
		if seenPorts[src] {
			reused++
		}
		seenPorts[src] = true
	}
	// Evidence that persistent server connections were in play: squid
	// sent some requests on a connection it had used before.
	t.Logf("%d requests, %d on a server connection squid had used before, %d connections", len(tries), reused, len(seenPorts))
	if reused == 0 {
		t.Logf("squid reused no server connection: the check above did not meet its pool")
	}
}
