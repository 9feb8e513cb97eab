package health

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
)

// NonceParam is the query parameter of a probe's nonce.
const NonceParam = "nonce"

// ProbePath is where a health process serves its own probe target.
const ProbePath = "/probe"

// Bounds of the request report of ProbeHandler: at most this many header
// lines, and this many bytes of header names and values.
const (
	maxReportHeaders = 64
	maxReportBytes   = 8 << 10
)

// probeReport is the second line of ProbeHandler's answer: what reached
// the target.
type probeReport struct {
	V int `json:"v"`
	// Egress is the address (no port) the request came from: the
	// proxy's egress.
	Egress string `json:"egress"`
	// Headers are the request's header lines, [name, value], sorted by
	// name, at most maxReportHeaders of them and maxReportBytes of names
	// and values; the values of Authorization and Proxy-Authorization
	// are replaced by "redacted".
	Headers [][]string `json:"headers"`
	// Truncated is set when headers were left out by those bounds.
	Truncated bool `json:"truncated,omitempty"`
}

// reportVersion is the version of the report's format.
const reportVersion = 1

// redactedValue replaces the value of a credentials header in a report.
const redactedValue = "redacted"

// ProbeHandler is the probe target a health process serves: GET
// /probe?nonce=N (N: letters, digits, '-' and '_', up to 128) answers 200
// with two lines: N, then a JSON object that reports the request that
// reached it:
//
//	N
//	{"v":1,"egress":"198.51.100.7","headers":[["User-Agent","proxyfleet-health"],["Via","1.1 squid"]]}
//
// egress is the address the connection came from (the proxy's, as the
// target sees it); headers are the request's header lines (not Host),
// sorted by name, at most 64 lines and 8 KiB of names and values
// ("truncated":true when some were left out), with the values of
// Authorization and Proxy-Authorization replaced by "redacted". A prober
// that only looks for N in the body (an earlier health process, or any
// Expect) is not confused: N is alone on the first line.
func ProbeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.URL.Query().Get(NonceParam)
		if n == "" || len(n) > 128 || strings.TrimFunc(n, func(c rune) bool {
			return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		}) != "" {
			http.Error(w, "want ?nonce=[A-Za-z0-9_-]{1,128}", http.StatusBadRequest)
			return
		}
		rep := probeReport{V: reportVersion, Headers: [][]string{}}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			rep.Egress = ap.Addr().Unmap().String()
		}
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		slices.Sort(names)
		size := 0
	names:
		for _, k := range names {
			for _, v := range r.Header[k] {
				if k == "Authorization" || k == "Proxy-Authorization" {
					v = redactedValue
				}
				if len(rep.Headers) == maxReportHeaders || size+len(k)+len(v) > maxReportBytes {
					rep.Truncated = true
					break names
				}
				size += len(k) + len(v)
				rep.Headers = append(rep.Headers, []string{k, v})
			}
		}
		body, err := json.Marshal(rep)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, n+"\n"+string(body)+"\n")
	})
}

// parseReport reads ProbeHandler's report from body, strictly: the nonce
// alone on the first line, then one line of JSON in exactly the format
// above (no unknown field, version 1, an IP as egress, header names that
// are tokens, pairs of two), then nothing. Anything else is no report
// (nil): the target is not health's /probe, or something in between
// changed its answer.
func parseReport(body []byte, nonce string) *probeReport {
	rest, ok := strings.CutPrefix(string(body), nonce+"\n")
	if !ok || rest == "" {
		return nil
	}
	line, ok := strings.CutSuffix(rest, "\n")
	if !ok || strings.Contains(line, "\n") {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	var rep probeReport
	if err := dec.Decode(&rep); err != nil || dec.More() || rep.V != reportVersion || rep.Headers == nil {
		return nil
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil
	}
	a, err := netip.ParseAddr(rep.Egress)
	if err != nil {
		return nil
	}
	rep.Egress = a.Unmap().String()
	for _, h := range rep.Headers {
		if len(h) != 2 || !validHeaderName(h[0]) {
			return nil
		}
	}
	return &rep
}

// validHeaderName reports whether s is a header name (an RFC 9110 token)
// of reasonable length.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// leak returns why the request the report describes shows the proxy
// leaky, or "": it carried Proxy-Authorization (the proxy forwarded the
// fleet's credentials), or a header whose value holds client, the address
// the proxy got the request from (X-Forwarded-For, Forwarded, Via with
// an address, ...).
func (rep *probeReport) leak(client netip.Addr) string {
	for _, h := range rep.Headers {
		if textproto.CanonicalMIMEHeaderKey(h[0]) == "Proxy-Authorization" {
			return "leaky: Proxy-Authorization reached the target (the proxy forwarded the fleet's credentials)"
		}
	}
	if !client.IsValid() {
		return ""
	}
	for _, h := range rep.Headers {
		if holdsAddr(h[1], client) {
			return "leaky: " + textproto.CanonicalMIMEHeaderKey(h[0]) + " carries the client's address"
		}
	}
	return ""
}

// holdsAddr reports whether the header value v holds the address a, as an
// address of its own (10.0.0.1 does not hold 10.0.0.12): v is cut into
// runs of the characters addresses are written with, each read as an
// address, an address:port, or one with its trailing colons cut.
func holdsAddr(v string, a netip.Addr) bool {
	words := strings.FieldsFunc(v, func(r rune) bool {
		return !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F' || r == '.' || r == ':')
	})
	for _, w := range words {
		if b, err := netip.ParseAddr(w); err == nil && b.Unmap() == a {
			return true
		}
		if ap, err := netip.ParseAddrPort(w); err == nil && ap.Addr().Unmap() == a {
			return true
		}
		if t := strings.TrimRight(w, ":"); t != w {
			if b, err := netip.ParseAddr(t); err == nil && b.Unmap() == a {
				return true
			}
		}
	}
	return false
}
