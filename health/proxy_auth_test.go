package health_test

import (
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// The fleet's credentials in these tests. The password is one no log line
// or message could hold by chance.
const (
	fleetUser     = "fleet"
	fleetPassword = "Zq8-pw-never-shown-7Kx"
)

// fleetToken is what goes on the wire: base64(user:password).
var fleetToken = base64.StdEncoding.EncodeToString([]byte(fleetUser + ":" + fleetPassword))

// authProxy is an HTTP forward proxy (absolute-URI requests and CONNECT)
// on a loopback port that behaves as the test says, switchable while it
// runs:
//   - it requires Basic credentials (407 without, or with wrong ones)
//     unless open is set;
//   - it strips Proxy-Authorization before forwarding, as squid does,
//     unless forwardAuth is set;
//   - with xff, it adds X-Forwarded-For with its client's address.
type authProxy struct {
	user, password string
	open           atomic.Bool
	forwardAuth    atomic.Bool
	xff            atomic.Bool

	srv       *httptest.Server
	requests  atomic.Int64 // requests it received (CONNECTs included)
	forwarded atomic.Int64 // of which it let through
	mu        sync.Mutex
	auths     []string // Proxy-Authorization of each request received ("" if none)
	methods   []string
}

func startAuthProxy(t *testing.T) *authProxy {
	t.Helper()
	p := &authProxy{user: fleetUser, password: fleetPassword}
	tr := &http.Transport{DisableKeepAlives: true}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		p.mu.Lock()
		p.auths = append(p.auths, r.Header.Get("Proxy-Authorization"))
		p.methods = append(p.methods, r.Method)
		p.mu.Unlock()
		if !p.open.Load() {
			u, pw, ok := parseProxyAuth(r.Header.Get("Proxy-Authorization"))
			if !ok || u != p.user || pw != p.password {
				w.Header().Set("Proxy-Authenticate", `Basic realm="fleet"`)
				http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
				return
			}
		}
		p.forwarded.Add(1)
		if r.Method == http.MethodConnect {
			tunnel(w, r)
			return
		}
		if !r.URL.IsAbs() {
			http.Error(w, "a forward proxy", http.StatusBadRequest)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		if !p.forwardAuth.Load() {
			out.Header.Del("Proxy-Authorization")
		}
		if p.xff.Load() {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			out.Header.Set("X-Forwarded-For", host)
		}
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func parseProxyAuth(h string) (user, password string, ok bool) {
	const prefix = "Basic "
	if len(h) < len(prefix) || h[:len(prefix)] != prefix {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(h[len(prefix):])
	if err != nil {
		return "", "", false
	}
	for i := range b {
		if b[i] == ':' {
			return string(b[:i]), string(b[i+1:]), true
		}
	}
	return "", "", false
}

func (p *authProxy) addr() string { return p.srv.Listener.Addr().String() }

func (p *authProxy) ipPort() (string, int) {
	h, s, _ := net.SplitHostPort(p.addr())
	n, _ := strconv.Atoi(s)
	return h, n
}

// seen returns the method and Proxy-Authorization of every request it got.
func (p *authProxy) seen() (methods, auths []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.methods...), append([]string(nil), p.auths...)
}
