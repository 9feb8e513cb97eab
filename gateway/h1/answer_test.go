package h1

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAppendStart: the start of an answer, completed, is read back by
// net/http and by Head.Parse with its status and date.
func TestAppendStart(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	b := AppendStart(nil, http.StatusProxyAuthRequired, now)
	b = append(b, "Content-Length: 0\r\n\r\n"...)
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(b))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != "407 Proxy Authentication Required" || resp.Header.Get("Date") != "Fri, 02 Jan 2026 02:04:05 GMT" {
		t.Fatalf("%s, Date %q", resp.Status, resp.Header.Get("Date"))
	}
	var h Head
	if err := h.Parse(b, false); err != nil || h.Status() != http.StatusProxyAuthRequired {
		t.Fatalf("Parse: %v, status %d", err, h.Status())
	}
}
