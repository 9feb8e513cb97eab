package console_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"proxyfleet/client"
	"proxyfleet/console"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// Nothing of the fleet is served before a login: pages go to the login
// page, the live stream and the actions are refused.
func TestNothingBeforeLogin(t *testing.T) {
	r := newRig(t)
	r.createRunning(3)
	b := r.browser()
	for _, p := range []string{"/", "/proxies", "/pools", "/proxies?host=h1", "/nope"} {
		resp, body := b.do("GET", p, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("GET %s before login: %s to %q", p, resp.Status, resp.Header.Get("Location"))
		}
		if strings.Contains(body, "p-0000") {
			t.Errorf("GET %s before login shows a proxy: %s", p, body)
		}
	}
	if resp, _ := b.do("GET", "/events", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /events before login: %s, want 401", resp.Status)
	}
	for _, p := range []string{"/actions/pool/recycle", "/actions/proxy/create", "/actions/proxy/delete"} {
		if resp, _ := b.do("POST", p, url.Values{"pool": {"web"}, "id": {"x1"}}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s before login: %s, want 401", p, resp.Status)
		}
	}
	if resp, body := b.do("GET", "/login", nil); resp.StatusCode != http.StatusOK || strings.Contains(body, "p-0000") {
		t.Errorf("GET /login: %s", resp.Status)
	}
	// A wrong password, and an unknown user, are refused alike.
	for _, up := range [][2]string{{"ops", "wrong"}, {"nobody", adminPW}, {"ops", ""}} {
		resp, body := b.do("POST", "/login", url.Values{"user": {up[0]}, "password": {up[1]}})
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "wrong user or password") || len(resp.Cookies()) != 0 {
			t.Errorf("login %q/%q: %s, cookies %v", up[0], up[1], resp.Status, resp.Cookies())
		}
	}
	if resp, _ := b.do("GET", "/proxies", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /proxies after refused logins: %s", resp.Status)
	}
}

// The session cookie is HttpOnly and SameSite=Strict (and not Secure
// over plain HTTP); logging out ends the session.
func TestSessionCookie(t *testing.T) {
	r := newRig(t)
	b := r.browser()
	resp, _ := b.do("POST", "/login", url.Values{"user": {"viewer"}, "password": {viewerPW}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s", resp.Status)
	}
	cs := resp.Cookies()
	if len(cs) != 1 || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Secure || len(cs[0].Value) < 40 {
		t.Fatalf("session cookie: %+v", cs)
	}
	if resp, body := b.do("GET", "/", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="hosts"`) || !strings.Contains(body, "h1") {
		t.Fatalf("fleet page: %s\n%s", resp.Status, body)
	}
	tok := b.csrf("/")
	// Logging out needs the token too.
	if resp, _ := b.do("POST", "/logout", url.Values{}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("logout without csrf: %s", resp.Status)
	}
	if resp, _ := b.do("POST", "/logout", url.Values{"csrf": {tok}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %s", resp.Status)
	}
	// The old cookie is no good any more either.
	c2 := r.browser()
	u, _ := url.Parse(r.base)
	c2.hc.Jar.SetCookies(u, cs)
	if resp, _ := c2.do("GET", "/proxies", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the logged-out session still serves: %s", resp.Status)
	}
}

// The proxies page counts what list counts, with each filter, and pages
// them PageSize at a time.
func TestProxiesPage(t *testing.T) {
	r := newRig(t)
	n := console.PageSize + 50
	r.createRunning(n)
	b := r.browser()
	b.login("viewer", viewerPW)
	for _, c := range []struct {
		path string
		opts []client.ListOption
	}{
		{"/proxies", nil},
		{"/proxies?host=h1", []client.ListOption{client.OnHost("h1")}},
		{"/proxies?state=running", []client.ListOption{client.InState(messages.StateRunning)}},
		{"/proxies?state=failed", []client.ListOption{client.InState(messages.StateFailed)}},
		{"/proxies?pool=none", []client.ListOption{client.WithLabel(messages.PoolLabel, "none")}},
	} {
		if got, want := b.proxyCount(c.path), strconv.Itoa(r.listCount(c.opts...)); got != want {
			t.Errorf("%s counts %s, list %s", c.path, got, want)
		}
	}
	_, first := b.do("GET", "/proxies", nil)
	_, second := b.do("GET", "/proxies?page=2", nil)
	if got := strings.Count(first, "<tr data-id="); got != console.PageSize {
		t.Errorf("page 1 shows %d rows, want %d", got, console.PageSize)
	}
	if got := strings.Count(second, "<tr data-id="); got != n-console.PageSize {
		t.Errorf("page 2 shows %d rows, want %d", got, n-console.PageSize)
	}
	if !strings.Contains(first, `data-id="p-0000"`) || !strings.Contains(second, fmt.Sprintf(`data-id="p-%04d"`, n-1)) {
		t.Errorf("rows not in id order over the pages")
	}
	if resp, _ := b.do("GET", "/proxies?state=bogus", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a bad state: %s, want 400", resp.Status)
	}

	// Deleted proxies leave the list and show under state=deleted, each
	// combination of filters counting what list counts.
	ctx := ctxFor(t, time.Minute)
	for _, id := range []string{"p-0003", "p-0004", "p-0010"} {
		if _, err := r.c.Delete(ctx, id, "d-"+id, false); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "three proxies deleted", time.Minute, func() bool {
		return r.listCount(client.InState(messages.StateDeleted), client.IncludeDeleted()) == 3
	})
	cases := []struct {
		path string
		opts []client.ListOption
	}{
		{"/proxies", nil},
		{"/proxies?state=deleted", []client.ListOption{client.InState(messages.StateDeleted), client.IncludeDeleted()}},
		{"/proxies?state=deleted&host=h1", []client.ListOption{client.InState(messages.StateDeleted), client.IncludeDeleted(), client.OnHost("h1")}},
		{"/proxies?state=running&host=h1", []client.ListOption{client.InState(messages.StateRunning), client.OnHost("h1")}},
		{"/proxies?host=h2&pool=none", []client.ListOption{client.OnHost("h2"), client.WithLabel(messages.PoolLabel, "none")}},
	}
	// The state events reach the view at once: the list follows without
	// waiting for its next read.
	for _, c := range cases {
		want := strconv.Itoa(r.listCount(c.opts...))
		poll.Until(t, c.path+" counting "+want, 30*time.Second, func() bool { return b.proxyCount(c.path) == want })
	}
	if _, body := b.do("GET", "/proxies?state=deleted", nil); !strings.Contains(body, `data-id="p-0010"`) {
		t.Errorf("a deleted proxy is not under state=deleted:\n%s", body)
	}
}

// Actions: refused without the CSRF token and to a read-only user;
// an admin's pool recycle is published as the ordinary pool command.
func TestActions(t *testing.T) {
	r := newRig(t)
	viewer := r.browser()
	viewer.login("viewer", viewerPW)
	vtok := viewer.csrf("/pools")
	resp, body := viewer.do("POST", "/actions/pool/recycle", url.Values{"csrf": {vtok}, "pool": {"web"}})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Fatalf("viewer's recycle: %s\n%s", resp.Status, body)
	}
	admin := r.browser()
	admin.login("ops", adminPW)
	atok := admin.csrf("/pools")
	for _, form := range []url.Values{{"pool": {"web"}}, {"pool": {"web"}, "csrf": {"x" + atok}}, {"pool": {"web"}, "csrf": {vtok}}} {
		resp, body := admin.do("POST", "/actions/pool/recycle", form)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "CSRF") {
			t.Fatalf("recycle with csrf %q: %s\n%s", form.Get("csrf"), resp.Status, body)
		}
	}
	st, err := r.js.Stream(ctxFor(t, 10*time.Second), messages.StreamPoolCommands)
	if err != nil {
		t.Fatal(err)
	}
	subj := messages.NewSubjects("").PoolCommand(messages.OpPoolRecycle, "web")
	if _, err := st.GetLastMsgForSubject(ctxFor(t, 10*time.Second), subj); err == nil {
		t.Fatalf("a refused recycle was published")
	}
	resp, body = admin.do("POST", "/actions/pool/recycle", url.Values{"csrf": {atok}, "pool": {"web"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="action-result"`) {
		t.Fatalf("admin's recycle: %s\n%s", resp.Status, body)
	}
	m, err := st.GetLastMsgForSubject(ctxFor(t, 10*time.Second), subj)
	if err != nil {
		t.Fatalf("the recycle command is not in %s: %v", messages.StreamPoolCommands, err)
	}
	if id := m.Header.Get("Nats-Msg-Id"); !strings.HasPrefix(id, "console-recycle-") || !strings.Contains(body, id) || !strings.Contains(string(m.Data), `"all":true`) {
		t.Fatalf("recycle command %s %s; page:\n%s", id, m.Data, body)
	}
	// Create and delete, by the admin, reach the worker as any command.
	resp, body = admin.do("POST", "/actions/proxy/create", url.Values{"csrf": {atok}, "id": {"made-here"}, "host": {"h2"}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create: %s\n%s", resp.Status, body)
	}
	waitState(t, r, "made-here", messages.StateRunning)
	if resp, body := admin.do("POST", "/actions/proxy/create", url.Values{"csrf": {atok}, "id": {"Bad_ID"}}); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `id="action-error"`) {
		t.Fatalf("create a bad id: %s\n%s", resp.Status, body)
	}
	if resp, body := admin.do("POST", "/actions/proxy/delete", url.Values{"csrf": {atok}, "id": {"made-here"}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("delete: %s\n%s", resp.Status, body)
	}
	waitState(t, r, "made-here", messages.StateDeleted)
}

func waitState(t *testing.T, r *rig, id, state string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := r.c.Get(ctxFor(t, 10*time.Second), id)
		if err == nil && st.State() == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not %s within a minute: %+v %v", id, state, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The live stream sends a proxy created after the page was rendered,
// and ends when its client goes.
func TestEventsStream(t *testing.T) {
	r := newRig(t)
	r.createRunning(2)
	b := r.browser()
	b.login("viewer", viewerPW)
	var since string
	poll.Until(t, "the page's position in the events", 30*time.Second, func() bool {
		since = b.since("/proxies")
		return since != "0"
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", r.base+"/events?since="+since, nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("/events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	if _, err := r.c.Create(ctx, messages.CreateCommand{ID: "live-1", Host: "h1"}, "c-live-1", false); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
			if event == "reload" {
				t.Fatalf("the stream asked a reload of a page it should follow")
			}
		case strings.HasPrefix(line, "data: ") && event == "proxy" && strings.Contains(line, `"id":"live-1"`) && strings.Contains(line, `"state":"running"`):
			return
		}
	}
	t.Fatalf("the stream ended without live-1 running: %v", sc.Err())
}
