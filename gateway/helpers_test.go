package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/deny"
	"proxyfleet/internal/runtest"
	"proxyfleet/rotation"
)

// The fleet's credential, and the gateway's users.
const (
	fleetUser = "fleet"
	fleetPass = "fleet-s3cret-pw"
	alicePass = "alice-pw-Zq9"
	bobPass   = "bob-pw-Xk2"
)

// upstream is a forward proxy like the fleet's squid: it requires the
// fleet's credential, carries CONNECT to real targets and forwards
// absolute-URI requests. A mode makes it fail.
type upstream struct {
	t    testing.TB
	id   string
	srv  *httptest.Server
	mode string // "" ok, "502", "407", "squid502" (a target failure, X-Squid-Error)

	mu       sync.Mutex
	requests int      // requests it carried (CONNECT or plain)
	auths    []string // Proxy-Authorization values it saw
	headers  []http.Header
	tunnels  map[net.Conn]struct{}
	wg       sync.WaitGroup
	direct   *http.Transport
}

func newUpstream(t testing.TB, id, mode string) *upstream {
	u := &upstream{t: t, id: id, mode: mode, tunnels: map[net.Conn]struct{}{}, direct: &http.Transport{}}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.close)
	return u
}

func (u *upstream) close() {
	u.srv.Close()
	u.mu.Lock()
	for c := range u.tunnels {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
	u.direct.CloseIdleConnections()
}

func (u *upstream) addr() string { return u.srv.Listener.Addr().String() }

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.auths = append(u.auths, r.Header.Get("Proxy-Authorization"))
	u.headers = append(u.headers, r.Header.Clone())
	u.mu.Unlock()
	switch u.mode {
	case "502":
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return
	case "407":
		w.Header().Set("Proxy-Authenticate", `Basic realm="squid"`)
		w.Header().Set("X-Squid-Error", "ERR_CACHE_ACCESS_DENIED 0")
		http.Error(w, "auth", http.StatusProxyAuthRequired)
		return
	case "squid502":
		w.Header().Set("X-Squid-Error", "ERR_CONNECT_FAIL 111")
		http.Error(w, "the target refused", http.StatusBadGateway)
		return
	}
	if r.Header.Get("Proxy-Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte(fleetUser+":"+fleetPass)) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="squid"`)
		http.Error(w, "auth", http.StatusProxyAuthRequired)
		return
	}
	u.mu.Lock()
	u.requests++
	u.mu.Unlock()
	if r.Method == http.MethodConnect {
		u.connect(w, r)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Authorization")
	out.Header.Del("Proxy-Connection")
	resp, err := u.direct.RoundTrip(out)
	if err != nil {
		w.Header().Set("X-Squid-Error", "ERR_CONNECT_FAIL 111")
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	maps.Copy(w.Header(), resp.Header)
	w.Header().Set("X-Upstream", u.id)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (u *upstream) connect(w http.ResponseWriter, r *http.Request) {
	t, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
	if err != nil {
		w.Header().Set("X-Squid-Error", "ERR_CONNECT_FAIL 111")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Close()
		return
	}
	_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		_, _ = t.Write(b)
	}
	u.mu.Lock()
	u.tunnels[c] = struct{}{}
	u.tunnels[t] = struct{}{}
	u.mu.Unlock()
	u.wg.Add(2)
	var left sync.WaitGroup
	left.Add(2)
	pipe := func(dst, src net.Conn) {
		defer u.wg.Done()
		if _, err := io.Copy(dst, src); err == nil {
			_ = dst.(*net.TCPConn).CloseWrite() // a half-close goes on
		} else {
			dst.Close()
			src.Close()
		}
		left.Done()
		left.Wait()
		dst.Close()
		src.Close()
		u.mu.Lock()
		delete(u.tunnels, dst)
		delete(u.tunnels, src)
		u.mu.Unlock()
	}
	go pipe(t, c)
	go pipe(c, t)
}

// refusingAddr is an address nothing listens on (a port just closed).
func refusingAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// fullBacklogAddr is a listener that never accepts, with its backlog
// full: a connect to it hangs (its SYNs are dropped) until the dialer's
// timeout.
func fullBacklogAddr(t testing.TB) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the queue: dial until a dial hangs.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
		if i > 64 {
			t.Fatal("the backlog does not fill")
		}
	}
	return addr
}

// silentAddr is a server that accepts and never answers.
func silentAddr(t testing.TB) string { return serveAddr(t, nil) }

// serveAddr is a loopback server that runs handle (if not nil) on every
// connection it accepts, and closes them all at the test's end.
func serveAddr(t testing.TB, handle func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if handle != nil {
				wg.Go(func() { handle(c) })
			}
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// report is one Picker.Report call.
type report struct{ id, reason string }

// fakePicker is a Picker over fixed proxies: round robin among those
// matching, sessions sticky while their proxy matches.
type fakePicker struct {
	mu       sync.Mutex
	proxies  []Proxy
	next     int
	sessions map[string]string
	reports  []report
	inFlight map[string]int
	sels     []Selector
	changed  chan struct{} // closed at the next remove
}

func newPicker(ps ...Proxy) *fakePicker {
	return &fakePicker{proxies: ps, sessions: map[string]string{}, inFlight: map[string]int{}}
}

func (f *fakePicker) matching(sel Selector) []Proxy {
	var out []Proxy
	for _, p := range f.proxies {
		if slices.Contains(sel.Exclude, p.ID) {
			continue
		}
		ok := true
		for k, v := range sel.Labels {
			ok = ok && p.Labels[k] == v
		}
		if ok {
			out = append(out, p)
		}
	}
	return out
}

func (f *fakePicker) Pick(sel Selector) (Proxy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sels = append(f.sels, sel)
	return f.pickLocked(sel)
}

func (f *fakePicker) pickLocked(sel Selector) (Proxy, error) {
	// Round robin over the whole list: the first match from the next
	// position on.
	m := f.matching(sel)
	n := len(f.proxies)
	for i := range n {
		p := f.proxies[(f.next+i)%n]
		for _, q := range m {
			if q.ID == p.ID {
				f.next = (f.next + i + 1) % n
				return p, nil
			}
		}
	}
	return Proxy{}, fmt.Errorf("labels %v: %w", sel.Labels, ErrEmpty)
}

func (f *fakePicker) PickSession(key string, sel Selector) (Proxy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sels = append(f.sels, sel)
	if id, ok := f.sessions[key]; ok {
		for _, p := range f.matching(sel) {
			if p.ID == id {
				return p, nil
			}
		}
	}
	p, err := f.pickLocked(sel)
	if err == nil {
		f.sessions[key] = p.ID
	}
	return p, err
}

func (f *fakePicker) Acquire(p Proxy) func() {
	f.mu.Lock()
	f.inFlight[p.ID]++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.inFlight[p.ID]--
			f.mu.Unlock()
		})
	}
}

func (f *fakePicker) Report(p Proxy, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, report{p.ID, reason})
	return nil
}

func (f *fakePicker) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.proxies)
}

func (f *fakePicker) Get(id string) (Proxy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.proxies {
		if p.ID == id {
			return p, true
		}
	}
	return Proxy{}, false
}

func (f *fakePicker) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

// remove takes proxy id out, as health does with a dead one: its
// sessions move, and the rotation's change is announced.
func (f *fakePicker) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxies = slices.DeleteFunc(f.proxies, func(p Proxy) bool { return p.ID == id })
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

func (f *fakePicker) gotReports() []report {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reports)
}

// logBuf collects a gateway's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testGateway is a running gateway over picker.
type testGateway struct {
	*Gateway
	reg  *prometheus.Registry
	logs *logBuf
	run  *runtest.Running
}

func startGateway(t testing.TB, picker Picker, mod func(*Config)) *testGateway {
	t.Helper()
	logs := &logBuf{}
	reg := prometheus.NewRegistry()
	cfg := Config{
		Listen:           "127.0.0.1:0",
		SocksListen:      "127.0.0.1:0",
		Users:            []User{{Name: "alice", Password: alicePass}, {Name: "bob", Password: bobPass}},
		UpstreamUser:     fleetUser,
		UpstreamPassword: fleetPass,
		ConnectTimeout:   2 * time.Second,
		DrainTimeout:     time.Second,
		Logger:           slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry:         reg,
		// Nothing denied, explicitly: the tests' targets and proxies are
		// on loopback, which the default list refuses. The refusal has
		// tests of its own (deny_test.go), which set a list.
		Deny: &deny.List{},
		// No lookup leaves the test: every name has an address of each
		// family (tests that need others set their own).
		LookupNetIP: fakeLookup(nil),
	}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(picker, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := runtest.Start(t, g.Run, g.Started(), 10*time.Second)
	return &testGateway{Gateway: g, reg: reg, logs: logs, run: r}
}

// fakeLookup resolves the names in m to their addresses, any other name
// to one address of each family, and fails for a name mapped to none.
func fakeLookup(m map[string][]netip.Addr) rotation.LookupFunc {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		as, ok := m[host]
		switch {
		case !ok:
			return []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")}, nil
		case len(as) == 0:
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return as, nil
	}
}

// client is an HTTP client through the gateway as user:password.
func (g *testGateway) client(t testing.TB, user, password string) *http.Client {
	pu := &url.URL{Scheme: "http", Host: g.Addr()}
	if user != "" {
		pu.User = url.UserPassword(user, password)
	}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(pu),
		TLSClientConfig:   nil,
		DisableKeepAlives: false,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// connect sends CONNECT target through the gateway with the given
// Proxy-Authorization (and headers) and returns the answer and the
// connection (open if 200).
func (g *testGateway) connect(t testing.TB, target, auth string, hdr map[string]string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var b strings.Builder
	fmt.Fprintf(&b, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if auth != "" {
		fmt.Fprintf(&b, "Proxy-Authorization: %s\r\n", auth)
	}
	for k, v := range hdr {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return resp, c, br
}

func basic(user, pw string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pw))
}

// target is a plain HTTP server that answers its own name and records the
// headers it saw.
type target struct {
	srv     *httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newTarget(t testing.TB, tls bool) *target {
	tg := &target{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		tg.headers = append(tg.headers, r.Header.Clone())
		tg.mu.Unlock()
		if r.Body != nil {
			b, _ := io.ReadAll(r.Body)
			if len(b) > 0 {
				w.Header().Set("X-Body", string(b))
			}
		}
		_, _ = io.WriteString(w, "hello from target")
	})
	if tls {
		tg.srv = httptest.NewTLSServer(h)
	} else {
		tg.srv = httptest.NewServer(h)
	}
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *target) seen() []http.Header {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return slices.Clone(tg.headers)
}

// get fetches u with c and returns status, proxy header and body.
func get(t testing.TB, c *http.Client, u string, hdr map[string]string) (int, string, string) {
	t.Helper()
	resp, body := getResp(t, c, u, hdr)
	return resp.StatusCode, resp.Header.Get(HeaderProxy), body
}

// getResp fetches u with c and returns the answer, its body read.
func getResp(t testing.TB, c *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
