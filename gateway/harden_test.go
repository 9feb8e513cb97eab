package gateway

import (
	"io"
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

// TestPoisonedUpstreamNotReused: a proxy that sends more than its
// answer (bytes after its length or its last chunk, a body to HEAD, a
// second answer sent a moment later) does not have that taken for the
// next request's answer, another user's on another connection: the
// connection is not kept, or is found unusable before it is used.
func TestPoisonedUpstreamNotReused(t *testing.T) {
	const bogus = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nbogus!"
	for _, c := range []struct {
		name, method, answer string
		late                 bool // the bogus answer comes in a write of its own, after the real one was read
	}{
		{"after its length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + bogus, false},
		{"after its last chunk", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + bogus, false},
		{"a body to HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
		{"length with chunked", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", false},
		{"later", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := make(chan struct{})
			written := make(chan struct{})
			up := newScriptProxy(t, func(conn net.Conn, r *seenRequest) bool {
				if strings.HasSuffix(r.uri, "/next") {
					_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext")
					return true
				}
				_, _ = io.WriteString(conn, c.answer)
				if c.late {
					<-read
					_, _ = io.WriteString(conn, bogus)
					close(written)
				}
				return true
			})
			g := startGateway(t, newPicker(Proxy{ID: "p1", Addr: up.addr()}), nil)
			first := dialGateway(t, g)
			first.send(strings.Replace(get1("http://t.example/first"), "GET", c.method, 1))
			if resp, _ := first.read(c.method); resp.StatusCode != 200 {
				t.Fatalf("first: %s", resp.Status)
			}
			if c.late {
				close(read)
				<-written
			}
			next := dialGateway(t, g)
			next.send("GET http://t.example/next HTTP/1.1\r\nHost: x\r\nProxy-Authorization: " + basic("bob", bobPass) + "\r\n\r\n")
			if resp, body := next.read("GET"); resp.StatusCode != 200 || body != "next" {
				t.Fatalf("the next request got %s %q, want its own answer %q", resp.Status, body, "next")
			}
			if r := g.Gateway.picker.(*fakePicker).gotReports(); len(r) != 0 {
				t.Fatalf("reports %v", r)
			}
		})
	}
}
