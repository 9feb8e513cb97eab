package console

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"proxyfleet/client"
	"proxyfleet/messages"
)

//go:embed assets
var assets embed.FS

// PageSize is the proxies a page of the proxies page shows.
const PageSize = 100

// readTimeout bounds the reads of one page.
const readTimeout = 10 * time.Second

// view is what every page's template is given.
type view struct {
	Title, Page string
	User        string
	Admin       bool
	CSRF        string
	Error       string
	Data        any
}

// templates parses each page with the layout.
func templates() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, p := range []string{"login", "fleet", "proxies", "pools", "refused", "bans", "dead", "result", "error", "rotation", "traffic"} {
		t, err := template.New(p).ParseFS(assets, "assets/layout.html", "assets/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", p, err)
		}
		out[p] = t
	}
	return out, nil
}

// parsed returns the templates, parsed on the first page rendered: they
// are embedded, so a parse error is the build's and every test of a page
// meets it. Not at init: every role runs this binary, and a worker or a
// health process would hold the parsed pages for nothing.
var parsed = sync.OnceValue(func() map[string]*template.Template {
	t, err := templates()
	if err != nil {
		panic(err)
	}
	return t
})

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets") // a constant directory: no error
	files := http.FileServerFS(static)
	mux.Handle("GET /static/{file}", s.counted("static", http.StripPrefix("/static/", onlyStatic(files))))
	mux.Handle("GET /login", s.counted("login", http.HandlerFunc(s.loginPage)))
	mux.Handle("POST /login", s.counted("login", http.HandlerFunc(s.login)))
	mux.Handle("POST /logout", s.counted("logout", s.authed(s.logout)))
	mux.Handle("GET /{$}", s.counted("fleet", s.authed(s.fleetPage)))
	mux.Handle("GET /proxies", s.counted("proxies", s.authed(s.proxiesPage)))
	mux.Handle("GET /pools", s.counted("pools", s.authed(s.poolsPage)))
	mux.Handle("GET /refused", s.counted("refused", s.authed(s.refusedPage)))
	mux.Handle("GET /bans", s.counted("bans", s.authed(s.bansPage)))
	mux.Handle("GET /dead", s.counted("dead", s.authed(s.deadPage)))
	mux.Handle("GET /rotation", s.counted("rotation", s.authed(s.rotationPage)))
	mux.Handle("GET /traffic", s.counted("traffic", s.authed(s.trafficPage)))
	mux.Handle("GET /events", s.counted("events", s.authed(s.events)))
	mux.Handle("POST /actions/pool/recycle", s.counted("action", s.action("pool_recycle", s.poolRecycle)))
	mux.Handle("POST /actions/proxy/create", s.counted("action", s.action("proxy_create", s.proxyCreate)))
	mux.Handle("POST /actions/proxy/delete", s.counted("action", s.action("proxy_delete", s.proxyDelete)))
	mux.Handle("POST /actions/pool/size", s.counted("action", s.action("pool_size", s.poolSize)))
	mux.Handle("POST /actions/ban/add", s.counted("action", s.action("ban_add", s.banAdd)))
	mux.Handle("POST /actions/ban/remove", s.counted("action", s.action("ban_remove", s.banRemove)))
	mux.Handle("POST /actions/host/quarantine", s.counted("action", s.action("host_quarantine", s.hostQuarantine)))
	mux.Handle("POST /actions/host/release", s.counted("action", s.action("host_release", s.hostRelease)))
	mux.Handle("/", s.counted("other", s.authed(func(w http.ResponseWriter, r *http.Request, sess *session) {
		s.render(w, r, http.StatusNotFound, "error", sess, "Not found", r.URL.Path+" is not a page of the console")
	})))
	return securityHeaders(mux)
}

// onlyStatic serves the embedded files but never the templates.
func onlyStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, ".css") && !strings.HasSuffix(r.URL.Path, ".js") {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// securityHeaders: nothing but the console's own assets may run or be
// loaded, and no other site may frame it.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// recorder remembers the status a handler wrote, for the metrics; it
// unwraps for http.ResponseController (the live stream flushes).
type recorder struct {
	http.ResponseWriter
	code int
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) counted(page string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		code := rec.code
		if code == 0 {
			code = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(page, strconv.Itoa(code/100)+"xx").Inc()
	})
}

// authed serves h to a logged-in user only: a page asked for without a
// session goes to the login page, anything else is refused (401).
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess, ok := s.sessionOf(r)
		if !ok {
			if r.Method == http.MethodGet && r.URL.Path != "/events" {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			http.Error(w, "log in first", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && !validCSRF(sess, r.PostFormValue("csrf")) {
			s.render(w, r, http.StatusForbidden, "error", sess, "Refused", "the form's CSRF token is missing or wrong: reload the page and try again")
			return
		}
		h(w, r, sess)
	})
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, page string, sess *session, title string, data any) {
	v := view{Title: title, Page: page, Data: data}
	if sess != nil {
		v.User, v.Admin, v.CSRF = sess.user, sess.admin, sess.csrf
	}
	if page == "login" {
		if e, ok := data.(string); ok {
			v.Error = e
		}
	}
	var b strings.Builder
	if err := parsed()[page].ExecuteTemplate(&b, "layout", v); err != nil {
		s.log.Error("console: render", "page", page, "err", err)
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(b.String()))
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.sessionOf(r); ok {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", nil, "Log in", "")
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	name := r.PostFormValue("user")
	src, counted := sourceOf(r)
	if counted {
		if wait, no := s.throttle.blocked(src); no {
			s.metrics.logins.WithLabelValues("throttled").Inc()
			s.log.Warn("console: login throttled", "user", name, "remote", r.RemoteAddr)
			// Whole seconds, rounded up: a retry then is never early.
			w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
			s.render(w, r, http.StatusTooManyRequests, "login", nil, "Log in", "too many failed logins from your address: try again in a minute")
			return
		}
	}
	u, ok := s.checkPassword(name, r.PostFormValue("password"))
	if !ok {
		if counted {
			s.throttle.failed(src)
		}
		s.metrics.logins.WithLabelValues("refused").Inc()
		s.log.Warn("console: login refused", "user", name, "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", nil, "Log in", "wrong user or password")
		return
	}
	tok, _ := s.sessions.start(u.Name, u.Admin)
	s.metrics.logins.WithLabelValues("ok").Inc()
	s.log.Info("console: login", "user", u.Name, "admin", u.Admin, "remote", r.RemoteAddr)
	setSessionCookie(w, r, tok, int(s.cfg.SessionTTL/time.Second))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	if c, err := r.Cookie(cookieName); err == nil {
		s.sessions.end(c.Value)
	}
	setSessionCookie(w, r, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// hostRow is a host as the fleet page shows it.
type hostRow struct {
	client.HostInfo
	Free  int
	Since string
}

type fleetData struct {
	Hosts         []hostRow
	RotationSize  int
	RotationError string
}

func (s *Server) fleetPage(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	hosts, err := s.cl.Hosts(ctx)
	if err != nil {
		s.render(w, r, http.StatusBadGateway, "error", sess, "Fleet", "read the hosts: "+err.Error())
		return
	}
	d := fleetData{}
	now := time.Now()
	for _, h := range hosts {
		d.Hosts = append(d.Hosts, hostRow{HostInfo: h, Free: max(h.MaxProxies-h.Proxies, 0), Since: client.Age(now, h.Since)})
	}
	if rot, err := s.cl.Rotation(ctx); err != nil {
		d.RotationError = "not read: " + err.Error()
	} else {
		d.RotationSize = rotationSize(rot)
	}
	s.render(w, r, http.StatusOK, "fleet", sess, "Fleet", d)
}

// rotationSize is the rotation's proxies, whole or truncated.
func rotationSize(rot messages.Rotation) int {
	if rot.Truncated {
		return rot.Size
	}
	return len(rot.Proxies)
}

// poolRow is a pool as the pools page shows it.
type poolRow struct {
	Name string
	messages.PoolSummary
	Oldest string
}

func (s *Server) poolsPage(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	pools, err := s.cl.Pools(ctx)
	if err != nil {
		s.render(w, r, http.StatusBadGateway, "error", sess, "Pools", "read the pools: "+err.Error())
		return
	}
	now := time.Now()
	var d struct{ Pools []poolRow }
	for _, p := range pools {
		d.Pools = append(d.Pools, poolRow{Name: p.Record.Name, PoolSummary: p.Summary, Oldest: client.Age(now, p.Summary.Oldest)})
	}
	s.render(w, r, http.StatusOK, "pools", sess, "Pools", d)
}

// proxyRow is a proxy as the proxies page shows it, and as the live
// stream sends it (its JSON).
type proxyRow struct {
	Seq    uint64 `json:"seq,omitempty"`
	ID     string `json:"id"`
	State  string `json:"state"`
	Host   string `json:"host"`
	Addr   string `json:"addr"`
	Egress string `json:"egress"`
	Health string `json:"health"`
	Pool   string `json:"pool"`
	Labels string `json:"labels"`
	Age    string `json:"age"`
}

// labelText is a proxy's labels but its pool's, sorted, k=v comma-joined.
func labelText(ls map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(ls)) {
		if k != messages.PoolLabel {
			parts = append(parts, k+"="+ls[k])
		}
	}
	return strings.Join(parts, ",")
}

func rowOf(st client.Status, now time.Time) proxyRow {
	ls := st.Labels()
	row := proxyRow{ID: st.ID, State: st.State(), Host: st.Host(), Addr: st.Addr(), Pool: ls[messages.PoolLabel], Labels: labelText(ls)}
	if ev := st.Event; ev != nil {
		row.Egress, row.Age = client.EgressSummary(ev.Egress), client.Age(now, ev.At)
	}
	if st.Check != nil {
		row.Health = st.Check.Verdict
	}
	return row
}

// rowOfEvent is the row a state event gives: what it says of the proxy
// (its health is not in it).
func rowOfEvent(u client.Update, now time.Time) proxyRow {
	st := client.Status{ID: u.Event.ID, Event: &u.Event}
	row := rowOf(st, now)
	row.State, row.Host = u.Event.State, u.Event.Host
	row.Seq = u.StreamSeq
	return row
}

// proxyStates are the states the proxies page filters by ("" is any).
var proxyStates = []string{"", messages.StateProvisioning, messages.StateRunning, messages.StateFailed, messages.StateDeleting, messages.StateDeleted, "pending"}

type proxiesData struct {
	Host, State, Pool string
	States            []string
	Rows              []proxyRow
	Total             int
	PageNo, Pages     int
	First             bool
	Prev, Next        string
	Since             uint64
}

func (s *Server) proxiesPage(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	d := proxiesData{Host: q.Get("host"), State: q.Get("state"), Pool: q.Get("pool"), States: proxyStates, PageNo: 1}
	if !slices.Contains(proxyStates, d.State) {
		s.render(w, r, http.StatusBadRequest, "error", sess, "Proxies", fmt.Sprintf("state %q: want one of %s", d.State, strings.Join(proxyStates[1:], ", ")))
		return
	}
	if p := q.Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			s.render(w, r, http.StatusBadRequest, "error", sess, "Proxies", fmt.Sprintf("page %q: want a number from 1", p))
			return
		}
		d.PageNo = n
	}
	// The position first: whatever happens after it reaches the page
	// through its live stream.
	d.Since = s.hub.position()
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	if err := s.view.wait(ctx); err != nil {
		s.render(w, r, http.StatusServiceUnavailable, "error", sess, "Proxies", "read the proxies: "+err.Error())
		return
	}
	s.proxiesFromView(&d)
	link := func(page int) string {
		v := url.Values{}
		for k, x := range map[string]string{"host": d.Host, "state": d.State, "pool": d.Pool} {
			if x != "" {
				v.Set(k, x)
			}
		}
		v.Set("page", strconv.Itoa(page))
		return "/proxies?" + v.Encode()
	}
	if d.PageNo > 1 {
		d.Prev = link(d.PageNo - 1)
	}
	if d.PageNo < d.Pages {
		d.Next = link(d.PageNo + 1)
	}
	s.render(w, r, http.StatusOK, "proxies", sess, "Proxies", d)
}

// proxiesFromView fills d's rows and counts from the view, once it is
// ready.
func (s *Server) proxiesFromView(d *proxiesData) {
	sts, total, _ := s.view.query(d.Host, d.State, d.Pool, d.PageNo-1, PageSize)
	d.Total = total
	d.Pages = max(1, (d.Total+PageSize-1)/PageSize)
	if d.PageNo > d.Pages { // past the end: the last page
		d.PageNo = d.Pages
		sts, d.Total, _ = s.view.query(d.Host, d.State, d.Pool, d.PageNo-1, PageSize)
	}
	d.First = d.PageNo == 1
	now := time.Now()
	for _, st := range sts {
		d.Rows = append(d.Rows, rowOf(st, now))
	}
}

// events is the live stream: server-sent events of the proxies' state
// events after ?since (a stream sequence), as "proxy" events whose data
// is a proxyRow's JSON; with ?want=rotation each new picture of the
// rotation's chart ("rotation", a chartPicture's JSON), with
// ?want=traffic each read of the gateways ("traffic", a
// trafficPicture's); "reload" when the page must read afresh (events it
// missed are no longer held, it fell behind, or the watch broke).
// While the console does not follow the events yet it ends at once, and
// the browser's EventSource tries again. It ends when the client goes,
// the console stops, or the hub drops it.
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ *session) {
	since, _ := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
	// A browser reconnecting says the last event it got: resume there.
	if last, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		since = max(since, last)
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	backlog, ch, st := s.hub.subscribe(since)
	switch st {
	case notYet: // the browser comes back after retry, the page kept
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprint(w, "retry: 5000\n: not following the events yet\n\n")
		_ = rc.Flush()
		return
	case tooOld:
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprint(w, "retry: 2000\nevent: reload\ndata: {}\n\n")
		_ = rc.Flush()
		return
	}
	defer s.hub.unsubscribe(ch)
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	w.WriteHeader(http.StatusOK)
	send := func(u client.Update) error {
		b, err := json.Marshal(rowOfEvent(u, time.Now()))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "id: %d\nevent: proxy\ndata: %s\n\n", u.StreamSeq, b)
		return err
	}
	_, _ = fmt.Fprint(w, "retry: 2000\n: live\n\n")
	for _, u := range backlog {
		if send(u) != nil {
			return
		}
	}
	if rc.Flush() != nil {
		return
	}
	keepalive := time.NewTicker(20 * time.Second)
	defer keepalive.Stop()
	// The pictures a page draws (?want=rotation, ?want=traffic) come
	// too; the others' pages are not sent them.
	var rotCh, trafficCh <-chan struct{} // nil: never
	want := r.URL.Query()["want"]
	if slices.Contains(want, "rotation") {
		_, rotCh = s.chart.current()
	}
	if slices.Contains(want, "traffic") {
		_, trafficCh = s.traffic.current()
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-rotCh:
			var p chartPicture
			p, rotCh = s.chart.current()
			if sendPicture(w, "rotation", p) != nil || rc.Flush() != nil {
				return
			}
		case <-trafficCh:
			var p trafficPicture
			p, trafficCh = s.traffic.current()
			if sendPicture(w, "traffic", p) != nil || rc.Flush() != nil {
				return
			}
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case u, open := <-ch:
			if !open {
				_, _ = fmt.Fprint(w, "event: reload\ndata: {}\n\n")
				_ = rc.Flush()
				return
			}
			if send(u) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// actionResult is what an action's page shows.
