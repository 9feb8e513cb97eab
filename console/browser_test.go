package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"proxyfleet/console"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/pool"
)

// browserProxies is the sim fleet the browser test looks at.
const browserProxies = 2000

// chromium finds the browser (Debian's package, which make test's set-up
// installs: deploy/testhost/lib.sh); without it the test fails, never
// skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: install Debian's package chromium (`make test` does, deploy/testhost/lib.sh)")
	return ""
}

// screenshotDir is bin/ at the module's root, where the test writes a
// screenshot of each page.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../bin/console-screenshots")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startPools runs a pool controller over the rig's hosts, so that pools
// have records and their commands answers.
func (r *rig) startPools() {
	r.t.Helper()
	var hs []pool.Host
	for _, h := range hosts {
		hs = append(hs, pool.Host{Name: h, MaxProxies: 1000})
	}
	c, err := pool.New(r.connect(), pool.Config{
		Subjects: messages.NewSubjects(""), ID: "pools-1", Hosts: hs, Images: []string{"img"}, DefaultImage: "img",
		Interval: 200 * time.Millisecond, LeaseTTL: time.Second, BackoffInitial: 500 * time.Millisecond, BackoffMax: 2 * time.Second,
		CheckInterval: 200 * time.Millisecond, Logger: quietLog(),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	runtest.Start(r.t, c.Run, c.Started(), time.Minute)
}

// The console in a real browser: log in, the proxies page counts what
// list counts, a proxy created through the client appears without a
// reload, a pool recycled from the page has its command answered, an
// action as a viewer and a POST without the CSRF token are refused.
// Each page's screenshot (PNG) goes under bin/console-screenshots/.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	shots := screenshotDir(t)
	gw := reserveGateway(t)
	r := newRig(t, func(c *console.Config) {
		c.Gateways = []string{gw.opsURL}
		c.GatewayInterval = 200 * time.Millisecond
	})
	r.startPools()
	// Health puts the sim proxies in the rotation as they run; the
	// gateway follows it.
	r.startHealth()
	gw.start(r)
	r.createRunning(browserProxies)
	if _, err := r.c.PoolSet(ctxFor(t, 30*time.Second), messages.PoolSet{Name: "web", Size: 2}, "c-pool-web", false); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string { t.Helper(); return get(t, ctx, sel, chromedp.Text(chromedp.CSS(sel))) }
	eval := func(what, expr string) bool { t.Helper(); return get(t, ctx, what, chromedp.Evaluate[bool](expr)) }
	shot := func(name string) {
		t.Helper()
		png := get(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	login := func(user, pw string) {
		t.Helper()
		run("log in as "+user,
			chromedp.Navigate(r.base+"/proxies"),
			chromedp.WaitVisible(chromedp.CSS(`#login`)),
			chromedp.SendKeys(chromedp.CSS(`#user`), user),
			chromedp.SendKeys(chromedp.CSS(`#password`), pw),
			chromedp.Click(chromedp.CSS(`#login`)),
			chromedp.WaitVisible(chromedp.CSS(`#hosts`)))
	}

	// Before a login: the login page, nothing of the fleet.
	run("the login page", chromedp.Navigate(r.base+"/proxies"), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	loginText := text(`body`)
	if strings.Contains(loginText, "p-0000") {
		t.Fatalf("the login page shows the fleet: %s", loginText)
	}
	shot("login")

	login("ops", adminPW)
	hostCount := text(`#host-count`)
	if hostCount != strconv.Itoa(len(hosts)) {
		t.Errorf("the fleet page counts %s hosts, want %d", hostCount, len(hosts))
	}
	shot("fleet")

	// The proxies page counts what list counts.
	run("the proxies page", chromedp.Navigate(r.base+"/proxies"), chromedp.WaitVisible(chromedp.CSS(`#proxies`)))
	count := text(`#proxy-count`)
	if want := strconv.Itoa(r.listCount()); count != want {
		t.Fatalf("the proxies page counts %s, list %s", count, want)
	}
	// Live: the stream is open, then a proxy created through the client
	// appears without a reload.
	get(t, ctx, "the live stream", chromedp.Poll[bool](`document.getElementById("live").textContent === "live"`, chromedp.WithPollingTimeout(time.Minute)))
	eval("mark the page", `window.notReloaded = true`)
	created := time.Now()
	if _, err := r.c.Create(ctxFor(t, 30*time.Second), messages.CreateCommand{ID: "a-live", Host: "h1"}, "c-a-live", false); err != nil {
		t.Fatal(err)
	}
	get(t, ctx, "the new proxy's row", chromedp.Poll[bool](`(function(){var tr=document.querySelector('tr[data-id="a-live"]'); return !!tr && tr.children[1].textContent === "running";})()`,
		chromedp.WithPollingTimeout(time.Minute)))
	// The time is reported, not asserted (the minute above bounds a hang).
	t.Logf("a proxy created through the client showed running on the open page %s after its create was sent", time.Since(created).Round(time.Millisecond))
	if !eval("the page was not reloaded", `window.notReloaded === true`) {
		t.Fatal("the page reloaded to show the new proxy")
	}
	count = text(`#proxy-count`)
	if want := strconv.Itoa(r.listCount()); count != want {
		t.Errorf("after the live row the page counts %s, list %s", count, want)
	}
	shot("proxies")

	// The rotation's chart: its size is what `rotation` counts, and a
	// proxy that enters shows without a reload, as a size and an entry.
	run("the rotation page", chromedp.Navigate(r.base+"/rotation"), chromedp.WaitVisible(chromedp.CSS(`#rotation-chart`)))
	get(t, ctx, "the rotation's live stream", chromedp.Poll[bool](`document.getElementById("live").textContent === "live"`, chromedp.WithPollingTimeout(time.Minute)))
	rotWant := r.rotationCount()
	poll.Until(t, "the chart's size to be what rotation counts", time.Minute, func() bool {
		rotWant = r.rotationCount()
		return text(`#rotation-now`) == strconv.Itoa(rotWant)
	})
	if rotWant <= browserProxies {
		t.Errorf("rotation counts %d, want the %d running proxies and more", rotWant, browserProxies)
	}
	entries, _ := strconv.Atoi(text(`#rotation-entries`))
	eval("mark the rotation page", `window.notReloaded = true`)
	if _, err := r.c.Create(ctxFor(t, 30*time.Second), messages.CreateCommand{ID: "a-chart", Host: "h2"}, "c-a-chart", false); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the chart to show the new proxy in the rotation", time.Minute, func() bool {
		rot, err := r.c.Rotation(ctxFor(t, 30*time.Second))
		if err != nil || !slices.ContainsFunc(rot.Proxies, func(e messages.RotationEntry) bool { return e.ID == "a-chart" }) {
			return false
		}
		return text(`#rotation-now`) == strconv.Itoa(r.rotationCount())
	})
	if n, _ := strconv.Atoi(text(`#rotation-entries`)); n < entries+1 {
		t.Errorf("entries over the hour: %d before a-chart entered, %d after", entries, n)
	}
	if !eval("the rotation page was not reloaded", `window.notReloaded === true`) {
		t.Fatal("the rotation page reloaded to show the new proxy")
	}
	if !eval("a size line and an entry bar", `document.getElementById("rotation-size-path").getAttribute("d").startsWith("M") && document.getElementById("rotation-entry-path").getAttribute("d").startsWith("M")`) {
		t.Errorf("the chart draws no size line or no entry bar")
	}
	shot("rotation")

	// The traffic page counts the requests sent through the gateway, by
	// outcome, as they are sent: three with a wrong password (auth), two
	// to a destination the gateway refuses (denied, loopback).
	run("the traffic page", chromedp.Navigate(r.base+"/traffic"), chromedp.WaitVisible(chromedp.CSS(`#traffic`)))
	for range 3 {
		if code := gw.send(t, "wrong-password", "http://198.18.0.1/"); code != http.StatusProxyAuthRequired {
			t.Fatalf("a wrong password: %d", code)
		}
	}
	for range 2 {
		if code := gw.send(t, gatewayPW, "http://127.0.0.1:9/"); code != http.StatusForbidden {
			t.Fatalf("a denied destination: %d", code)
		}
	}
	if a, d := gw.requests(t, "auth"), gw.requests(t, "denied"); a != 3 || d != 2 {
		t.Fatalf("the gateway counts auth %d, denied %d; want 3, 2", a, d)
	}
	cell := func(row, outcome string) string {
		return `(function(){var c=document.querySelector('` + row + ` td[data-outcome="` + outcome + `"]'); return c ? c.textContent : "";})()`
	}
	gwRow := `tr[data-gateway="` + gw.opsURL + `"]`
	get(t, ctx, "the traffic page to count the requests", chromedp.Poll[bool](
		cell(gwRow, "auth")+` === "3" && `+cell(gwRow, "denied")+` === "2" && `+cell(`#traffic-sum`, "auth")+` === "3"`,
		chromedp.WithPollingTimeout(time.Minute)))
	if got := text(`#traffic-total`); got != "5" {
		t.Errorf("the traffic page counts %s requests in all, want 5", got)
	}
	shot("traffic")

	// Refused proxies, bans by site and dead letters count what list,
	// ban ls and dead ls print.
	r.seedRecords("p-0002", "p-0005", "p-0007")
	refused := strconv.Itoa(r.refusedCount())
	// Verdicts reach the console's view at its next read: wait for it
	// over HTTP, then look in the browser.
	hb := r.browser()
	hb.login("viewer", viewerPW)
	poll.Until(t, "the refused page counting what list does", time.Minute, func() bool {
		_, body := hb.do("GET", "/refused", nil)
		return countOf(body, "refused-count") == refused
	})
	run("the refused page", chromedp.Navigate(r.base+"/refused"), chromedp.WaitVisible(chromedp.CSS(`#refused`)))
	if got := text(`#refused-count`); got != refused || refused != "3" {
		t.Errorf("the refused page counts %s, list %s", got, refused)
	}
	shot("refused")
	run("the bans page", chromedp.Navigate(r.base+"/bans"), chromedp.WaitVisible(chromedp.CSS(`#bans`)))
	if got, want := text(`#ban-count`), strconv.Itoa(r.banCount()); got != want {
		t.Errorf("the bans page counts %s, ban ls %s", got, want)
	}
	shot("bans")
	run("the dead letters page", chromedp.Navigate(r.base+"/dead"), chromedp.WaitVisible(chromedp.CSS(`#dead`)))
	if got, want := text(`#dead-count`), strconv.Itoa(r.deadCount()); got != want {
		t.Errorf("the dead letters page counts %s, dead ls %s", got, want)
	}
	shot("dead")

	// A pool recycled from the page: its command is answered.
	run("the pools page", chromedp.Navigate(r.base+"/pools"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-pool="web"] button.recycle`)))
	// Its size, live and ready counts are what `pool ls` prints once the
	// pool is ready (the page is read again until then).
	poll.Until(t, "the pools page to count what pool ls counts, the pool ready", time.Minute, func() bool {
		ps, err := r.c.Pools(ctxFor(t, 30*time.Second))
		if err != nil || len(ps) != 1 || ps[0].Record.Name != "web" {
			return false
		}
		sm := ps[0].Summary
		want := fmt.Sprintf("%d %d %d", sm.Size, sm.Live, sm.Ready)
		run("the pools page again", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`tr[data-pool="web"] button.recycle`)))
		row := get(t, ctx, "the web row", chromedp.Evaluate[string](`(function(){var c=document.querySelector('tr[data-pool="web"]').children; return c[1].textContent+" "+c[2].textContent+" "+c[3].textContent;})()`))
		return row == want && sm.Ready == sm.Size
	})
	shot("pools")
	run("recycle web", chromedp.Click(chromedp.CSS(`tr[data-pool="web"] button.recycle`)),
		chromedp.WaitVisible(chromedp.CSS(`#action-result`)))
	result := text(`#action-result`)
	shot("recycled")
	cmdID := strings.Fields(strings.TrimPrefix(result, "Sent: command "))[0]
	cmdID = strings.TrimSuffix(cmdID, ",")
	if !strings.HasPrefix(cmdID, "console-recycle-") {
		t.Fatalf("the result page: %q", result)
	}
	waitPoolResult(t, r, "web", cmdID)

	// A POST without the CSRF token is refused.
	run("the pools page again", chromedp.Navigate(r.base+"/pools"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-pool="web"] button.recycle`)))
	eval("clear the tokens", `(function(){document.querySelectorAll('input[name="csrf"]').forEach(function(e){e.value=""}); return true;})()`)
	run("a form without its token", chromedp.Click(chromedp.CSS(`tr[data-pool="web"] button.recycle`)),
		chromedp.WaitVisible(chromedp.CSS(`#error`)))
	refusedText := text(`#error`)
	if !strings.Contains(refusedText, "CSRF") {
		t.Fatalf("without the token: %q", refusedText)
	}
	shot("refused-csrf")

	// A viewer sees no actions, and a form posted anyway is refused.
	run("log out", chromedp.Click(chromedp.CSS(`form.logout button`)), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	login("viewer", viewerPW)
	run("the pools page as viewer", chromedp.Navigate(r.base+"/pools"), chromedp.WaitVisible(chromedp.CSS(`tr[data-pool="web"]`)))
	if !eval("no recycle buttons", `document.querySelectorAll("button.recycle").length === 0`) {
		t.Fatalf("a viewer is offered recycle buttons")
	}
	eval("a viewer's recycle", `(function(){
		var f=document.createElement("form"); f.method="post"; f.action="/actions/pool/recycle";
		[["csrf", document.querySelector('form.logout input[name="csrf"]').value], ["pool","web"]].forEach(function(kv){
			var i=document.createElement("input"); i.type="hidden"; i.name=kv[0]; i.value=kv[1]; f.appendChild(i);});
		document.body.appendChild(f); f.submit(); return true;})()`)
	run("the viewer's refusal", chromedp.WaitVisible(chromedp.CSS(`#error`)))
	refusedText = text(`#error`)
	if !strings.Contains(refusedText, "read-only") {
		t.Fatalf("a viewer's recycle: %q", refusedText)
	}
	shot("refused-viewer")
}

// get runs a in the browser of ctx and returns its value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// waitPoolResult waits for the pool controller's answer to the command
// cmdID on pool name, in the results stream (as `pool recycle --wait`
// reads it).
func waitPoolResult(t *testing.T, r *rig, name, cmdID string) {
	t.Helper()
	subj := messages.NewSubjects("").PoolResult(name)
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := r.js.Stream(ctxFor(t, 10*time.Second), messages.StreamResults)
		if err == nil {
			if m, err := st.GetLastMsgForSubject(ctxFor(t, 10*time.Second), subj); err == nil && strings.Contains(string(m.Data), cmdID) {
				t.Logf("pool %s answered: %s", name, m.Data)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result of %s on %s within a minute", cmdID, subj)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
