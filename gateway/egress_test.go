package gateway

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"proxyfleet/rotation"
)

// egressGet fetches u through c and returns the answer's HeaderEgress.
func egressGet(t *testing.T, c *http.Client, u string, hdr map[string]string) string {
	t.Helper()
	resp, _ := getResp(t, c, u, hdr)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	return resp.Header.Get(HeaderEgress)
}

// egress is the HeaderEgress of every request the upstream saw.
func (u *upstream) egress() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, h := range u.headers {
		out = append(out, h.Get(HeaderEgress))
	}
	return out
}

// A proxy with egress addresses is told which one each request leaves
// from, and the client is told too: one at random without a session,
// the session's own with one (the same every time, and the sessions of a
// proxy spread over its addresses), the next one with egress-rotate, for
// plain requests and CONNECT alike. A client's own HeaderEgress never
// reaches a proxy.
func TestGatewayTellsTheProxyItsEgress(t *testing.T) {
	up := newUpstream(t, "p1", "")
	var addrs []netip.Addr
	for i := 1; i <= 4; i++ {
		addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("198.18.101.%d", i)))
	}
	addrs = append(addrs, netip.MustParseAddr("2001:db8:101::10"))
	p := Proxy{ID: "p1", Addr: up.addr(), EgressAddrs: addrs}
	g := startGateway(t, newPicker(p), nil)
	tg := newTarget(t, false) // on 127.0.0.1: an IPv4 target
	v4 := addrs[:4]

	// Without a session: an IPv4 address of the proxy's, the one it was
	// told.
	c := g.client(t, "alice", alicePass)
	for range 10 {
		got := egressGet(t, c, tg.srv.URL, nil)
		sent := up.egress()[len(up.egress())-1]
		if a, err := netip.ParseAddr(got); err != nil || !slices.Contains(v4, a) || sent != got {
			t.Fatalf("answer's egress %q, the proxy was told %q; want one of %v, the same", got, sent, v4)
		}
	}
	// A session keeps its address; sessions spread.
	spread := map[string]bool{}
	for s := range 16 {
		key := fmt.Sprintf("s%d", s)
		c := g.client(t, "alice-session-"+key, alicePass)
		want := rotation.SessionEgress(p, key, rotation.IPv4).String()
		for range 3 {
			if got := egressGet(t, c, tg.srv.URL, nil); got != want {
				t.Fatalf("session %s: egress %s, want %s", key, got, want)
			}
		}
		spread[want] = true
	}
	if len(spread) < 3 {
		t.Errorf("16 sessions left from %d addresses", len(spread))
	}
	// egress-rotate: a new address on every request.
	c = g.client(t, "alice-egress-rotate", alicePass)
	last := ""
	for range 8 {
		got := egressGet(t, c, tg.srv.URL, nil)
		if got == last || got == "" {
			t.Fatalf("egress-rotate left from %q after %q", got, last)
		}
		last = got
	}
	// CONNECT: the proxy's CONNECT carries it, and so does the 200.
	resp, conn, _ := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice-session-s3", alicePass), nil)
	conn.Close()
	want := rotation.SessionEgress(p, "s3", rotation.IPv4).String()
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEgress) != want || up.egress()[len(up.egress())-1] != want {
		t.Fatalf("CONNECT: %s, egress %q, the proxy was told %q; want %s", resp.Status, resp.Header.Get(HeaderEgress), up.egress()[len(up.egress())-1], want)
	}
	// An IPv6 target gets the IPv6 address.
	resp, conn, _ = g.connect(t, "[::1]:9", basic("alice", alicePass), nil)
	conn.Close()
	if got := up.egress()[len(up.egress())-1]; got != "2001:db8:101::10" {
		t.Errorf("CONNECT to an IPv6 target: the proxy was told %q (answer %s)", got, resp.Status)
	}
}

func TestGatewayDropsAClientsEgress(t *testing.T) {
	up := newUpstream(t, "p1", "")
	g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
	tg := newTarget(t, false)
	c := g.client(t, "alice", alicePass)
	if got := egressGet(t, c, tg.srv.URL, map[string]string{HeaderEgress: "203.0.113.9"}); got != "" {
		t.Errorf("the answer of a proxy without addresses carries egress %q", got)
	}
	resp, conn, _ := g.connect(t, tg.srv.Listener.Addr().String(), basic("alice", alicePass), map[string]string{HeaderEgress: "203.0.113.9"})
	conn.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	for i, e := range up.egress() {
		if e != "" {
			t.Errorf("request %d reached the proxy with the client's %s: %q", i, HeaderEgress, e)
		}
	}
	if _, _, err := parseUser("alice-egress-sometimes"); err == nil || !strings.Contains(err.Error(), "rotate") {
		t.Errorf("egress-sometimes: %v", err)
	}
}

// A request whose head is larger than the client's reader tells the
// proxy and the client the same.
func TestGatewayLargeHeadTellsTheProxyItsEgress(t *testing.T) {
	up := newUpstream(t, "p1", "")
	p := Proxy{ID: "p1", Addr: up.addr(), EgressAddrs: []netip.Addr{netip.MustParseAddr("198.18.101.7"), netip.MustParseAddr("2001:db8:101::10")}}
	g := startGateway(t, newPicker(p), nil)
	tg := newTarget(t, false)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s/ HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n%sConnection: close\r\n\r\n",
		tg.srv.URL, tg.srv.Listener.Addr(), basic("alice", alicePass), largePad)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEgress) != "198.18.101.7" || up.egress()[0] != "198.18.101.7" {
		t.Fatalf("large head: %s, egress %q, the proxy was told %v", resp.Status, resp.Header.Get(HeaderEgress), up.egress())
	}
}
