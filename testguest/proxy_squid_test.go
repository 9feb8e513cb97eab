package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// exampleUserData is the cloud-config proxyfleet renders for proxy p1 with
// squidConf and, when hash is not "", the password file with user fleet.
func exampleUserData(squidConf, hash string) string {
	var b strings.Builder
	b.WriteString("#cloud-config\nhostname: \"p1\"\nwrite_files:\n- path: /etc/squid/squid.conf\n  permissions: \"0644\"\n  content: |\n")
	for _, l := range strings.SplitAfter(squidConf, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	if hash != "" {
		b.WriteString("- path: /etc/squid/proxyfleet.passwd\n  owner: root:proxy\n  permissions: \"0640\"\n  content: |\n    fleet:" + hash + "\n")
	}
	b.WriteString("runcmd:\n- [sh, -c, 'command -v squid >/dev/null || (apt-get update && apt-get install -y squid)']\n- [systemctl, restart, squid]\n")
	return b.String()
}

// origin records what reached it.
type origin struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newOrigin(t *testing.T) *origin {
	o := &origin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.reqs = append(o.reqs, r)
		o.mu.Unlock()
		w.Header().Set("Via", "1.1 origin-cdn")
		io.WriteString(w, "hello")
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *origin) requests() []*http.Request {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*http.Request(nil), o.reqs...)
}

// squidProxy serves a ProxyHandler configured from userData. Every
// connection it makes goes to upstream (so targets can be any address),
// and it sees every client as clientAddr.
func squidProxy(t *testing.T, userData, clientAddr, upstream string) (*httptest.Server, *ProxyPolicy) {
	t.Helper()
	pol, _, err := LoadProxyPolicy(&Seed{InstanceID: "i-1", UserData: []byte(userData)}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	ph := NewProxyHandler(discardLogger())
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, upstream)
	}
	ph.Dial = dial
	ph.Transport = &http.Transport{DialContext: dial, DisableCompression: true}
	ph.SetPolicy(pol)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = clientAddr
		ph.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { ph.CloseTunnels(); s.Close() })
	return s, pol
}

func proxyGet(t *testing.T, proxy *httptest.Server, target string, header http.Header) *http.Response {
	t.Helper()
	pu, _ := url.Parse(proxy.URL)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", target, nil)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp
}

const allowedClient = "198.18.0.7:40000"

func TestSquidProxyExampleGET(t *testing.T) {
	o := newOrigin(t)
	hash := bcryptHash(t, "s3cret")
	p, pol := squidProxy(t, exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), hash), allowedClient, o.Listener.Addr().String())
	target := "http://198.18.0.1:18080/x"

	resp := proxyGet(t, p, target, nil)
	if resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxyfleet"` {
		t.Fatalf("no credentials: %d %v", resp.StatusCode, resp.Header)
	}
	if resp.Header.Get("Via") != "" || resp.Header.Get("X-Cache") != "" {
		t.Fatalf("error reply reveals the proxy: %v", resp.Header)
	}
	resp = proxyGet(t, p, target, http.Header{"Proxy-Authorization": {basic("fleet", "wrong")}})
	if resp.StatusCode != 407 || !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic ") {
		t.Fatalf("wrong password: %d %v", resp.StatusCode, resp.Header)
	}
	if n := len(o.requests()); n != 0 {
		t.Fatalf("%d requests reached the origin without credentials", n)
	}

	for i := 0; i < 2; i++ {
		resp = proxyGet(t, p, target, http.Header{"Proxy-Authorization": {basic("fleet", "s3cret")}, "X-Forwarded-For": {"192.0.2.1"}, "Forwarded": {"for=192.0.2.1"}})
		if resp.StatusCode != 200 {
			t.Fatalf("right password: %d", resp.StatusCode)
		}
	}
	// reply_header_access Via deny all: the origin's Via goes too, as in squid.
	if v := resp.Header.Values("Via"); v != nil {
		t.Fatalf("reply Via %q", v)
	}
	if resp.Header.Get("X-Cache") != "" || resp.Header.Get("X-Cache-Lookup") != "" {
		t.Fatalf("reply reveals the proxy: %v", resp.Header)
	}
	reqs := o.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests at the origin, want 2", len(reqs))
	}
	for _, k := range []string{"Proxy-Authorization", "X-Forwarded-For", "Via", "Forwarded", "Proxy-Connection"} {
		if v := reqs[1].Header.Values(k); v != nil {
			t.Errorf("origin got %s: %q", k, v)
		}
	}
	if reqs[1].Host != "198.18.0.1:18080" || reqs[1].URL.Path != "/x" {
		t.Errorf("origin got Host %q path %q", reqs[1].Host, reqs[1].URL.Path)
	}
	if n := pol.Auth.bcryptCount(); n != 2 {
		t.Errorf("%d bcrypt comparisons (wrong once, right once), want 2", n)
	}
}

func TestSquidProxyAllowListAndGuestTargets(t *testing.T) {
	o := newOrigin(t)
	ud := exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), bcryptHash(t, "s3cret"))
	auth := http.Header{"Proxy-Authorization": {basic("fleet", "s3cret")}}
	outside, _ := squidProxy(t, ud, "203.0.113.9:5555", o.Listener.Addr().String())
	if resp := proxyGet(t, outside, "http://198.18.0.1:18080/", auth); resp.StatusCode != 403 || resp.Header.Get("Proxy-Authenticate") != "" {
		t.Fatalf("source outside the allow-list: %d %v", resp.StatusCode, resp.Header)
	}
	inside, _ := squidProxy(t, ud, allowedClient, o.Listener.Addr().String())
	for _, target := range []string{"http://127.0.0.1:9090/healthz", "http://[::1]:80/", "http://169.254.169.254/latest"} {
		if resp := proxyGet(t, inside, target, auth); resp.StatusCode != 403 {
			t.Fatalf("%s: %d, want 403", target, resp.StatusCode)
		}
	}
	if n := len(o.requests()); n != 0 {
		t.Fatalf("%d denied requests reached the origin", n)
	}
}

// TestSquidProxyDenyList: the proxy refuses a plain request and a CONNECT
// to a literal destination of the deny list with 403 and squid's
// ERR_ACCESS_DENIED, before it connects anywhere (every connection of
// this proxy would go to the origin, which sees nothing); one outside
// the list goes through.
func TestSquidProxyDenyList(t *testing.T) {
	o := newOrigin(t)
	ud := exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), bcryptHash(t, "s3cret"))
	auth := http.Header{"Proxy-Authorization": {basic("fleet", "s3cret")}}
	p, _ := squidProxy(t, ud, allowedClient, o.Listener.Addr().String())
	for _, target := range []string{"http://[fd00::1]/", "http://0.0.0.0:8080/", "http://[::ffff:100.64.0.1]/", "http://0.1.2.3/"} {
		if resp := proxyGet(t, p, target, auth); resp.StatusCode != 403 || resp.Header.Get("X-Squid-Error") != "ERR_ACCESS_DENIED 0" {
			t.Errorf("GET %s: %d %v, want 403 ERR_ACCESS_DENIED", target, resp.StatusCode, resp.Header)
		}
	}
	good := "Proxy-Authorization: " + basic("fleet", "s3cret") + "\r\n"
	for _, target := range []string{"[fd00::1]:443", "100.64.0.1:443", "[::ffff:0.1.2.3]:443"} {
		if resp, _, _ := connect(t, p, target, good); resp.StatusCode != 403 {
			t.Errorf("CONNECT %s: %d, want 403", target, resp.StatusCode)
		}
	}
	if n := len(o.requests()); n != 0 {
		t.Fatalf("%d denied requests reached the origin", n)
	}
	if resp := proxyGet(t, p, "http://198.18.0.1:18080/", auth); resp.StatusCode != 200 {
		t.Fatalf("GET outside the list: %d", resp.StatusCode)
	}
}

func TestSquidProxyForwardedForOn(t *testing.T) {
	o := newOrigin(t)
	// An operator's template that leaks: squid's defaults plus forwarded_for on.
	conf := "http_port 3128\nacl net src 198.18.0.0/15\nhttp_access allow net\nhttp_access deny all\nforwarded_for on\n"
	p, _ := squidProxy(t, exampleUserData(conf, ""), allowedClient, o.Listener.Addr().String())
	resp := proxyGet(t, p, "http://198.18.0.1:18080/", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	resp = proxyGet(t, p, "http://198.18.0.1:18080/", http.Header{"X-Forwarded-For": {"192.0.2.1"}})
	reqs := o.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests at the origin", len(reqs))
	}
	if got := reqs[0].Header.Get("X-Forwarded-For"); got != "198.18.0.7" {
		t.Errorf("X-Forwarded-For %q, want the client's address", got)
	}
	if got := reqs[1].Header.Get("X-Forwarded-For"); got != "192.0.2.1, 198.18.0.7" {
		t.Errorf("X-Forwarded-For %q, want the list extended", got)
	}
	if got := reqs[0].Header.Get("Via"); got != "1.1 p1 (squid)" {
		t.Errorf("Via %q", got)
	}
	if got := resp.Header.Get("Via"); got != "1.1 origin-cdn, 1.1 p1 (squid)" || resp.Header.Get("X-Cache") != "MISS from p1" {
		t.Errorf("reply Via %q X-Cache %q", got, resp.Header.Get("X-Cache"))
	}
}

// connect sends CONNECT through proxy with the given extra header lines
// and returns the status and, when 200, the tunnel.
func connect(t *testing.T, proxy *httptest.Server, target, extra string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, extra)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatal(err)
	}
	return resp, c, br
}

func TestSquidProxyCONNECT(t *testing.T) {
	// The upstream greets, so a tunnel is seen to work.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "greetings\n")
			c.Close()
		}
	}()
	ud := exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), bcryptHash(t, "s3cret"))
	p, _ := squidProxy(t, ud, allowedClient, ln.Addr().String())
	good := "Proxy-Authorization: " + basic("fleet", "s3cret") + "\r\n"

	if resp, _, _ := connect(t, p, "198.18.0.1:443", ""); resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxyfleet"` {
		t.Fatalf("no credentials: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _, _ := connect(t, p, "198.18.0.1:443", "Proxy-Authorization: "+basic("fleet", "nope")+"\r\n"); resp.StatusCode != 407 {
		t.Fatalf("wrong password: %d", resp.StatusCode)
	}
	if resp, _, _ := connect(t, p, "127.0.0.1:22", good); resp.StatusCode != 403 {
		t.Fatalf("dst 127.0.0.1: %d", resp.StatusCode)
	}
	resp, _, br := connect(t, p, "198.18.0.1:443", good)
	if resp.StatusCode != 200 {
		t.Fatalf("right password: %d", resp.StatusCode)
	}
	if line, _ := br.ReadString('\n'); line != "greetings\n" {
		t.Fatalf("tunnel read %q", line)
	}
	outside, _ := squidProxy(t, ud, "203.0.113.9:5555", ln.Addr().String())
	if resp, _, _ := connect(t, outside, "198.18.0.1:443", good); resp.StatusCode != 403 {
		t.Fatalf("outside the allow-list: %d", resp.StatusCode)
	}
}

func TestProxyWithoutSquidConfIsOpen(t *testing.T) {
	o := newOrigin(t)
	for _, ud := range []string{"", "#cloud-config\nhostname: p1\n", "#!/bin/sh\necho hi\n",
		"#cloud-config\nwrite_files:\n- {path: /etc/proxy-id, content: p1}\n"} {
		p, pol := squidProxy(t, ud, "203.0.113.9:5555", o.Listener.Addr().String())
		if pol.Source != "none" || pol.Squid != nil {
			t.Fatalf("%q: policy %+v", ud, pol)
		}
		if resp := proxyGet(t, p, "http://127.0.0.1:1/", nil); resp.StatusCode != 200 || resp.Header.Get("X-Cache") != "" {
			t.Fatalf("%q: %d %v", ud, resp.StatusCode, resp.Header)
		}
	}
	for _, r := range o.requests() {
		if r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("Via") != "" {
			t.Fatalf("open proxy added headers: %v", r.Header)
		}
	}
	// No seed at all: open too.
	if pol, note, err := LoadProxyPolicy(nil, "p1"); err != nil || pol.Squid != nil || note != "no seed" {
		t.Fatalf("nil seed: %+v %q %v", pol, note, err)
	}
}

func TestProxyHandlerWithoutPolicyServesNothing(t *testing.T) {
	o := newOrigin(t)
	ph := NewProxyHandler(discardLogger())
	rec := httptest.NewRecorder()
	ph.ServeHTTP(rec, httptest.NewRequest("GET", o.URL+"/", nil))
	if rec.Code != http.StatusServiceUnavailable || len(o.requests()) != 0 {
		t.Fatalf("status %d, %d requests forwarded", rec.Code, len(o.requests()))
	}
}

func TestLoadProxyPolicyFailsClosed(t *testing.T) {
	for name, ud := range map[string]string{
		"password file missing": exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), ""),
		"unparsable squid.conf": exampleUserData("http_access allow undefined_acl\n", ""),
		"unparsable user-data":  "#cloud-config\nwrite_files: [\n",
		"bad encoding":          "#cloud-config\nwrite_files:\n- {path: /etc/squid/squid.conf, encoding: b64, content: '%%'}\n",
	} {
		pol, _, err := LoadProxyPolicy(&Seed{UserData: []byte(ud)}, "p1")
		if err == nil || pol != nil {
			t.Errorf("%s: got %+v, want an error", name, pol)
		}
	}
}

func TestLoadProxyPolicyHostnameAndBase64(t *testing.T) {
	ud := "#cloud-config\nwrite_files:\n- path: /etc/squid/squid.conf\n  encoding: b64\n  content: " +
		"aHR0cF9wb3J0IDMxMjkKdmlzaWJsZV9ob3N0bmFtZSBlZGdlMQpodHRwX2FjY2VzcyBhbGxvdyBhbGwK\n" // http_port 3129, visible_hostname edge1, http_access allow all
	pol, _, err := LoadProxyPolicy(&Seed{UserData: []byte(ud)}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if pol.Hostname != "edge1" || pol.Squid.Port != 3129 || pol.ListenAddr("127.0.0.1:3128") != "127.0.0.1:3129" || pol.ListenAddr(":3128") != ":3129" {
		t.Fatalf("%+v %q", pol, pol.ListenAddr("127.0.0.1:3128"))
	}
	if OpenPolicy().ListenAddr("127.0.0.1:3128") != "127.0.0.1:3128" {
		t.Fatal("open policy moved the address")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestProxyServiceWaitsForConfig(t *testing.T) {
	fallback := freeAddr(t)
	squidAddr := freeAddr(t)
	_, port, _ := net.SplitHostPort(squidAddr)
	ps := &ProxyService{Handler: NewProxyHandler(discardLogger()), DefaultAddr: fallback, Log: discardLogger()}
	defer ps.Stop()
	if err := ps.Start(); err != nil {
		t.Fatal(err)
	}
	if ps.Running() || listening(fallback) || ps.Status()["proxy_source"] != "pending" {
		t.Fatalf("listening before the config is known: %v", ps.Status())
	}
	hash := bcryptHash(t, "s3cret")
	pol, _, err := LoadProxyPolicy(&Seed{UserData: []byte(exampleUserData(strings.Replace(exampleSquidConf(true, ""), "http_port 3128", "http_port "+port, 1), hash))}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Configure(pol, nil); err != nil {
		t.Fatal(err)
	}
	if !ps.Running() || !listening(squidAddr) || listening(fallback) {
		t.Fatalf("running=%t, want listening on %s (http_port) only", ps.Running(), squidAddr)
	}
	// It is the configured proxy: 407 without credentials.
	pu, _ := url.Parse("http://" + squidAddr)
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://198.18.0.1:1/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 407 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	st := ps.Status()
	b, _ := json.Marshal(st)
	if st["proxy_source"] != "squid.conf" || st["proxy_auth"] != true || st["proxy_port"] != atoi(t, port) || strings.Contains(string(b), "$2a$") {
		t.Fatalf("status %s", b)
	}
	// /proxy/stop and /proxy/start keep working on the configured port.
	ps.Stop()
	if ps.Running() || listening(squidAddr) {
		t.Fatal("still listening after Stop")
	}
	if err := ps.Start(); err != nil || !listening(squidAddr) {
		t.Fatalf("Start: %v", err)
	}
}

func TestProxyServiceConfigErrorStaysClosed(t *testing.T) {
	fallback := freeAddr(t)
	ps := &ProxyService{Handler: NewProxyHandler(discardLogger()), DefaultAddr: fallback, Log: discardLogger()}
	defer ps.Stop()
	ps.Start()
	_, _, cerr := LoadProxyPolicy(&Seed{UserData: []byte(exampleUserData(exampleSquidConf(true, ""), ""))}, "p1")
	if cerr == nil {
		t.Fatal("want a config error")
	}
	if err := ps.Configure(nil, cerr); err != nil {
		t.Fatal(err)
	}
	if ps.Running() || listening(fallback) {
		t.Fatal("listening despite the config error")
	}
	if err := ps.Start(); err == nil || !strings.Contains(err.Error(), "password file") {
		t.Fatalf("Start after a config error: %v", err)
	}
	if st := ps.Status(); st["proxy_source"] != "error" || !strings.Contains(st["proxy_error"].(string), "proxyfleet.passwd") {
		t.Fatalf("status %v", st)
	}
}

func TestProxyServiceOpenOnFallback(t *testing.T) {
	fallback := freeAddr(t)
	ps := &ProxyService{Handler: NewProxyHandler(discardLogger()), DefaultAddr: fallback}
	defer ps.Stop()
	ps.Configure(OpenPolicy(), nil)
	if ps.Running() {
		t.Fatal("started though not wanted")
	}
	if err := ps.Start(); err != nil || !listening(fallback) {
		t.Fatalf("Start: %v", err)
	}
	if st := ps.Status(); st["proxy_source"] != "none" || st["proxy_auth"] != false || st["proxy_port"] != atoi(t, fallback[strings.LastIndex(fallback, ":")+1:]) {
		t.Fatalf("status %v", st)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSeedDirModeConfiguresProxy is -seed-dir mode: seed files on disk to
// a policy (as main does outside a VM).
func TestSeedDirModeConfiguresProxy(t *testing.T) {
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "meta-data"), []byte("instance-id: i-9\nlocal-hostname: p1\n"), 0o644)
	os.WriteFile(filepath.Join(d, "user-data"), []byte(exampleUserData(exampleSquidConf(true, "198.18.0.0/15"), bcryptHash(t, "s3cret"))), 0o644)
	seed, err := ReadSeedDir(d)
	if err != nil {
		t.Fatal(err)
	}
	ps := &ProxyService{Handler: NewProxyHandler(discardLogger()), DefaultAddr: freeAddr(t), Log: discardLogger()}
	defer ps.Stop()
	if err := configureProxy(ps, seed, discardLogger()); err != nil {
		t.Fatal(err)
	}
	if st := ps.Status(); st["proxy_source"] != "squid.conf" || st["proxy_auth"] != true {
		t.Fatalf("status %v", st)
	}
}
