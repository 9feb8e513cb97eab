package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
)

// squid gets one round-robin parent per upstream with the fleet's
// credential and never goes direct; haproxy one server per upstream in
// TCP round robin.
func TestPeerConfigsNameEveryUpstream(t *testing.T) {
	ups := []string{"127.0.0.1:3128", "127.0.0.1:3129"}
	sq, err := squidConfig("/d", "127.0.0.1:1", ups, "fleet", "pw")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"http_port 127.0.0.1:1\n",
		"cache_peer 127.0.0.1 parent 3128 0 no-query no-digest no-netdb-exchange round-robin login=fleet:pw name=up1\n",
		"cache_peer 127.0.0.1 parent 3129 0 no-query no-digest no-netdb-exchange round-robin login=fleet:pw name=up2\n",
		"never_direct allow all\n", "pid_filename /d/squid.pid\n", "cache_log /d/squid-cache.log\n",
	} {
		if !strings.Contains(sq, want) {
			t.Errorf("squid config lacks %q:\n%s", want, sq)
		}
	}
	if _, err := squidConfig("/d", "127.0.0.1:1", []string{"no-port"}, "u", "p"); err == nil {
		t.Error("an upstream without a port was accepted")
	}
	ha := haproxyConfig("/d", "127.0.0.1:2", ups)
	for _, want := range []string{"mode tcp\n", "bind 127.0.0.1:2\n", "balance roundrobin\n",
		"server up1 127.0.0.1:3128\n", "server up2 127.0.0.1:3129\n", "pidfile /d/haproxy.pid\n"} {
		if !strings.Contains(ha, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, ha)
		}
	}
}

// bulkRate reads through a CONNECT tunnel of the bench's upstream proxy,
// sending its credential; without it the proxy's 407 is an error.
func TestBulkRateThroughTheUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("reads for gwRateFor")
	}
	src, err := newBulkSource()
	if err != nil {
		t.Fatal(err)
	}
	defer src.close()
	up, err := newBenchUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer up.close()
	ctx := context.Background()
	if _, err := bulkRate(ctx, &url.URL{Host: up.addr()}, src.addr()); err == nil || !strings.Contains(err.Error(), "407") {
		t.Errorf("without the credential: %v, want a 407", err)
	}
	r, err := bulkRate(ctx, &url.URL{Host: up.addr(), User: url.UserPassword(gwFleetUser, gwFleetPass)}, src.addr())
	if err != nil || r <= 0 {
		t.Fatalf("bulkRate = %v, %v", r, err)
	}
}

// A figure behind squid says so in its bound; one ahead does not.
func TestBehindSquidSaysSo(t *testing.T) {
	var p gwPeers
	f := figure{Bound: "cores."}
	p.behindSquid(&f, 0.5, []float64{0.6})
	if !strings.Contains(f.Bound, "not ahead of squid") || !strings.HasPrefix(f.Bound, "cores. ") {
		t.Errorf("bound %q", f.Bound)
	}
	g := figure{}
	p.behindSquid(&g, 0.7, []float64{0.6})
	if g.Bound != "" {
		t.Errorf("bound %q for a gateway ahead", g.Bound)
	}
}
