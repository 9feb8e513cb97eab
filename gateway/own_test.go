package gateway

import (
	"testing"

	"proxyfleet/gateway/h1"
)

// TestMarkOwn: the gateway's own fields are marked a connection's own
// (never forwarded) and a request's options are the first of each; a
// field of another name is left as it is.
func TestMarkOwn(t *testing.T) {
	var h h1.Head
	raw := "GET http://a/ HTTP/1.1\r\nHost: a\r\nX-Proxyfleet-Session: s\r\nx-proxyfleet-labels: a=b\r\nX-Proxyfleet-Session: t\r\n" +
		"X-Proxyfleet-Ban: 1h\r\nX-Proxyfleet-Proxy: p\r\nX-Proxyfleet-Egress: 198.18.0.1\r\nX-Proxyfleet-Other: 1\r\n\r\n"
	if err := h.Parse([]byte(raw), true); err != nil {
		t.Fatal(err)
	}
	var o ownFields
	markOwn(&h, &o)
	if string(o.session) != "s" || string(o.labels) != "a=b" || string(o.ban) != "1h" || !o.hasSession || !o.hasLabels || !o.hasBan {
		t.Fatalf("options %+v", o)
	}
	for i, f := range h.Fields {
		want := h1.KindHop
		switch i {
		case 0:
			want = h1.KindHost
		case len(h.Fields) - 1:
			want = h1.KindOther
		}
		if f.Kind != want {
			t.Errorf("%s: kind %d, want %d", f.Name, f.Kind, want)
		}
	}
}
