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
)

// An https target is reached with CONNECT through the proxy.
func TestHTTPProberConnect(t *testing.T) {
	target := httptest.NewTLSServer(ProbeHandler())
	defer target.Close()
	var connects atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		connects.Add(1)
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
	if connects.Load() != 1 {
		t.Fatalf("%d CONNECTs, want 1", connects.Load())
	}
}
