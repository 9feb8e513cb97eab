package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/console"
	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The users every rig's console has.
const (
	adminPW  = "ops-secret-1"
	viewerPW = "viewer-secret-1"
)

// rig is an embedded nats-server with the topology, a worker on the sim
// hosts h1 and h2, a client, and a console on a loopback port.
type rig struct {
	t    *testing.T
	url  string
	js   jetstream.JetStream
	c    *client.Client
	base string // the console's http://127.0.0.1:PORT
}

var hosts = []string{"h1", "h2", "h3"}

func newRig(t *testing.T, opts ...func(*console.Config)) *rig {
	t.Helper()
	r := &rig{t: t, url: natstest.Start(t).ClientURL()}
	js, err := jetstream.New(r.connect())
	if err != nil {
		t.Fatal(err)
	}
	r.js = js
	r.startWorker()
	c, err := client.New(r.connect(), "")
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	cfg := console.Config{
		Users:       []console.User{{Name: "ops", Password: adminPW, Admin: true}, {Name: "viewer", Password: viewerPW}},
		ViewRefresh: 250 * time.Millisecond, // health's verdicts show soon
		Logger:      quietLog(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := console.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.base = "http://" + ln.Addr().String()
	runtest.Start(t, func(ctx context.Context) error { return srv.Serve(ctx, ln) }, srv.Started(), 10*time.Second)
	return r
}

// connect returns a connection closed when the test ends.
func (r *rig) connect() *nats.Conn {
	r.t.Helper()
	nc, err := nats.Connect(r.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		r.t.Fatalf("connect: %v", err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

func (r *rig) startWorker() {
	t := r.t
	js, err := jetstream.New(r.connect())
	if err != nil {
		t.Fatal(err)
	}
	providers := map[string]worker.Provider{}
	for _, h := range hosts {
		drv, err := sim.New(sim.Config{Host: h, Dir: t.TempDir(), Delay: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		providers[h] = drv
	}
	cfg := worker.Config{
		Subjects:  messages.NewSubjects(""),
		Catalog:   worker.Catalog{Hosts: hosts, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128},
		Providers: providers,
		AckWait:   5 * time.Second, MaxAttempts: 5,
		ReadyTimeout: 10 * time.Second, PollInterval: 20 * time.Millisecond,
		PinnedTTL: 2 * time.Second, DrainTimeout: 5 * time.Second,
		Backoff: worker.ExpBackoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:  quietLog(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo := cfg.Topology
	topo.Subjects = cfg.Subjects
	if _, err := topo.Setup(ctx, r.js); err != nil {
		t.Fatalf("setup: %v", err)
	}
	w, err := worker.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, w.Run, w.Started(), 10*time.Second)
}

// quietLog discards what it is given.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createRunning creates n proxies p-0000... spread over the hosts and
// waits until list shows them all running.
func (r *rig) createRunning(n int) {
	r.t.Helper()
	ctx := ctxFor(r.t, 2*time.Minute)
	for i := range n {
		id := fmt.Sprintf("p-%04d", i)
		if _, err := r.c.Create(ctx, messages.CreateCommand{ID: id, Host: hosts[i%len(hosts)]}, "c-"+id, false); err != nil {
			r.t.Fatalf("create %s: %v", id, err)
		}
	}
	poll.Until(r.t, fmt.Sprintf("%d proxies running", n), 2*time.Minute, func() bool {
		sts, err := r.c.List(ctx, client.InState(messages.StateRunning))
		return err == nil && len(sts) == n
	})
}

// listCount is what `proxyfleet list` counts with the filters given.
func (r *rig) listCount(opts ...client.ListOption) int {
	r.t.Helper()
	sts, err := r.c.List(ctxFor(r.t, 30*time.Second), opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	return len(sts)
}

// browser is an HTTP client with its own cookies that does not follow
// redirects (the tests look at them).
type browser struct {
	t    testing.TB
	base string
	hc   *http.Client
}

func (r *rig) browser() *browser {
	return &browser{t: r.t, base: r.base, hc: newJarClient()}
}

// newJarClient is an HTTP client with its own cookies that does not
// follow redirects.
func newJarClient() *http.Client {
	jar, _ := cookiejar.New(nil) // no options: no error
	return &http.Client{
		Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// do sends a request and returns its status and body.
func (b *browser) do(method, path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp, string(out)
}

func (b *browser) login(user, pw string) {
	b.t.Helper()
	resp, body := b.do("POST", "/login", url.Values{"user": {user}, "password": {pw}})
	if resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("login %s: %s\n%s", user, resp.Status, body)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token of a page's forms.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	_, body := b.do("GET", path, nil)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no csrf token on %s:\n%s", path, body)
	}
	return m[1]
}

var countRE = regexp.MustCompile(`<strong id="proxy-count">(\d+)</strong>`)

// proxyCount is the count the proxies page shows at path.
func (b *browser) proxyCount(path string) string {
	b.t.Helper()
	resp, body := b.do("GET", path, nil)
	m := countRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		b.t.Fatalf("GET %s: %s, no count:\n%s", path, resp.Status, body)
	}
	return m[1]
}

var sinceRE = regexp.MustCompile(`data-since="(\d+)"`)

// since is the position in the events the proxies page at path was
// rendered at.
func (b *browser) since(path string) string {
	b.t.Helper()
	_, body := b.do("GET", path, nil)
	m := sinceRE.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no data-since on %s:\n%s", path, body)
	}
	return m[1]
}

// startHealth runs a health process, which answers the ban requests.
func (r *rig) startHealth() {
	r.t.Helper()
	js, err := jetstream.New(r.connect())
	if err != nil {
		r.t.Fatal(err)
	}
	h, err := health.New(js, health.Config{Subjects: messages.NewSubjects(""), HTTPAddr: health.NoHTTP, Logger: quietLog()})
	if err != nil {
		r.t.Fatal(err)
	}
	runtest.Start(r.t, h.Run, h.Started(), time.Minute)
}

// seedRecords writes, as health and the worker would: a refusal
// (verdict open) of each proxy of refuse at its current address, bans
// over two sites, and two dead letters.
func (r *rig) seedRecords(refuse ...string) {
	r.t.Helper()
	ctx := ctxFor(r.t, 30*time.Second)
	now := time.Now().UTC()
	checks, err := r.js.KeyValue(ctx, messages.BucketChecks)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, id := range refuse {
		st, err := r.c.Get(ctx, id)
		if err != nil || st.Addr() == "" {
			r.t.Fatalf("get %s: %v (address %q)", id, err, st.Addr())
		}
		data, _ := json.Marshal(messages.CheckRecord{V: messages.Version, ID: id, Addr: st.Addr(), Verdict: messages.VerdictOpen,
			Reason: "answered a request without credentials", At: now})
		if _, err := checks.Put(ctx, id, data); err != nil {
			r.t.Fatal(err)
		}
	}
	kv, err := r.js.KeyValue(ctx, messages.BucketBans)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, b := range []bans.Ban{
		{Address: "198.18.5.5", Site: "shop.example", Reason: "captcha wall"},
		{Address: "2001:db8::5", Site: "shop.example"},
		{Address: "198.18.5.6", Site: "news.example", Reason: "403"},
	} {
		b.V, b.At, b.Until, b.Source = messages.Version, now, now.Add(time.Hour), bans.SourceCLI
		data, _ := json.Marshal(b)
		if _, err := kv.Put(ctx, b.Key(), data); err != nil {
			r.t.Fatal(err)
		}
	}
	subj := messages.NewSubjects("")
	for i, id := range []string{"dead-1", "dead-2"} {
		data, _ := json.Marshal(messages.DeadLetter{V: messages.Version, ID: id, CommandID: "c-" + id, Op: messages.OpCreate, Seq: uint64(i + 1),
			Attempts: 5, LastError: "define domain: host unreachable", Class: "transient", At: now})
		if _, err := r.js.Publish(ctx, subj.Dead(id), data); err != nil {
			r.t.Fatal(err)
		}
	}
}

// refusedCount is how many proxies `list` shows refused: a verdict but
// ok in its CHECK column (a check of the proxy's current address).
func (r *rig) refusedCount() int {
	r.t.Helper()
	sts, err := r.c.List(ctxFor(r.t, 30*time.Second))
	if err != nil {
		r.t.Fatal(err)
	}
	n := 0
	for _, st := range sts {
		if c := st.Check; c != nil && c.Addr == st.Addr() && c.Verdict != messages.VerdictOK {
			n++
		}
	}
	return n
}

// rotationCount is the rotation's size as `proxyfleet rotation` prints
// it.
func (r *rig) rotationCount() int {
	r.t.Helper()
	rot, err := r.c.Rotation(ctxFor(r.t, 30*time.Second))
	if err != nil {
		r.t.Fatal(err)
	}
	if rot.Truncated {
		return rot.Size
	}
	return len(rot.Proxies)
}

// banCount and deadCount are the rows `ban ls` and `dead ls` print.
func (r *rig) banCount() int {
	r.t.Helper()
	bs, err := r.c.Bans(ctxFor(r.t, 30*time.Second), client.BanFilter{})
	if err != nil {
		r.t.Fatal(err)
	}
	return len(bs)
}

func (r *rig) deadCount() int {
	r.t.Helper()
	es, err := r.c.DeadLetters(ctxFor(r.t, 30*time.Second))
	if err != nil {
		r.t.Fatal(err)
	}
	return len(es)
}

// countOf is the number in the element of id on a page's body, or "".
func countOf(body, id string) string {
	m := regexp.MustCompile(`<strong id="` + regexp.QuoteMeta(id) + `">(\d+)</strong>`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}
