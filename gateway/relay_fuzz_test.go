package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// answerWith makes b the answer to every plain request from now on
// (empty: the proxy's own, "ok").
func (p *recordingProxy) answerWith(b []byte) {
	p.mu.Lock()
	p.reply = bytes.Clone(b)
	p.mu.Unlock()
}

// FuzzRelay drives whole requests through the gateway's relay to a
// recording proxy, and (when answer is not empty) the proxy's answers
// back: the proxy writes answer to each request it parses, then closes.
// Whatever both send:
//
//   - the gateway neither panics nor hangs: it ends the connection (its
//     timeouts are short here);
//   - the proxy, parsing with net/http (a third parser, as squid is),
//     never meets bytes it cannot parse as a request, nor a request
//     nobody sent as one;
//   - the client can parse every answer the gateway writes;
//   - the answers that name a proxy (carried) are at most the requests
//     the proxy parsed, and with the proxy's own well-formed answers
//     exactly as many.
//
// Its seed corpus (the hostile table, and answers a proxy may give)
// runs in plain go test.
func FuzzRelay(f *testing.F) {
	for _, c := range hostileCases() {
		if len(c.raw) < 4<<10 {
			f.Add([]byte(c.raw), []byte(nil))
		}
	}
	f.Add([]byte(post("Transfer-Encoding: chunked\r\n", "3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\n")+getWith("")), []byte(nil))
	f.Add([]byte(post("Content-Length: 3\r\nExpect: 100-continue\r\n", "abc")+post("Content-Length: 0\r\n", "")), []byte(nil))
	for _, a := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nbody",
		"HTTP/1.0 200 OK\r\n\r\nuntil the close",
		"HTTP/1.1 200 OK\nX-A: a\n b\nContent-Length: 2\n\nok",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
	} {
		f.Add([]byte(getWith("")+post("Content-Length: 3\r\n", "abc")), []byte(a))
	}
	up := newRecordingProxy(f)
	g := startGateway(f, newPicker(Proxy{ID: "p1", Addr: up.addr()}), func(c *Config) {
		c.MaxHeaderBytes = hMaxBytes
		c.MaxHeaderFields = hMaxFields
		c.HeaderTimeout = 200 * time.Millisecond
		c.KeepAliveTimeout = 200 * time.Millisecond
		c.IdleTimeout = 200 * time.Millisecond
		c.ResponseTimeout = 5 * time.Second
	})
	f.Fuzz(func(t *testing.T, raw, answer []byte) {
		if bytes.Contains(raw, []byte("CONNECT")) {
			return // a tunnel's bytes are the client's to send
		}
		up.answerWith(answer)
		before, _ := up.seen()
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = c.Write(raw)
		br := bufio.NewReader(c)
		carried := 0
		for {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("the gateway neither answered nor closed within 20s")
				}
				if !closedErr(err) {
					t.Fatalf("an answer of the gateway's does not parse: %v", err)
				}
				break
			}
			if resp.Header.Get(HeaderProxy) != "" {
				carried++
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				if !closedErr(err) {
					t.Fatalf("an answer's body from the gateway does not parse: %v", err)
				}
				break
			}
		}
		after, errs := up.seen()
		if len(errs) > 0 {
			t.Fatalf("the proxy could not parse what it was sent: %v", errs)
		}
		for _, r := range after[len(before):] {
			if smuggled(r) {
				t.Fatalf("a smuggled request reached the proxy: %s %s %v", r.method, r.uri, r.header)
			}
		}
		got := len(after) - len(before)
		if carried > got || len(answer) == 0 && carried != got {
			t.Fatalf("the proxy parsed %d requests, the client got %d answers of its", got, carried)
		}
	})
}

// closedErr says whether err is a connection's end (its close, or a
// reset), not bytes that do not parse.
func closedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}
