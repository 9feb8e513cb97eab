package console_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/client"
	"proxyfleet/console"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/runtest"
)

// After five failed logins from one source within a minute, a login from
// it is answered 429 with a Retry-After, even with the right password,
// which is not checked; the throttled logins are counted.
func TestLoginThrottled(t *testing.T) {
	ns := natstest.Start(t)
	r := &rig{t: t, url: ns.ClientURL()}
	c, err := client.New(r.connect(), "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := console.New(c, console.Config{Users: []console.User{{Name: "ops", Password: adminPW, Admin: true}}, Logger: quietLog(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, func(ctx context.Context) error { return srv.Serve(ctx, ln) }, srv.Started(), 10*time.Second)
	b := &browser{t: t, base: "http://" + ln.Addr().String(), hc: newJarClient()}
	for i := range 5 {
		resp, _ := b.do("POST", "/login", url.Values{"user": {"ops"}, "password": {"wrong-" + strconv.Itoa(i)}})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("failed login %d: %s, want 401", i+1, resp.Status)
		}
	}
	resp, body := b.do("POST", "/login", url.Values{"user": {"ops"}, "password": {adminPW}})
	if resp.StatusCode != http.StatusTooManyRequests || len(resp.Cookies()) != 0 {
		t.Fatalf("the right password after 5 failures: %s, cookies %v\n%s", resp.Status, resp.Cookies(), body)
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
		t.Fatalf("Retry-After %q, want 1 to 60 seconds", resp.Header.Get("Retry-After"))
	}
	if !strings.Contains(body, "too many failed logins") {
		t.Errorf("the page does not say why:\n%s", body)
	}
	if resp, _ := b.do("GET", "/", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a throttled login opened a session: GET / %s", resp.Status)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var throttled, refused float64
	for _, mf := range mfs {
		if mf.GetName() != "proxyfleet_console_logins_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "throttled" {
					throttled = m.GetCounter().GetValue()
				}
				if l.GetName() == "outcome" && l.GetValue() == "refused" {
					refused = m.GetCounter().GetValue()
				}
			}
		}
	}
	if throttled != 1 || refused != 5 {
		t.Fatalf("logins counted throttled %v refused %v, want 1 and 5", throttled, refused)
	}
}
