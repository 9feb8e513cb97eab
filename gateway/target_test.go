package gateway

import (
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// A target the gateway refuses never reaches a proxy: the client is
// answered (a SOCKS5 failure, a 400), no proxy is dialed, none reported.

// squidLike answers as the fleet's squid does: 407 to a request without
// the fleet's credential (the connection goes on), 200 to one with it (a
// CONNECT's connection then closes).
func squidLike(c net.Conn, r *seenRequest) bool {
	if r.header.Get("Proxy-Authorization") != basic(fleetUser, fleetPass) {
		_, _ = io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"squid\"\r\nContent-Length: 0\r\n\r\n")
		return true
	}
	if r.method == http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		return false
	}
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	return true
}

// socksConnectRaw sends a SOCKS5 CONNECT as alice for ATYP atyp,
// DST.ADDR addr (a domain's length byte included) and DST.PORT port,
// and returns the reply's code.
func socksConnectRaw(t *testing.T, g *testGateway, atyp byte, addr []byte, port uint16) byte {
	t.Helper()
	c := dialSocks(t, g)
	b := []byte{socksVersion, 1, socksAuthUserPW}
	b = append(b, socksAuthVersion, byte(len("alice")))
	b = append(b, "alice"...)
	b = append(b, byte(len(alicePass)))
	b = append(b, alicePass...)
	b = append(b, socksVersion, socksCmdConnect, 0, atyp)
	b = append(b, addr...)
	b = binary.BigEndian.AppendUint16(b, port)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	var r [2 + 2 + 10]byte // method, authentication, reply
	if _, err := io.ReadFull(c, r[:]); err != nil {
		t.Fatalf("SOCKS5 answers: %v (%x)", err, r)
	}
	if r[1] != socksAuthUserPW || r[3] != socksAuthOK {
		t.Fatalf("SOCKS5 authentication: %x", r[:4])
	}
	return r[5]
}

func domain(s string) []byte { return append([]byte{byte(len(s))}, s...) }

// TestSocksRefusesBadTarget: a SOCKS5 domain that is not a host name
// (CR LF and a request of its own after it, a space, a NUL, '@', '/',
// '%', a trailing dot) or a port 0 is answered "host unreachable", and
// the proxy gets nothing: a client cannot write lines of its own ahead
// of the fleet's credential, nor make a healthy proxy look broken.
func TestSocksRefusesBadTarget(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)

	cases := []struct {
		name string
		atyp byte
		addr []byte
		port uint16
	}{
		{"CR LF injection", socksAtypDomain, domain("example.com:80 HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET http://evil/ HTTP/1.1\r\nHost: x"), 443},
		// As host:port it is "[::1] HTTP/1.1 ... X-Tail: x]:443": the
		// proxy reads a CONNECT, then a GET, then a GET with the fleet's
		// Proxy-Authorization.
		{"a smuggled request", socksAtypDomain, domain("::1] HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET http://evil/ HTTP/1.1\r\nX-Tail: x"), 443},
		{"LF", socksAtypDomain, domain("example.com\nX-Injected: 1"), 443},
		{"space", socksAtypDomain, domain("exa mple.com"), 443},
		{"NUL", socksAtypDomain, domain("example.com\x00"), 443},
		{"user info", socksAtypDomain, domain("user@example.com"), 443},
		{"slash", socksAtypDomain, domain("example.com/x"), 443},
		{"zone", socksAtypDomain, domain("fe80::1%eth0"), 443},
		{"trailing dot", socksAtypDomain, domain("example.com."), 443},
		{"port 0", socksAtypDomain, domain("example.com"), 0},
		{"IPv4 port 0", socksAtypIPv4, []byte{192, 0, 2, 1}, 0},
	}
	for _, c := range cases {
		if code := socksConnectRaw(t, g, c.atyp, c.addr, c.port); code != repHostUnreachable {
			t.Errorf("%s: reply %d, want %d (host unreachable)", c.name, code, repHostUnreachable)
		}
	}
	if reqs, conns := up.seen(); conns != 0 {
		t.Errorf("the proxy got %d connections (%d requests: %+v), want none", conns, len(reqs), reqs)
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Errorf("the proxy was reported for refused targets: %v", r)
	}
	if got := requests(g, kindSocks, outcomeError); got != float64(len(cases)) {
		t.Errorf("SOCKS5 errors counted %v, want %d", got, len(cases))
	}

	// A host name does go through, as host:port.
	if code := socksConnectRaw(t, g, socksAtypDomain, domain("t.example"), 443); code != repSucceeded {
		t.Fatalf("a host name: reply %d", code)
	}
	if reqs, _ := up.seen(); len(reqs) != 1 || reqs[0].method != http.MethodConnect || reqs[0].uri != "t.example:443" || reqs[0].host != "t.example:443" {
		t.Fatalf("the proxy saw %+v, want CONNECT t.example:443", reqs)
	}
}

// badConnectTargets are CONNECT targets the lean parser takes as a head
// and the gateway refuses.
var badConnectTargets = []string{
	"t.example",            // no port
	"t.example:",           // an empty port
	"t.example:0",          // port 0
	"t.example:65536",      // over 65535
	"t.example:+1",         // a sign
	"t.example:08x",        // not digits
	"evil@t.example:443",   // user info
	"a_b.example:443",      // not LDH
	"t.example.:443",       // a trailing dot
	"t.example%0d%0a:443",  // '%'
	"[fe80::1%25eth0]:443", // an IPv6 zone
	"[192.0.2.1]:443",      // IPv4 in brackets
	"2001:db8::1:443",      // IPv6 without brackets
	"-t.example:443",       // a label starting with '-'
	"1.2.3.256:443",        // not an IPv4 address, and all digits
	"t.example:443/x",      // a path
	"t.example:443?q#f",    // a query and a fragment
	"[2001:db8::1]x:443",   // after the brackets
	"t.example:443:443",    // two ports
	"t..example:443",       // an empty label
	"t.example\x7f:443",    // DEL
	"\u00e9.example:443",   // not ASCII
	"xn--e-.example:443",   // a label ending with '-'
	"t.example:-443",       // a sign
	"[::1%25lo]:443",       // a zone again
	"t.example:4433333",    // too many digits
}

// TestConnectRefusesBadTarget: the gateway answers 400 to a CONNECT
// whose target is not host:port by the rule, and no proxy hears of it;
// an IPv6 address in brackets goes through.
func TestConnectRefusesBadTarget(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	for _, target := range badConnectTargets {
		rc := dialGateway(t, g)
		rc.send("CONNECT " + target + " HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n")
		if resp, body := rc.read(http.MethodConnect); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("CONNECT %q: %s %q, want 400", target, resp.Status, body)
		}
	}
	if reqs, conns := up.seen(); conns != 0 {
		t.Errorf("the proxy got %d connections (%+v), want none", conns, reqs)
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Errorf("the proxy was reported for refused targets: %v", r)
	}

	rc := dialGateway(t, g)
	rc.send("CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: x\r\n" + aliceAuth + "\r\n")
	if resp, _ := rc.read(http.MethodConnect); resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT [2001:db8::1]:443: %s", resp.Status)
	}
	if reqs, _ := up.seen(); len(reqs) != 1 || reqs[0].uri != "[2001:db8::1]:443" {
		t.Fatalf("the proxy saw %+v, want CONNECT [2001:db8::1]:443", reqs)
	}
}

// TestLargeHeadRefusesBadTarget: with a head larger than the client's
// reader, a CONNECT target or an absolute URI's authority that the rule
// refuses (a port out of range, a name not LDH, a zone with a space),
// or an https:// target (tunneled with CONNECT), is answered 400, and
// no proxy hears of it.
func TestLargeHeadRefusesBadTarget(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	for _, req := range []string{
		"CONNECT t.example:0 HTTP/1.1\r\nHost: t.example:0\r\n",
		"CONNECT t.example:99999 HTTP/1.1\r\nHost: t.example:99999\r\n",
		"CONNECT a_b.example:443 HTTP/1.1\r\nHost: a_b.example:443\r\n",
		"CONNECT [fe80::1%25a%20b]:443 HTTP/1.1\r\nHost: x\r\n",
		"GET http://t.example:0/ HTTP/1.1\r\nHost: x\r\n",
		"GET http://t.example:99999/ HTTP/1.1\r\nHost: x\r\n",
		"GET http://a_b.example/ HTTP/1.1\r\nHost: x\r\n",
		"GET http://[fe80::1%25a%20b]/ HTTP/1.1\r\nHost: x\r\n",
		"GET https://t.example:0/ HTTP/1.1\r\nHost: x\r\n",
	} {
		if resp, body := withLargeHead(t, g, req); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %s %q, want 400", req, resp.Status, body)
		}
	}
	if reqs, conns := up.seen(); conns != 0 {
		t.Errorf("the proxy got %d connections (%+v), want none", conns, reqs)
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Errorf("the proxy was reported for refused targets: %v", r)
	}
}

// TestLeanPlainRefusesBadAuthority: an absolute URI whose authority the
// rule refuses is answered 400, and no proxy hears of it.
func TestLeanPlainRefusesBadAuthority(t *testing.T) {
	up := newScriptProxy(t, squidLike)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(t, pk, nil)
	for _, u := range []string{
		"http://a_b.example/",
		"http://t.example:0/",
		"http://t.example:99999/",
		"http://t.example.:80/",
		"http://[192.0.2.1]/",
		"http://t.example%0d%0aX:80/",
	} {
		rc := dialGateway(t, g)
		rc.send(get1(u))
		if resp, body := rc.read(http.MethodGet); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %s %q, want 400", u, resp.Status, body)
		}
	}
	if reqs, conns := up.seen(); conns != 0 {
		t.Errorf("the proxy got %d connections (%+v), want none", conns, reqs)
	}
	if r := pk.gotReports(); len(r) != 0 {
		t.Errorf("the proxy was reported for refused targets: %v", r)
	}
	// A good one goes through, [IPv6] and port too.
	rc := dialGateway(t, g)
	rc.send(get1("http://[2001:db8::1]:8080/x"))
	if resp, body := rc.read(http.MethodGet); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("GET http://[2001:db8::1]:8080/x: %s %q", resp.Status, body)
	}
}

func TestParseHostPort(t *testing.T) {
	long := strings.Repeat("a", 63)
	name253 := strings.Join([]string{long, long, long, strings.Repeat("b", 61)}, ".") // 253 bytes
	for _, c := range []struct {
		in, want string // want "": refused
	}{
		{"example.com:443", "example.com:443"},
		{"Example.COM:80", "Example.COM:80"},
		{"localhost:1", "localhost:1"},
		{"a-b.c-d.example:65535", "a-b.c-d.example:65535"},
		{"xn--bcher-kva.example:443", "xn--bcher-kva.example:443"},
		{"1password.com:443", "1password.com:443"}, // a label may start with a digit
		{"t:80", "t:80"},
		{"t:080", "t:80"},
		{long + ".example:443", long + ".example:443"},
		{name253 + ":1", name253 + ":1"},
		{"192.0.2.1:443", "192.0.2.1:443"},
		{"0.0.0.0:1", "0.0.0.0:1"},
		{"255.255.255.255:65535", "255.255.255.255:65535"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"[2001:DB8:0:0:0:0:0:1]:443", "[2001:db8::1]:443"},
		{"[::1]:80", "[::1]:80"},
		{"[::ffff:192.0.2.1]:80", "[::ffff:192.0.2.1]:80"},

		// Ports.
		{"example.com", ""},
		{"example.com:", ""},
		{"example.com:0", ""},
		{"example.com:00000", ""},
		{"example.com:65536", ""},
		{"example.com:99999", ""},
		{"example.com:100000", ""},
		{"example.com:+1", ""},
		{"example.com:-1", ""},
		{"example.com:08x", ""},
		{"example.com:0x50", ""},
		{"example.com: 80", ""},
		{"example.com:80 ", ""},
		{"example.com:８０", ""},
		{"example.com:443:443", ""},
		{"[::1]", ""},
		{"[::1]:", ""},
		{"[::1]:0", ""},

		// Names.
		{":443", ""},
		{"a..b:443", ""},
		{".example.com:443", ""},
		{"example.com.:443", ""},
		{"-a.example:443", ""},
		{"a-.example:443", ""},
		{"a_b.example:443", ""},
		{long + "a.example:443", ""},
		{name253 + "b:1", ""},
		{"ex ample.com:443", ""},
		{"example.com\r\nX-Injected: 1:443", ""},
		{"example.com\n:443", ""},
		{"example.com\x00:443", ""},
		{"example.com\t:443", ""},
		{"user@example.com:443", ""},
		{"example.com/x:443", ""},
		{"example.com%0d%0a:443", ""},
		{"exa%6dple.com:443", ""},
		{"\u00e9.example:443", ""},
		{"example.123:443", ""},
		{"1.2.3:443", ""},
		{"127.1:443", ""},

		// Addresses.
		{"1.2.3.256:443", ""},
		{"01.2.3.4:443", ""},
		{"1.2.3.4.5:443", ""},
		{"1.2.3.:443", ""},
		{"[192.0.2.1]:443", ""},
		{"2001:db8::1:443", ""},
		{"[2001:db8::1%25eth0]:443", ""},
		{"[fe80::1%eth0]:443", ""},
		{"[fe80::1%a b]:443", ""},
		{"[2001:db8::g]:443", ""},
		{"[[::1]]:443", ""},
		{"[::1]x:443", ""},
		{"[::1:443", ""},
		{"::1]:443", ""},
		{"[]:443", ""},
	} {
		got, err := parseHostPort(c.in)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("parseHostPort(%q) = %q, want a refusal", c.in, got)
		case c.want != "" && err != nil:
			t.Errorf("parseHostPort(%q): %v, want %q", c.in, err, c.want)
		case c.want != "" && got.String() != c.want:
			t.Errorf("parseHostPort(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestNewHostPort(t *testing.T) {
	for _, c := range []struct {
		host string
		port uint16
		want string // "": refused
	}{
		{"example.com", 443, "example.com:443"},
		{"192.0.2.1", 80, "192.0.2.1:80"},
		{"2001:db8::1", 443, "[2001:db8::1]:443"},
		{"::ffff:192.0.2.1", 443, "[::ffff:192.0.2.1]:443"},
		{"example.com", 65535, "example.com:65535"},
		{"example.com", 0, ""},
		{"192.0.2.1", 0, ""},
		{"", 443, ""},
		{"[2001:db8::1]", 443, ""},
		{"fe80::1%eth0", 443, ""},
		{"example.com:80", 443, ""},
		{"example.com.", 443, ""},
		{"example.com HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET http://evil/ HTTP/1.1\r\nHost: x", 443, ""},
		{"::1] HTTP/1.1\r\nX: 1", 443, ""},
		{"a b", 443, ""},
		{"a@b", 443, ""},
		{"a\x00", 443, ""},
	} {
		got, err := newHostPort(c.host, c.port)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("newHostPort(%q, %d) = %q, want a refusal", c.host, c.port, got)
		case c.want != "" && err != nil:
			t.Errorf("newHostPort(%q, %d): %v, want %q", c.host, c.port, err, c.want)
		case c.want != "" && got.String() != c.want:
			t.Errorf("newHostPort(%q, %d) = %q, want %q", c.host, c.port, got, c.want)
		}
	}
}

func TestValidAuthority(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"example.com", true},
		{"example.com:8080", true},
		{"192.0.2.1", true},
		{"192.0.2.1:80", true},
		{"[2001:db8::1]", true},
		{"[2001:db8::1]:8080", true},
		{"", false},
		{"example.com:", false},
		{"example.com:0", false},
		{"example.com:65536", false},
		{"example.com:+80", false},
		{"user@example.com", false},
		{"user:pw@example.com", false},
		{"example.com.", false},
		{"a_b.example", false},
		{"[192.0.2.1]", false},
		{"2001:db8::1", false},
		{"[fe80::1%eth0]", false},
		{"example.com\r\nX: 1", false},
	} {
		if got := validAuthority(c.in); got != c.ok {
			t.Errorf("validAuthority(%q) = %v, want %v", c.in, got, c.ok)
		}
		if got := validAuthority([]byte(c.in)); got != c.ok {
			t.Errorf("validAuthority([]byte(%q)) = %v, want %v", c.in, got, c.ok)
		}
	}
	// Every plain request's authority is checked: nothing
	// allocated for a name or an IPv4 address.
	name, addr := []byte("a-rather-long-host-name.subdomain.example.com:8080"), []byte("192.0.2.1:80")
	if n := testing.AllocsPerRun(100, func() { validAuthority(name); validAuthority(addr) }); n != 0 {
		t.Errorf("validAuthority allocates %v times", n)
	}
}

// FuzzParseHostPort: what passes renders with nothing but letters,
// digits, '-', '.', ':' and brackets, and parses again to itself.
func FuzzParseHostPort(f *testing.F) {
	for _, s := range []string{"example.com:443", "[2001:db8::1]:443", "192.0.2.1:80", "a\r\nb:1", "[fe80::1%eth0]:1", "t:+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hp, err := parseHostPort(s)
		if err != nil {
			return
		}
		r := hp.String()
		for i := 0; i < len(r); i++ {
			c := r[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-.:[]", c) >= 0) {
				t.Fatalf("parseHostPort(%q) renders %q", s, r)
			}
		}
		if again, err := parseHostPort(r); err != nil || again != hp {
			t.Fatalf("parseHostPort(%q) = %q, which parses to %q, %v", s, r, again, err)
		}
	})
}
