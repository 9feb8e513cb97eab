package gateway

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestSocksRepliesToSquidAnswers: squid's refusals of a CONNECT, as a
// Debian guest's squid 5.7 sent them (testdata/squid, recorded by
// cmd/proxyfleet's TestGatewayOverRealProxies/SocksRepliesFromRealSquid),
// give the SOCKS5 reply that says what happened: its deny acl
// (proxy.deny) and its guest acl, 2 (not allowed by ruleset); the
// target's refusal, 5.
// The same answers to an HTTP CONNECT are passed on as they came.
func TestSocksRepliesToSquidAnswers(t *testing.T) {
	for _, c := range []struct {
		file string
		want byte
	}{
		{"denied.txt", repNotAllowed},
		{"guest.txt", repNotAllowed},
		{"refused.txt", repConnRefused},
	} {
		t.Run(c.file, func(t *testing.T) {
			answer, err := os.ReadFile(filepath.Join("testdata", "squid", c.file))
			if err != nil {
				t.Fatal(err)
			}
			rec, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(answer)), &http.Request{Method: http.MethodConnect})
			if err != nil {
				t.Fatal(err)
			}
			// The proxy answers every CONNECT as squid did, and closes.
			up := newScriptProxy(t, func(c net.Conn, _ *seenRequest) bool {
				_, _ = c.Write(answer)
				return false
			})
			pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
			g := startGateway(t, pk, nil)
			if got := socksConnectRaw(t, g, socksAtypDomain, domain("t.example"), 443); got != c.want {
				t.Errorf("SOCKS5 reply %d to squid's %s %q, want %d", got, rec.Status, rec.Header.Get("X-Squid-Error"), c.want)
			}
			resp, conn, _ := g.connect(t, "t.example:443", basic("alice", alicePass), nil)
			conn.Close()
			if resp.StatusCode != rec.StatusCode || resp.Header.Get("X-Squid-Error") != rec.Header.Get("X-Squid-Error") {
				t.Errorf("CONNECT answered %s %q, want squid's %s %q", resp.Status, resp.Header.Get("X-Squid-Error"), rec.Status, rec.Header.Get("X-Squid-Error"))
			}
			if n := len(pk.gotReports()); n != 0 {
				t.Errorf("%d reports of a proxy whose answer spoke for the target", n)
			}
		})
	}
}

// TestSocksReplyFor: squid's error pages, by X-Squid-Error (the page and
// the guest's errno), map to SOCKS5 replies.
func TestSocksReplyFor(t *testing.T) {
	for se, want := range map[string]byte{
		"ERR_ACCESS_DENIED 0":       repNotAllowed,
		"ERR_FORWARDING_DENIED 0":   repNotAllowed,
		"ERR_CONNECT_FAIL 111":      repConnRefused,
		"ERR_CONNECT_FAIL 101":      repNetUnreachable,
		"ERR_CONNECT_FAIL 110":      repHostUnreachable,
		"ERR_CONNECT_FAIL 113":      repHostUnreachable,
		"ERR_DNS_FAIL 0":            repHostUnreachable,
		"ERR_CANNOT_FORWARD 0":      repHostUnreachable,
		"ERR_GATEWAY_FAILURE 0":     repGeneralFailure,
		"ERR_CONNECT_FAIL":          repHostUnreachable,
		"":                          repGeneralFailure,
		" ERR_ACCESS_DENIED 0 ":     repNotAllowed,
		"err_access_denied 0":       repGeneralFailure,
		"ERR_ACCESS_DENIED_EXTRA 0": repGeneralFailure,
	} {
		if got := socksReplyFor(&targetAnswer{squidError: se}); got != want {
			t.Errorf("X-Squid-Error %q: reply %d, want %d", se, got, want)
		}
	}
}
