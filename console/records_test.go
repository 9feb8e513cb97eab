package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"proxyfleet/client"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// The refused, bans and dead pages: shown only after a login, linked
// from every page, each counting what `list` (its CHECK column), `ban
// ls` and `dead ls` print.
func TestRecordPages(t *testing.T) {
	r := newRig(t)
	r.createRunning(4)
	r.seedRecords("p-0001", "p-0003")
	b := r.browser()
	for _, p := range []string{"/refused", "/bans", "/dead"} {
		resp, body := b.do("GET", p, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" || strings.Contains(body, "p-0001") {
			t.Errorf("GET %s before login: %s to %q", p, resp.Status, resp.Header.Get("Location"))
		}
	}
	b.login("viewer", viewerPW)
	_, fleet := b.do("GET", "/", nil)
	for _, p := range []string{"/refused", "/bans", "/dead"} {
		if !strings.Contains(fleet, `<a href="`+p+`"`) {
			t.Errorf("the layout does not link %s", p)
		}
	}
	want := strconv.Itoa(r.refusedCount())
	if want != "2" {
		t.Fatalf("list shows %s refused, want the 2 seeded", want)
	}
	// Verdicts reach the view at its next read.
	var body string
	poll.Until(t, "the refused page counting what list does", 30*time.Second, func() bool {
		_, body = b.do("GET", "/refused", nil)
		return countOf(body, "refused-count") == want
	})
	for _, id := range []string{"p-0001", "p-0003"} {
		if !strings.Contains(body, `data-id="`+id+`"`) {
			t.Errorf("the refused page does not show %s:\n%s", id, body)
		}
	}
	if !strings.Contains(body, "answered a request without credentials") || strings.Contains(body, `data-id="p-0000"`) {
		t.Errorf("the refused page: reasons or rows wrong:\n%s", body)
	}
	_, body = b.do("GET", "/bans", nil)
	if got, want := countOf(body, "ban-count"), strconv.Itoa(r.banCount()); got != want || got != "3" || countOf(body, "ban-sites") != "2" {
		t.Errorf("the bans page counts %s bans over %s sites, ban ls %s:\n%s", got, countOf(body, "ban-sites"), want, body)
	}
	if !strings.Contains(body, `data-site="shop.example"`) || !strings.Contains(body, "captcha wall") {
		t.Errorf("the bans page by site:\n%s", body)
	}
	_, body = b.do("GET", "/bans?site=www.shop.example", nil)
	if got := countOf(body, "ban-count"); got != "2" {
		t.Errorf("the bans of shop.example: %s, want 2", got)
	}
	resp, body := b.do("GET", "/dead", nil)
	if got, want := countOf(body, "dead-count"), strconv.Itoa(r.deadCount()); resp.StatusCode != http.StatusOK || got != want || got != "2" {
		t.Errorf("the dead page counts %s, dead ls %s:\n%s", got, want, body)
	}
	if !strings.Contains(body, "c-dead-1") || !strings.Contains(body, "host unreachable") {
		t.Errorf("the dead page:\n%s", body)
	}
}

// Setting a pool's size and adding and lifting a ban: an admin's take
// effect (the pool's record, the bans health stores); a viewer's and a
// form without its CSRF token are refused, and change nothing.
func TestPoolSizeAndBanActions(t *testing.T) {
	r := newRig(t)
	r.startPools()
	r.startHealth()
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := r.c.PoolSet(ctx, messages.PoolSet{Name: "web", Size: 1, MaxAge: messages.Duration(time.Hour)}, "c-pool-web", false); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "pool web's record", time.Minute, func() bool {
		p, err := r.c.Pool(ctx, "web")
		return err == nil && p.Record.Size == 1
	})
	viewer, admin := r.browser(), r.browser()
	viewer.login("viewer", viewerPW)
	admin.login("ops", adminPW)
	vtok, atok := viewer.csrf("/pools"), admin.csrf("/pools")
	ban := url.Values{"address": {"198.18.9.9"}, "site": {"www.shop.example"}, "for": {"30m"}, "reason": {"from the console"}}
	with := func(v url.Values, csrf string) url.Values {
		out := url.Values{}
		for k, x := range v {
			out[k] = x
		}
		if csrf != "" {
			out.Set("csrf", csrf)
		}
		return out
	}
	size := url.Values{"pool": {"web"}, "size": {"3"}}
	lift := url.Values{"address": {"198.18.9.9"}, "site": {"shop.example"}}
	for _, a := range []struct {
		path string
		form url.Values
	}{{"/actions/pool/size", size}, {"/actions/ban/add", ban}, {"/actions/ban/remove", lift}} {
		if resp, body := viewer.do("POST", a.path, with(a.form, vtok)); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("viewer's %s: %s\n%s", a.path, resp.Status, body)
		}
		for _, tok := range []string{"", "x" + atok, vtok} {
			if resp, body := admin.do("POST", a.path, with(a.form, tok)); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("admin's %s with csrf %q: %s\n%s", a.path, tok, resp.Status, body)
			}
		}
	}
	if p, err := r.c.Pool(ctx, "web"); err != nil || p.Record.Size != 1 {
		t.Fatalf("a refused size was applied: %+v %v", p.Record, err)
	}
	if n := r.banCount(); n != 0 {
		t.Fatalf("a refused ban was stored: %d bans", n)
	}

	// The admin's: the pool's size follows, its other settings kept.
	resp, body := admin.do("POST", "/actions/pool/size", with(size, atok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "console-size-") {
		t.Fatalf("admin's size: %s\n%s", resp.Status, body)
	}
	poll.Until(t, "pool web at size 3", time.Minute, func() bool {
		p, err := r.c.Pool(ctx, "web")
		return err == nil && p.Record.Size == 3
	})
	if p, _ := r.c.Pool(ctx, "web"); p.Record.MaxAge.D() != time.Hour || p.Record.MinReady != 3 {
		t.Errorf("pool web after the size: max_age %s min_ready %d, want 1h and 3", p.Record.MaxAge.D(), p.Record.MinReady)
	}
	if resp, body := admin.do("POST", "/actions/pool/size", with(url.Values{"pool": {"web"}, "size": {"-1"}}, atok)); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a size of -1: %s\n%s", resp.Status, body)
	}

	// A ban added, seen as `ban ls` sees it, then lifted.
	resp, body = admin.do("POST", "/actions/ban/add", with(ban, atok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "banned 198.18.9.9 for shop.example") {
		t.Fatalf("admin's ban: %s\n%s", resp.Status, body)
	}
	bs, err := r.c.Bans(ctx, client.BanFilter{Site: "shop.example"})
	if err != nil || len(bs) != 1 || bs[0].Address != "198.18.9.9" || bs[0].By != "console:ops" || bs[0].Reason != "from the console" {
		t.Fatalf("bans after the console's: %+v %v", bs, err)
	}
	if _, body := admin.do("GET", "/bans", nil); countOf(body, "ban-count") != "1" {
		t.Errorf("the bans page after a ban:\n%s", body)
	}
	if resp, body := admin.do("POST", "/actions/ban/add", with(url.Values{"address": {"nope"}, "site": {"shop.example"}, "for": {"1h"}}, atok)); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a ban of no address: %s\n%s", resp.Status, body)
	}
	resp, body = admin.do("POST", "/actions/ban/remove", with(lift, atok))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "lifted") {
		t.Fatalf("admin's lift: %s\n%s", resp.Status, body)
	}
	if n := r.banCount(); n != 0 {
		t.Fatalf("%d bans after the lift", n)
	}
}
