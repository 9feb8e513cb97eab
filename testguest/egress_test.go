package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const egressConf = `http_port 3128
acl e0 req_header X-Proxyfleet-Egress ^127\.0\.0\.2$
tcp_outgoing_address 127.0.0.2 e0
acl e1 req_header X-Proxyfleet-Egress ^127\.0\.0\.3$
tcp_outgoing_address 127.0.0.3 e1
acl e2 req_header X-Proxyfleet-Egress ^::1$
tcp_outgoing_address ::1 e2
tcp_outgoing_address 127.0.0.2
tcp_outgoing_address ::1
request_header_access X-Proxyfleet-Egress deny all
http_access allow all
`

func TestParseSquidConf_tcpOutgoingAddress(t *testing.T) {
	c, err := ParseSquidConf([]byte(egressConf), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.outgoing) != 5 || !c.HasOutgoing() {
		t.Fatalf("outgoing %+v", c.outgoing)
	}
	for _, ig := range c.Ignored {
		if strings.HasPrefix(ig, "tcp_outgoing_address") {
			t.Fatalf("tcp_outgoing_address ignored: %v", c.Ignored)
		}
	}
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")
	req := func(h string) *AccessRequest {
		hdr := http.Header{}
		if h != "" {
			// The header's name is matched whatever its case.
			hdr.Set("x-proxyfleet-egress", h)
		}
		return &AccessRequest{Header: hdr}
	}
	for _, tc := range []struct {
		header   string
		dst      netip.Addr
		want     string
		whatCase string
	}{
		{"127.0.0.3", v4, "127.0.0.3", "asked for"},
		{"127.0.0.2", v4, "127.0.0.2", "asked for"},
		{"", v4, "127.0.0.2", "no header: the IPv4 default"},
		{"", v6, "::1", "no header: the IPv6 default"},
		{"127.0.0.3", v6, "::1", "an IPv4 address is skipped for an IPv6 destination"},
		{"::1", v4, "127.0.0.2", "an IPv6 address is skipped for an IPv4 destination"},
		{"127.0.0.30", v4, "127.0.0.2", "the regex is anchored"},
		{"127x0x0x3", v4, "127.0.0.2", "the dots are escaped"},
		{"198.18.0.9", v4, "127.0.0.2", "not the proxy's: the default"},
	} {
		if got := c.OutgoingAddress(req(tc.header), tc.dst); got.String() != tc.want {
			t.Errorf("%s: header %q to %s: %s, want %s", tc.whatCase, tc.header, tc.dst, got, tc.want)
		}
	}

	_, err = ParseSquidConf([]byte("tcp_outgoing_address 198.18.0.1 nosuchacl\n"), nil)
	if err == nil {
		t.Fatal("an undefined acl was accepted")
	}
	for _, bad := range []string{"tcp_outgoing_address\n", "tcp_outgoing_address eth0\n", "tcp_outgoing_address fe80::1%eth0\n"} {
		if _, err := ParseSquidConf([]byte(bad), nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c, err = ParseSquidConf([]byte("http_access allow all\n"), nil)
	if err != nil || c.HasOutgoing() || c.OutgoingAddress(req("127.0.0.3"), v4).IsValid() {
		t.Fatalf("without tcp_outgoing_address: %v %+v", err, c)
	}
}

// sourceServer answers each request with the address it came from, the
// egress header it got (if any) and the client port, on loopback.
func sourceServer(t *testing.T, network, addr string) *httptest.Server {
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("listen %s %s: %v", network, addr, err)
	}
	s := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s", r.RemoteAddr, r.Header.Get("X-Proxyfleet-Egress"))
	})}}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func egressProxy(t *testing.T) *httptest.Server {
	pol, _, err := LoadProxyPolicy(&Seed{InstanceID: "i-1", UserData: []byte(exampleUserData(egressConf, ""))}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	ph := NewProxyHandler(discardLogger())
	ph.SetPolicy(pol)
	s := httptest.NewServer(ph)
	t.Cleanup(func() { ph.CloseTunnels(); s.Close() })
	return s
}

// The proxy connects from the address the request asks for (127.0.0.2 or
// 127.0.0.3 to an IPv4 target, ::1 to an IPv6 one), the default without
// it, and the target never sees the header.
func TestProxy_egressDial(t *testing.T) {
	if c, err := net.Dial("tcp", "127.0.0.3:1"); err != nil && strings.Contains(err.Error(), "assign") {
		t.Skip("127.0.0.3 is not on loopback")
	} else if c != nil {
		c.Close()
	}
	proxy := egressProxy(t)
	target4 := sourceServer(t, "tcp4", "127.0.0.1:0")
	pu, _ := url.Parse(proxy.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	get := func(target, header string) (src netip.Addr, seen string) {
		t.Helper()
		req, _ := http.NewRequest("GET", target, nil)
		if header != "" {
			req.Header.Set("X-Proxyfleet-Egress", header)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		remote, seen, _ := strings.Cut(string(b), "|")
		ap, err := netip.ParseAddrPort(remote)
		if err != nil {
			t.Fatalf("%d %q", resp.StatusCode, b)
		}
		return ap.Addr().Unmap(), seen
	}
	for i := 0; i < 2; i++ {
		for _, tc := range []struct{ header, want string }{
			{"127.0.0.3", "127.0.0.3"}, {"127.0.0.2", "127.0.0.2"}, {"", "127.0.0.2"}, {"::1", "127.0.0.2"},
		} {
			src, seen := get(target4.URL, tc.header)
			if src.String() != tc.want {
				t.Errorf("header %q: from %s, want %s", tc.header, src, tc.want)
			}
			if seen != "" {
				t.Errorf("header %q reached the target", seen)
			}
		}
	}

	// CONNECT leaves from the address asked for too.
	conn, err := net.Dial("tcp", pu.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Proxyfleet-Egress: 127.0.0.3\r\n\r\n", target4.Listener.Addr(), target4.Listener.Addr())
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(b), "127.0.0.3:") {
		t.Fatalf("CONNECT with 127.0.0.3: the target saw %q", b)
	}

	// An IPv6 target: ::1 asked for or by default; an IPv4 address asked
	// for is skipped.
	target6 := sourceServer(t, "tcp6", "[::1]:0")
	for _, h := range []string{"::1", "", "127.0.0.3"} {
		if src, _ := get(target6.URL, h); src.String() != "::1" {
			t.Errorf("IPv6 target, header %q: from %s", h, src)
		}
	}
}

// Concurrent requests asking for different addresses each leave from
// their own: no connection is shared across addresses.
func TestProxy_egressNoSharing(t *testing.T) {
	if c, err := net.Dial("tcp", "127.0.0.3:1"); err != nil && strings.Contains(err.Error(), "assign") {
		t.Skip("127.0.0.3 is not on loopback")
	} else if c != nil {
		c.Close()
	}
	proxy := egressProxy(t)
	target := sourceServer(t, "tcp4", "127.0.0.1:0")
	pu, _ := url.Parse(proxy.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), MaxIdleConnsPerHost: 8}, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		want := []string{"127.0.0.2", "127.0.0.3"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", target.URL, nil)
			req.Header.Set("X-Proxyfleet-Egress", want)
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(b), want+":") {
				errs <- fmt.Errorf("asked for %s, the target saw %q", want, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
