package gateway

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"proxyfleet/gateway/h1"
)

// TestReadConnectAnswer: the proxy's answer to CONNECT is read by the
// gateway's parser: its status, X-Squid-Error and the body passed on
// (by its length, chunked, or until the close; at most the bound); what
// follows a 200 stays in the reader; an answer that is not HTTP is the
// proxy's failure, never a refusal of the client's head.
func TestReadConnectAnswer(t *testing.T) {
	for _, c := range []struct {
		name, raw         string
		status            int
		squid, body, rest string
	}{
		{"200", "HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-greeting", 200, "", "", "SSH-2.0-greeting"},
		{"length", "HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\nContent-Length: 4\r\n\r\npage", 503, "ERR_CONNECT_FAIL 111", "page", ""},
		{"chunked", "HTTP/1.1 403 Forbidden\r\nx-squid-error: ERR_ACCESS_DENIED 0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\npa\r\n2\r\nge\r\n0\r\n\r\n", 403, "ERR_ACCESS_DENIED 0", "page", ""},
		{"until close", "HTTP/1.0 503 Service Unavailable\r\nX-Squid-Error: ERR_DNS_FAIL 0\r\n\r\npage", 503, "ERR_DNS_FAIL 0", "page", ""},
		{"bounded", "HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n" + strings.Repeat("p", targetBodyBytes+10), 503, "ERR_CONNECT_FAIL 111", strings.Repeat("p", targetBodyBytes), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(c.raw), 1024)
			var h h1.Head
			if err := readConnectAnswer(br, &h); err != nil {
				t.Fatal(err)
			}
			if h.Status() != c.status || squidError(&h) != c.squid {
				t.Fatalf("status %d, X-Squid-Error %q", h.Status(), squidError(&h))
			}
			if c.status == 200 {
				if rest, _ := br.Peek(br.Buffered()); string(rest) != c.rest {
					t.Fatalf("left %q, want %q", rest, c.rest)
				}
				return
			}
			if b := readAnswerBody(br, &h, targetBodyBytes); string(b) != c.body {
				t.Fatalf("body %q, want %q", b, c.body)
			}
		})
	}
	var h h1.Head
	err := readConnectAnswer(bufio.NewReader(strings.NewReader("SSH-2.0-not-http\r\n\r\n")), &h)
	var he *h1.Error
	var ue *upstreamError
	if !errors.As(err, &ue) || errors.As(err, &he) {
		t.Fatalf("not HTTP: %v, want the proxy's failure", err)
	}
}
