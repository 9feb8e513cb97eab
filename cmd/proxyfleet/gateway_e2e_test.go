package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"proxyfleet/config"
	"proxyfleet/messages"
)

// gatewayGet fetches u through the gateway at gw as user (nil: none) and
// returns the status, the proxy that carried it (X-Proxyfleet-Proxy) and
// the body.
func gatewayGet(gw, u string, user *url.Userinfo) (int, string, string, error) {
	resp, err := throughAs(gw, u, user)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Proxyfleet-Proxy"), string(b), err
}

// gatewayRig is realGuestRig with the gateway role started (user alice,
// password "alice-gateway-secret"; gateway.listen gwAddr, its metrics on
// gwHTTP; mod changes the config after) in front of real proxies ids,
// each created and in the rotation when it returns. Health's rounds are
// far apart and the worker's observation further: what takes a dead
// proxy out of use is the gateway's own view (its failovers, its
// reports and the probes they ask for).
func gatewayRig(t *testing.T, entry string, mod func(*config.Config), ids ...string) (e *e2e, rot *rotationLog, gwAddr, gwHTTP string) {
	t.Helper()
	gwAddr = freePort(t)
	pwFile := filepath.Join(t.TempDir(), "alice-password")
	writeFile(t, pwFile, "alice-gateway-secret\n")
	e, rot = realGuestRig(t, entry, func(c *config.Config) {
		c.Gateway = config.Gateway{Listen: gwAddr, Users: []config.GatewayUser{{Name: "alice", PasswordFile: pwFile}}}
		c.Health.Interval, c.Health.Timeout = 10*time.Second, 2*time.Second
		c.Worker.ObserveInterval = 5 * time.Minute
		if mod != nil {
			mod(c)
		}
	})
	e.cleanupProxies(ids...)
	gwHTTP = freePort(t)
	e.start("gateway", nil, "gateway", "--config", e.path, "--http", gwHTTP, "--debug")
	var cmds []string
	for _, id := range ids {
		cmds = append(cmds, e.createReal(id))
	}
	e.waitDone(6*time.Minute, cmds...)
	waitUntil(t, "the proxies in the rotation", 3*time.Minute, func() bool { return rot.has(ids...) })
	return e, rot, gwAddr, gwHTTP
}

// TestGatewayOverRealProxies runs the tests of a gateway in front of two
// real proxies (Debian guests running squid with the fleet's credential)
// on one boot of them, in this order: the one that only reads through
// them first, the one that destroys and deletes them last. The guests'
// squid refuses proxy.deny's destinations, a range of the test network
// nothing uses (socksDenied's).
func TestGatewayOverRealProxies(t *testing.T) {
	t.Parallel()
	ids := []string{"gw-a", "gw-b"}
	e, rot, gwAddr, gwHTTP := gatewayRig(t, "th-gw", func(c *config.Config) {
		c.Gateway.ConnectTimeout, c.Gateway.ResponseTimeout = 2*time.Second, 3*time.Second
		pd := []string{"198.19.0.0/24", socksDenied + "/32"}
		c.Proxy.Deny = &pd
	}, ids...)
	t.Run("SocksRepliesFromRealSquid", func(t *testing.T) { socksRepliesFromRealSquid(t, e.use(t), rot, ids[0]) })
	t.Run("SpreadSessionsFailoverReports", func(t *testing.T) {
		gatewayOverRealProxies(t, e.use(t), rot, ids, gwAddr, gwHTTP)
	})
}

// gatewayOverRealProxies: the gateway in front of the two real proxies
// ids, as a client sees it: one address; requests spread over both; a
// session key stays on its proxy; a proxy's domain destroyed mid-run
// costs no request that starts after it (the gateway retries on the
// other), moves only that proxy's session keys, and is reported to
// health, which probes it at once; 200 reports of a healthy proxy leave
// it in the rotation; wrong credentials get 407 and an empty rotation
// 503. It destroys one proxy and deletes the other: it runs last on them.
func gatewayOverRealProxies(t *testing.T, e *e2e, rot *rotationLog, ids []string, gwAddr, gwHTTP string) {
	targetURL, token := target(t, rootIP())

	alice := url.UserPassword("alice", "alice-gateway-secret")
	as := func(suffix string) *url.Userinfo { return url.UserPassword("alice"+suffix, "alice-gateway-secret") }
	get := func(user *url.Userinfo) (string, error) {
		code, proxy, body, err := gatewayGet(gwAddr, targetURL, user)
		switch {
		case err != nil:
			return "", err
		case code != http.StatusOK || body != token:
			return proxy, fmt.Errorf("%d %q via %q", code, body, proxy)
		}
		return proxy, nil
	}
	// The gateway follows the rotation by a watch: it serves both once
	// it has caught up.
	waitUntil(t, "the gateway to use both proxies", time.Minute, func() bool {
		seen := map[string]bool{}
		for range 6 {
			if p, err := get(alice); err == nil {
				seen[p] = true
			}
		}
		return seen[ids[0]] && seen[ids[1]]
	})

	// Spread: round robin over both.
	spread := map[string]int{}
	for i := range 40 {
		p, err := get(alice)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		spread[p]++
	}
	if spread[ids[0]] < 10 || spread[ids[1]] < 10 {
		t.Fatalf("40 requests went %v, want both proxies used", spread)
	}

	// A session stays on one proxy for 50 requests.
	var s1 string
	for i := range 50 {
		p, err := get(as("-session-s1"))
		if err != nil {
			t.Fatalf("session s1, request %d: %v", i, err)
		}
		if s1 == "" {
			s1 = p
		} else if p != s1 {
			t.Fatalf("session s1 moved from %s to %s at request %d with both proxies in the rotation", s1, p, i)
		}
	}
	// Session keys spread over both; each remembers its proxy.
	keys := map[string]string{}
	for i := range 40 {
		k := fmt.Sprintf("k%d", i)
		p, err := get(as("-session-" + k))
		if err != nil {
			t.Fatalf("session %s: %v", k, err)
		}
		keys[k] = p
	}

	// Wrong or no credentials: 407, counted.
	for _, u := range []*url.Userinfo{nil, url.UserPassword("alice", "wrong"), url.UserPassword("mallory", "alice-gateway-secret")} {
		code, _, _, err := gatewayGet(gwAddr, targetURL, u)
		if err != nil || code != http.StatusProxyAuthRequired {
			t.Errorf("as %v: %d %v, want 407", u, code, err)
		}
	}

	// The proxy of session s1 dies: its domain destroyed out of band.
	victim, survivor := s1, ids[0]
	if survivor == victim {
		survivor = ids[1]
	}
	virsh(t, "destroy", "pf-"+victim)
	killed := time.Now()
	var failures []string
	for i := range 30 {
		if _, err := get(alice); err != nil {
			failures = append(failures, fmt.Sprintf("request %d (%s after the destroy): %v", i, time.Since(killed).Round(time.Millisecond), err))
		}
	}
	p, err := get(as("-session-s1"))
	if err != nil || p != survivor {
		t.Errorf("session s1 after its proxy died: %q %v, want moved to %s", p, err, survivor)
	}
	for k, was := range keys {
		p, err := get(as("-session-" + k))
		switch {
		case err != nil:
			failures = append(failures, fmt.Sprintf("session %s: %v", k, err))
		case was == survivor && p != survivor:
			t.Errorf("session %s moved from %s, which stayed, to %s", k, survivor, p)
		case was == victim && p != survivor:
			t.Errorf("session %s of the dead %s went to %q, want %s", k, victim, p, survivor)
		}
	}
	if len(failures) > 0 {
		t.Fatalf("requests started after %s's domain was destroyed failed:\n%s", victim, strings.Join(failures, "\n"))
	}
	// The gateway reported it, and health probed it at once: it left
	// the rotation long before three rounds of probes had a chance.
	waitUntil(t, "health to probe the reported "+victim, 30*time.Second, func() bool {
		return logLineHas(filepath.Join(e.dir, "health.log"), "proxy reported: probing it now", victim)
	})
	waitUntil(t, victim+" out of the rotation", time.Minute, func() bool { return rot.lacks(victim) })

	// 200 reports of the healthy survivor: probed at most once per
	// interval, never removed.
	removedBefore := len(rot.removals())
	addr := rot.addrs()[survivor]
	const reports, probes = "proxyfleet_health_reports_total", "proxyfleet_probes_total"
	hm := scrape(t, e.healthHTTP)
	reports0, probed0, passed0 := value(hm, reports), value(hm, reports, "outcome", "probed"), value(hm, probes, "result", "ok")
	for i := range 200 {
		body, _ := json.Marshal(messages.Report{V: 1, ID: survivor, Addr: addr, Reason: fmt.Sprintf("flood %d", i), By: "test", At: time.Now()})
		if err := e.nc.Publish("proxy.report."+survivor, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Health has had its chance: it has taken the 200 reports, and the
	// probes they asked for have passed (a pass ends a report's probes;
	// only the survivor can pass) or the survivor has left; and what it
	// decided is published and read.
	waitUntil(t, "health to take the 200 reports and their probes to pass", time.Minute, func() bool {
		m := scrape(t, e.healthHTTP)
		probed := value(m, reports, "outcome", "probed") - probed0
		return value(m, reports)-reports0 >= 200 && (value(m, probes, "result", "ok")-passed0 >= probed || rot.lacks(survivor))
	})
	rot.caughtUp(t, 30*time.Second)
	for _, r := range rot.removals()[removedBefore:] {
		if strings.HasPrefix(r, survivor+" ") {
			t.Fatalf("200 reports of the healthy %s removed it: %v", survivor, rot.removals())
		}
	}
	if !rot.has(survivor) {
		t.Fatalf("%s left the rotation after 200 reports", survivor)
	}
	if _, err := get(alice); err != nil {
		t.Fatalf("after the reports: %v", err)
	}

	// An empty rotation: 503 with Retry-After and a body that says so.
	c := e.command("delete", survivor)
	e.waitDone(2*time.Minute, c)
	waitUntil(t, "an empty rotation", time.Minute, func() bool { return len(rot.addrs()) == 0 || onlyIDs(rot.addrs(), victim) })
	waitUntil(t, "the gateway to answer 503", 30*time.Second, func() bool {
		resp, err := throughAs(gwAddr, targetURL, alice)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" &&
			strings.Contains(string(b), "no proxy")
	})
	// The gateway counted its reports and retries.
	mfs := scrape(t, gwHTTP)
	if n := value(mfs, "proxyfleet_gateway_reports_total", "result", "ok"); n < 1 {
		t.Errorf("proxyfleet_gateway_reports_total{result=ok} = %v, want at least the report of %s", n, victim)
	}
	if n := value(mfs, "proxyfleet_gateway_auth_failures_total"); n < 3 {
		t.Errorf("proxyfleet_gateway_auth_failures_total = %v, want the 3 refused", n)
	}
}

// onlyIDs reports whether m holds nothing but ids (the dead proxy may be
// back in the rotation, re-created by the worker, by then).
func onlyIDs(m map[string]string, ids ...string) bool {
	for k := range m {
		found := false
		for _, id := range ids {
			found = found || k == id
		}
		if !found {
			return false
		}
	}
	return true
}

// logLineHas reports whether the log at path has a line holding every one
// of the strings.
func logLineHas(path string, all ...string) bool {
	for _, line := range readLogLines(path) {
		ok := true
		for _, s := range all {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			return true
		}
	}
	return false
}
