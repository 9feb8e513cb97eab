package health_test

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// fwdProxy is a tiny HTTP forward proxy (absolute-URI GET and CONNECT) on
// a loopback port, standing in for a guest's proxy. It can be stopped and
// started again on the same port.
type fwdProxy struct {
	t        *testing.T
	addr     string
	requests atomic.Int64 // requests it forwarded
	// captive, when set, answers every request itself with this body
	// instead of forwarding it (a captive portal, an error page).
	captive string

	mu  sync.Mutex
	srv *http.Server
	ln  net.Listener
}

func startProxy(t *testing.T) *fwdProxy {
	t.Helper()
	p := &fwdProxy{t: t}
	p.start("127.0.0.1:0")
	t.Cleanup(p.stop)
	return p
}

// ip and port of the proxy, as a state event would carry them.
func (p *fwdProxy) ip() string { h, _, _ := net.SplitHostPort(p.addr); return h }
func (p *fwdProxy) port() int {
	_, s, _ := net.SplitHostPort(p.addr)
	n, _ := strconv.Atoi(s)
	return n
}

func (p *fwdProxy) start(addr string) {
	p.t.Helper()
	var ln net.Listener
	var err error
	// The port may linger for a moment after a stop.
	poll.Wait(10*time.Second, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	if err != nil {
		p.t.Fatal(err)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if p.captive != "" {
			io.WriteString(w, p.captive)
			return
		}
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
	})}
	go srv.Serve(ln)
	p.mu.Lock()
	p.srv, p.ln, p.addr = srv, ln, ln.Addr().String()
	p.mu.Unlock()
}

// stop closes the proxy: connections are refused until start.
func (p *fwdProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Close()
		p.srv = nil
	}
}

func (p *fwdProxy) restart() { p.start(p.addr) }

// tunnel answers a CONNECT as a forward proxy: it dials the target and
// copies both ways until either side is done.
func tunnel(w http.ResponseWriter, r *http.Request) {
	up, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		up.Close()
		return
	}
	io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { io.Copy(up, conn); up.Close() }()
	io.Copy(conn, up)
	conn.Close()
}
