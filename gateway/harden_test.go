package gateway

import (
	"net"
	"strings"
	"testing"
)

// The gateway faces the internet: framing that could smuggle a request,
// a proxy that says more than its answer, credential guessing, heads
// that cost the gateway before anyone is authenticated.

// chunkedWithLength is a POST whose body is framed twice: chunked
// ("abc") and by a length that would end it elsewhere.
func chunkedWithLength(target string, more ...string) string {
	return "POST " + target + " HTTP/1.1\r\nHost: x\r\n" + aliceAuth + strings.Join(more, "") +
		"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
}

// TestLengthWithChunkedCloses: a request with both Content-Length and
// Transfer-Encoding is carried as chunked, answered, and its connection
// closed (RFC 9112 6.1), on the lean path and on the slow one.
func TestLengthWithChunkedCloses(t *testing.T) {
	t.Run("lean", func(t *testing.T) {
		up := newScriptProxy(t, func(c net.Conn, r *seenRequest) bool {
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: " + string(rune('0'+len(r.body))) + "\r\n\r\n" + string(r.body)))
			return true
		})
		g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
		rc := dialGateway(t, g)
		rc.send(chunkedWithLength("http://t.example/"))
		resp, body := rc.read("POST")
		if resp.StatusCode != 200 || body != "abc" {
			t.Fatalf("%s %q, want 200 with the chunked body", resp.Status, body)
		}
		if !resp.Close {
			t.Fatal("the answer does not say close")
		}
		if !rc.closed() {
			t.Fatal("the connection stays open")
		}
		reqs, _ := up.seen()
		if len(reqs) != 1 || reqs[0].header.Get("Content-Length") != "" {
			t.Fatalf("the proxy saw %d requests, Content-Length %q", len(reqs), reqs[0].header.Get("Content-Length"))
		}
	})
	t.Run("slow", func(t *testing.T) {
		_, pk := fleet(t, 1)
		g := startGateway(t, pk, nil)
		tg := newTarget(t, false)
		rc := dialGateway(t, g)
		// A head larger than the lean path's buffer goes to net/http.
		rc.send(chunkedWithLength(tg.srv.URL+"/", "Cookie: "+strings.Repeat("k", 12<<10)+"\r\n"))
		resp, body := rc.read("POST")
		if resp.StatusCode != 200 || body != "hello from target" || resp.Header.Get("X-Body") != "abc" {
			t.Fatalf("%s %q body sent %q", resp.Status, body, resp.Header.Get("X-Body"))
		}
		if !resp.Close {
			t.Fatal("the answer does not say close")
		}
		if !rc.closed() {
			t.Fatal("the connection stays open")
		}
	})
}
