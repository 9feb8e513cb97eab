package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"proxyfleet/messages"
)

// gatewayLeavesFromPlannedIPv6Addresses: the planned guest behind the
// gateway, and a target on the root namespace's IPv6 address: 32
// sessions leave from at least 12 distinct addresses, each session from
// one address for 10 requests (the address the answer names, and the one
// the target saw); USER-egress-rotate leaves from another address on
// every request.
func gatewayLeavesFromPlannedIPv6Addresses(t *testing.T, g *plannedGuest) {
	root6 := os.Getenv("TESTHOST_ROOT_IP6")
	if root6 == "" {
		t.Fatal("TESTHOST_ROOT_IP6 is not set: run make testhost")
	}
	e, rot, id, gwAddr := g.e.use(t), g.rot, g.id, g.gwAddr
	token := "gw6-" + time.Now().Format("150405.000")
	targetURL, requests := recordingTarget(t, root6, token)
	waitUntil(t, id+" in the rotation", 4*time.Minute, func() bool { return rot.has(id) })
	planned, err := messages.ExpandEgress(e.lastEvent(id).Egress)
	if err != nil || len(planned) != 17 {
		t.Fatalf("%s's egress %v: %v", id, e.lastEvent(id).Egress, err)
	}

	// get sends one request as user and returns the egress the answer
	// names and the source the target saw.
	get := func(user string) (named, saw string) {
		t.Helper()
		before := len(requests())
		var resp *http.Response
		waitUntil(t, "a request through the gateway", time.Minute, func() bool {
			var err error
			resp, err = throughAs(gwAddr, targetURL, url.UserPassword(user, "alice-gateway-secret"))
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK && string(b) == token
		})
		for _, r := range requests()[before:] {
			if r.header.Get(messages.HeaderEgress) != "" {
				t.Errorf("the target saw %s: %q", messages.HeaderEgress, r.header.Get(messages.HeaderEgress))
			}
			saw, _, _ = net.SplitHostPort(r.remote)
		}
		return resp.Header.Get(messages.HeaderEgress), saw
	}
	distinct := map[string]bool{}
	for s := range 32 {
		user := fmt.Sprintf("alice-session-s%d", s)
		first := ""
		for i := range 10 {
			named, saw := get(user)
			a, err := netip.ParseAddr(saw)
			if err != nil || !slices.Contains(planned, a) || named != saw {
				t.Fatalf("session s%d, request %d: the answer names %q, the target saw %q; want the same, one of the proxy's", s, i, named, saw)
			}
			if first == "" {
				first = saw
			} else if saw != first {
				t.Fatalf("session s%d left from %s, then %s at request %d", s, first, saw, i)
			}
		}
		distinct[first] = true
	}
	if len(distinct) < 12 {
		t.Errorf("32 sessions left from %d distinct addresses, want at least 12", len(distinct))
	}
	last := ""
	for i := range 10 {
		_, saw := get("alice-egress-rotate")
		if saw == last {
			t.Fatalf("egress-rotate left from %s twice in a row (request %d)", saw, i)
		}
		last = saw
	}
	t.Logf("32 sessions left from %d of the proxy's 16 IPv6 addresses", len(distinct))
}
