package gateway

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"proxyfleet/deny"
)

// A target whose host is an address the deny list refuses is answered
// 403 (SOCKS5: reply 2) before any proxy is picked: no proxy hears of
// it, none is reported. A target outside the list, or a name, goes on.
// (No traffic leaves for the targets named here: the proxy is scripted
// and dials nothing.)

func picks(pk *fakePicker) int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return len(pk.sels)
}

// checkUntouched fails unless the proxy got no connection, no proxy was
// picked and none reported.
func checkUntouched(t *testing.T, up *scriptProxy, pk *fakePicker) {
	t.Helper()
	if reqs, conns := up.seen(); conns != 0 {
		t.Errorf("the proxy got %d connections (%+v), want none", conns, reqs)
	}
	if n := picks(pk); n != 0 {
		t.Errorf("%d picks for denied targets, want none", n)
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Errorf("the proxy was reported for denied targets: %v", r)
	}
}

// TestDeniedDestinations: with the default list, CONNECT, plain requests
// (with a head that fits the client's reader and with a larger one) and SOCKS5 (IPv4, IPv6, and an
// address as a domain) to a denied address are refused.
func TestDeniedDestinations(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, func(c *Config) { c.Deny = nil }) // the default list

	// One connection, kept alive across the refusals.
	rc := dialGateway(t, g)
	for _, c := range []struct{ req, method, addr string }{
		{"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\n" + aliceAuth + "\r\n", http.MethodConnect, "127.0.0.1"},
		{"CONNECT [fd00::1]:443 HTTP/1.1\r\nHost: [fd00::1]:443\r\n" + aliceAuth + "\r\n", http.MethodConnect, "fd00::1"},
		{"CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n" + aliceAuth + "\r\n", http.MethodConnect, "169.254.169.254"},
		{"CONNECT [::ffff:127.0.0.1]:80 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n", http.MethodConnect, "::ffff:127.0.0.1"},
		{"CONNECT [::1]:22 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n", http.MethodConnect, "::1"},
		{get1("http://127.0.0.1:9/"), http.MethodGet, "127.0.0.1"},
		{get1("http://[fd00::1]/x"), http.MethodGet, "fd00::1"},
		{get1("http://169.254.169.254/latest/meta-data/"), http.MethodGet, "169.254.169.254"},
		{get1("http://0.0.0.0:8080/"), http.MethodGet, "0.0.0.0"},
	} {
		rc.send(c.req)
		resp, body := rc.read(c.method)
		if want := "destination " + c.addr + " is denied\n"; resp.StatusCode != http.StatusForbidden || body != want {
			t.Errorf("%q: %s %q, want 403 %q", strings.SplitN(c.req, "\r\n", 2)[0], resp.Status, body, want)
		}
		if resp.Close {
			t.Fatalf("%q: the connection is closed after a refusal", strings.SplitN(c.req, "\r\n", 2)[0])
		}
	}

	// Heads larger than the client's reader, each on a new connection.
	large := []string{
		"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\n",
		"CONNECT [fd00::1]:443 HTTP/1.1\r\nHost: [fd00::1]:443\r\n",
		"GET http://169.254.169.254/latest HTTP/1.1\r\nHost: x\r\n",
		"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n",
	}
	for _, req := range large {
		if resp, body := withLargeHead(t, g, req); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, " is denied") {
			t.Errorf("large head %q: %s %q, want 403", strings.SplitN(req, "\r\n", 2)[0], resp.Status, body)
		}
	}

	// SOCKS5: every address type, and an address written as a domain.
	socks := []struct {
		name string
		atyp byte
		addr []byte
	}{
		{"IPv4 loopback", socksAtypIPv4, []byte{127, 0, 0, 1}},
		{"IPv4 metadata", socksAtypIPv4, []byte{169, 254, 169, 254}},
		{"IPv6 ULA", socksAtypIPv6, netip.MustParseAddr("fd00::1").AsSlice()},
		{"IPv6 IPv4-mapped", socksAtypIPv6, netip.MustParseAddr("::ffff:127.0.0.1").AsSlice()},
		{"domain IPv4", socksAtypDomain, domain("127.0.0.1")},
		{"domain IPv6", socksAtypDomain, domain("::1")},
		{"domain IPv4-mapped", socksAtypDomain, domain("::ffff:169.254.169.254")},
	}
	for _, c := range socks {
		if code := socksConnectRaw(t, g, c.atyp, c.addr, 80); code != repNotAllowed {
			t.Errorf("SOCKS5 %s: reply %d, want %d (not allowed by ruleset)", c.name, code, repNotAllowed)
		}
	}

	checkUntouched(t, up, pk)
	for _, c := range []struct {
		kind string
		n    int
	}{{kindConnect, 5 + 2}, {kindHTTP, 4 + 2}, {kindSocks, len(socks)}} {
		if got := requests(g, c.kind, outcomeDenied); got != float64(c.n) {
			t.Errorf("%s requests denied: %v, want %d", c.kind, got, c.n)
		}
	}

	// Outside the list, and names (not resolved here), go through.
	rc.send("CONNECT 198.18.0.1:443 HTTP/1.1\r\nHost: 198.18.0.1:443\r\n" + aliceAuth + "\r\n")
	if resp, _ := rc.read(http.MethodConnect); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT 198.18.0.1:443: %s", resp.Status)
	}
	rc = dialGateway(t, g)
	rc.send(get1("http://localhost.example/"))
	if resp, body := rc.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Fatalf("GET http://localhost.example/: %s %q", resp.Status, body)
	}
	rc.send(get1("http://[2001:db8::1]/"))
	if resp, body := rc.read(http.MethodGet); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Fatalf("GET http://[2001:db8::1]/: %s %q", resp.Status, body)
	}
	if code := socksConnectRaw(t, g, socksAtypIPv4, []byte{198, 18, 0, 1}, 443); code != repSucceeded {
		t.Fatalf("SOCKS5 198.18.0.1: reply %d", code)
	}
	if code := socksConnectRaw(t, g, socksAtypDomain, domain("t.example"), 443); code != repSucceeded {
		t.Fatalf("SOCKS5 t.example: reply %d", code)
	}
	reqs, _ := up.seen()
	var got []string
	for _, r := range reqs {
		got = append(got, r.method+" "+r.uri)
	}
	want := []string{"CONNECT 198.18.0.1:443", "GET http://localhost.example/", "GET http://[2001:db8::1]/", "CONNECT 198.18.0.1:443", "CONNECT t.example:443"}
	if !slices.Equal(got, want) {
		t.Fatalf("the proxy saw %q, want %q", got, want)
	}
}

// TestDeniedOwnAddress: the address the gateway listens on is refused
// with a list that does not name it; an empty list refuses nothing, not
// even it.
func TestDeniedOwnAddress(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	ula, err := deny.Parse("gateway.deny", []string{"fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, pk, func(c *Config) { c.Deny = &ula }) // listening on 127.0.0.1
	rc := dialGateway(t, g)
	rc.send("CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n")
	if resp, body := rc.read(http.MethodConnect); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT to the gateway's own address: %s %q", resp.Status, body)
	}
	rc.send(get1("http://127.0.0.1:1/"))
	if resp, body := rc.read(http.MethodGet); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("GET from the gateway's own address: %s %q", resp.Status, body)
	}
	if code := socksConnectRaw(t, g, socksAtypIPv4, []byte{127, 0, 0, 1}, 1); code != repNotAllowed {
		t.Fatalf("SOCKS5 to the gateway's own address: reply %d", code)
	}
	checkUntouched(t, up, pk)
	// Another loopback address is not the gateway's, nor in the list.
	rc.send("CONNECT 127.0.0.2:443 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n")
	if resp, _ := rc.read(http.MethodConnect); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT 127.0.0.2:443: %s", resp.Status)
	}

	// An empty list: the own address goes through too.
	up2 := newScriptProxy(t, squidLike)
	g2 := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up2.addr()}), nil)
	rc = dialGateway(t, g2)
	rc.send("CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n")
	if resp, _ := rc.read(http.MethodConnect); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT 127.0.0.1:1 with nothing denied: %s", resp.Status)
	}
}

// fixedAddrListener is a listener that only has an address.
type fixedAddrListener struct {
	net.Listener
	addr net.Addr
}

func (l fixedAddrListener) Addr() net.Addr { return l.addr }

// The own addresses added are the listeners' specific ones.
func TestDenyWithOwn(t *testing.T) {
	ln := func(s string) net.Listener {
		return fixedAddrListener{addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))}
	}
	ula, err := deny.Parse("gateway.deny", []string{"fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		d    deny.List
		lns  []net.Listener
		want []string
	}{
		{"specific", ula, []net.Listener{ln("198.18.0.5:8888"), ln("[2001:db8::5]:1080")}, []string{"fd00::/8", "198.18.0.5/32", "2001:db8::5/128"}},
		{"unspecified", ula, []net.Listener{ln("0.0.0.0:8888"), ln("[::]:1080")}, []string{"fd00::/8"}},
		{"IPv4-mapped", ula, []net.Listener{ln("[::ffff:198.18.0.5]:8888"), ln("[::ffff:0.0.0.0]:1")}, []string{"fd00::/8", "198.18.0.5/32"}},
		{"one listener", ula, []net.Listener{nil, ln("198.18.0.5:1080")}, []string{"fd00::/8", "198.18.0.5/32"}},
		{"nothing denied", deny.List{}, []net.Listener{ln("198.18.0.5:8888")}, []string{}},
	} {
		if got := denyWithOwn(c.d, c.lns...).Strings(); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// targetAddr: the address a host that passed the rule is; none for a
// name.
func TestTargetAddr(t *testing.T) {
	for _, c := range []struct{ host, want string }{
		{"127.0.0.1", "127.0.0.1"},
		{"fd00::1", "fd00::1"},
		{"[fd00::1]", "fd00::1"},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1"},
		{"t.example", ""},
		{"localhost", ""},
		{"a1.b2", ""},
	} {
		a, ok := targetAddr(c.host)
		if got := a.String(); ok != (c.want != "") || ok && got != c.want {
			t.Errorf("targetAddr(%q) = %s, %v; want %q", c.host, got, ok, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { targetAddr("t.example"); targetAddr("198.18.0.1") }); n != 0 {
		t.Errorf("targetAddr allocates %v times for a name and an IPv4 address", n)
	}
}
