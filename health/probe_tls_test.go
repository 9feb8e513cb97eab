package health

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"proxyfleet/messages"
)

// An https target is reached with CONNECT through the proxy; a probe
// naming an egress address names it on the CONNECT, the request the proxy
// reads, and only an address can be named.
func TestHTTPProberConnect(t *testing.T) {
	target := httptest.NewTLSServer(ProbeHandler())
	defer target.Close()
	var connects atomic.Int64
	var named atomic.Value
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		connects.Add(1)
		named.Store(r.Header.Get(messages.HeaderEgress))
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
	}))
	defer proxy.Close()
	p, err := NewHTTPProber(target.URL+ProbePath, "", WithTLSConfig(&tls.Config{RootCAs: target.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Probe(ctx, proxy.Listener.Addr().String()); err != nil {
		t.Fatalf("probe of an https target: %v", err)
	}
	if connects.Load() != 1 || named.Load() != "" {
		t.Fatalf("%d CONNECTs naming %q, want 1 naming none", connects.Load(), named.Load())
	}
	if f := p.CheckEgress(ctx, proxy.Listener.Addr().String(), "::ffff:127.0.0.1", false); f.Err != nil || named.Load() != "127.0.0.1" || f.Egress != "127.0.0.1" {
		t.Fatalf("a probe naming 127.0.0.1: %v, the CONNECT named %q, egress %q", f.Err, named.Load(), f.Egress)
	}
	if f := p.CheckEgress(ctx, proxy.Listener.Addr().String(), "127.0.0.1\r\nX-Evil: 1", false); f.Err == nil || connects.Load() != 2 {
		t.Fatalf("a probe naming what is not an address: %v, %d CONNECTs", f.Err, connects.Load())
	}
}
