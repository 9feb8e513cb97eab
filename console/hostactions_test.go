package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// Quarantining and releasing a host from the fleet page: an admin's take
// effect as host commands (the host's record, as `hosts` shows it, and the
// commands' answers in PROXY_RESULTS); a viewer's and a form without its
// CSRF token are refused, and change nothing.
func TestHostQuarantineAndReleaseActions(t *testing.T) {
	r := newRig(t)
	ctx := ctxFor(t, 2*time.Minute)
	viewer, admin := r.browser(), r.browser()
	viewer.login("viewer", viewerPW)
	admin.login("ops", adminPW)
	if _, body := viewer.do("GET", "/", nil); strings.Contains(body, "/actions/host/") {
		t.Errorf("the viewer's fleet page offers host actions:\n%s", body)
	}
	if _, body := admin.do("GET", "/", nil); !strings.Contains(body, `action="/actions/host/quarantine"`) {
		t.Fatalf("the admin's fleet page offers no quarantine:\n%s", body)
	}
	vtok, atok := viewer.csrf("/"), admin.csrf("/")
	with := func(v url.Values, csrf string) url.Values {
		out := url.Values{"csrf": {csrf}}
		for k, x := range v {
			out[k] = x
		}
		if csrf == "" {
			out.Del("csrf")
		}
		return out
	}
	quarantine := url.Values{"host": {"h1"}, "reason": {"disk swap"}}
	release := url.Values{"host": {"h1"}}
	for _, a := range []struct {
		path string
		form url.Values
	}{{"/actions/host/quarantine", quarantine}, {"/actions/host/release", release}} {
		if resp, body := viewer.do("POST", a.path, with(a.form, vtok)); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("viewer's %s: %s\n%s", a.path, resp.Status, body)
		}
		for _, tok := range []string{"", "x" + atok, vtok} {
			if resp, body := admin.do("POST", a.path, with(a.form, tok)); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("admin's %s with csrf %q: %s\n%s", a.path, tok, resp.Status, body)
			}
		}
	}
	hostState := func() client.HostInfo {
		hs, err := r.c.Hosts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if h.Host == "h1" {
				return h
			}
		}
		return client.HostInfo{}
	}
	if h := hostState(); h.State == messages.HostQuarantined {
		t.Fatalf("a refused quarantine was applied: %+v", h)
	}

	resp, body := admin.do("POST", "/actions/host/quarantine", with(quarantine, atok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "console-quarantine-") {
		t.Fatalf("admin's quarantine: %s\n%s", resp.Status, body)
	}
	poll.Until(t, "h1 quarantined", time.Minute, func() bool { return hostState().State == messages.HostQuarantined })
	if h := hostState(); h.Reason != "operator console ops: disk swap" || !h.Until.IsZero() {
		t.Errorf("h1 after the console's quarantine: %+v", h)
	}
	if _, body := admin.do("GET", "/", nil); !strings.Contains(body, `action="/actions/host/release"`) || !strings.Contains(body, "operator console ops: disk swap") {
		t.Errorf("the fleet page of a quarantined h1 offers no release or shows no reason:\n%s", body)
	}
	if resp, body := admin.do("POST", "/actions/host/quarantine", with(url.Values{"host": {"H 1"}}, atok)); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a quarantine of a bad host name: %s\n%s", resp.Status, body)
	}

	resp, body = admin.do("POST", "/actions/host/release", with(release, atok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "console-release-") {
		t.Fatalf("admin's release: %s\n%s", resp.Status, body)
	}
	poll.Until(t, "h1 released", time.Minute, func() bool { return hostState().State == messages.HostOK })

	// Both commands were answered on the results like any other.
	answers := map[string]bool{}
	poll.Until(t, "the host commands' answers in PROXY_RESULTS", time.Minute, func() bool {
		cons, err := r.js.OrderedConsumer(ctx, messages.StreamResults, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{r.c.Subjects().HostResult("h1")}})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var x messages.Result
			if json.Unmarshal(m.Data(), &x) == nil && strings.HasPrefix(x.CommandID, "console-") {
				answers[x.Op+" "+x.Outcome] = true
			}
		}
		return answers[messages.OpHostQuarantine+" done"] && answers[messages.OpHostRelease+" done"]
	})
}
