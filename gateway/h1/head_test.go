package h1

import (
	"bufio"
	"errors"
	"strings"
	"testing"
)

// TestHeadParse: what the parser takes, and why it refuses a request
// (the status its error carries) or an answer (the proxy's failure).
func TestHeadParse(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		request   bool
		want      error
		check     func(t *testing.T, h *Head)
	}{
		{"plain", "GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A:  1 \r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if len(h.Fields) != 2 || string(h.Fields[1].Value) != "1" || h.Fields[0].Kind != KindHost || h.Length != -1 || !h.Idempotent {
				t.Fatalf("%+v", h)
			}
		}},
		{"connection tokens", "GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close, X-Gone\r\nx-gone: 1\r\nKeep-Alive: 1\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if !h.Close || h.Fields[2].Kind != KindHop || h.Fields[3].Kind != KindHop {
				t.Fatalf("%+v", h)
			}
		}},
		{"http/1.0", "HEAD http://a/ HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if !h.HTTP10 || !h.KeepAlive || !h.IsHead {
				t.Fatalf("%+v", h)
			}
		}},
		{"same length twice", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if h.Length != 3 || h.Idempotent {
				t.Fatalf("%+v", h)
			}
		}},
		{"credentials", "GET http://a/ HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Basic x\r\nProxy-Authorization: Basic y\r\nX-Proxyfleet-Session: s\r\nX-Proxyfleet-Labels: a=b\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if string(h.Auth) != "Basic x" || h.Fields[3].Kind != KindOther {
				t.Fatalf("%+v", h)
			}
		}},
		{"bare LF request", "GET http://a/ HTTP/1.1\nHost: a\n\n", true, ErrSyntax, nil},
		{"obs-fold request", "GET http://a/ HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n", true, ErrSyntax, nil},
		{"space before colon", "GET http://a/ HTTP/1.1\r\nX-A : 1\r\n\r\n", true, ErrSyntax, nil},
		{"control in value", "GET http://a/ HTTP/1.1\r\nX-A: 1\x002\r\n\r\n", true, ErrSyntax, nil},
		{"HTTP/2.0", "GET http://a/ HTTP/2.0\r\n\r\n", true, ErrVersion, nil},
		{"version lowercase", "GET http://a/ http/1.1\r\nHost: a\r\n\r\n", true, ErrSyntax, nil},
		{"space in target", "GET http://a/ b HTTP/1.1\r\n\r\n", true, ErrSyntax, nil},
		{"chunked and length", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if !h.Chunked || h.Length != -1 || !h.Both || !h.Close {
				t.Fatalf("chunked %v length %d both %v close %v; want chunked, no length, closing", h.Chunked, h.Length, h.Both, h.Close)
			}
		}},
		{"two lengths", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", true, ErrFraming, nil},
		{"bad length", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n", true, ErrFraming, nil},
		{"gzip coding", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", true, ErrCoding, nil},
		{"chunked not final", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n", true, ErrFraming, nil},
		{"chunked twice", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", true, ErrFraming, nil},
		{"chunked in 1.0", "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", true, ErrFraming, nil},
		{"chunked over two fields", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\nTransfer-Encoding: Chunked\r\n\r\n", true, nil, func(t *testing.T, h *Head) {
			if !h.Chunked {
				t.Fatalf("%+v", h)
			}
		}},
		{"no Host in 1.1", "GET http://a/ HTTP/1.1\r\n\r\n", true, ErrHost, nil},
		{"two Hosts", "GET http://a/ HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", true, ErrHost, nil},
		{"bad Host", "GET http://a/ HTTP/1.1\r\nHost: u@a\r\n\r\n", true, ErrHost, nil},
		{"no Host in 1.0", "GET http://a/ HTTP/1.0\r\n\r\n", true, nil, nil},
		{"odd expectation", "POST http://a/ HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n", true, ErrExpect, nil},
		{"answer", "HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", false, nil, func(t *testing.T, h *Head) {
			if h.Status() != 204 || string(h.Line[2]) != "No Content" {
				t.Fatalf("%+v", h)
			}
		}},
		{"answer without reason", "HTTP/1.1 200\r\n\r\n", false, nil, nil},
		{"answer LF and fold", "HTTP/1.0 200 OK\nX-A: 1\n\t2\nConnection: keep-alive\n\n", false, nil, func(t *testing.T, h *Head) {
			if !h.HTTP10 || !h.KeepAlive || strings.Join(strings.Fields(string(h.Fields[0].Value)), " ") != "1 2" {
				t.Fatalf("%+v", h)
			}
		}},
		{"answer chunked wins", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n", false, nil, func(t *testing.T, h *Head) {
			if !h.Chunked || h.Length != -1 {
				t.Fatalf("%+v", h)
			}
		}},
		{"bad status", "HTTP/1.1 2000 OK\r\n\r\n", false, ErrSyntax, nil},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", false, ErrSyntax, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h Head
			raw := []byte(c.raw)
			err := h.Parse(raw, c.request)
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Fatalf("parse: %v, want %v", err, c.want)
			}
			if err == nil && c.check != nil {
				c.check(t, &h)
			}
		})
	}
}

// TestPeekHead: a head's end is found in the buffer, however it came.
func TestPeekHead(t *testing.T) {
	for _, c := range []struct {
		in     string
		strict bool
		want   string
		err    error
	}{
		{"GET / HTTP/1.1\r\n\r\nbody\n\nmore", true, "GET / HTTP/1.1\r\n\r\n", nil},
		{"GET / HTTP/1.1\n\n", true, "", ErrSyntax},
		{"HTTP/1.1 200 OK\n\nbody", false, "HTTP/1.1 200 OK\n\n", nil},
		{"HTTP/1.1 200 OK\r\nA: b\r\n\r\n", false, "HTTP/1.1 200 OK\r\nA: b\r\n\r\n", nil},
		{strings.Repeat("x", 100), true, "", ErrTooLarge},
	} {
		br := bufio.NewReaderSize(strings.NewReader(c.in), 64)
		raw, err := PeekHead(br, c.strict, nil)
		if string(raw) != c.want || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("%q: %q %v, want %q %v", c.in, raw, err, c.want, c.err)
		}
	}
}

// FuzzHeadParse: no head makes the parser panic, and what it takes
// says a framing it can keep.
func FuzzHeadParse(f *testing.F) {
	for _, s := range []string{
		"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: x, close\r\nx: 1\r\n\r\n",
		"HTTP/1.1 200 OK\nA: 1\n b\nContent-Length: 3\nTransfer-Encoding: chunked\n\n",
		"POST http://a/ HTTP/1.0\r\nContent-Length: 12\r\nExpect: 100-continue\r\n\r\n",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, raw []byte, request bool) {
		var h Head
		if err := h.Parse(raw, request); err != nil {
			return
		}
		if h.Chunked && h.Length >= 0 || h.Length < -1 {
			t.Fatalf("framing %v %d", h.Chunked, h.Length)
		}
	})
}
