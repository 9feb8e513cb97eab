package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
)

// The gateway reads every request head with this parser, and the lean
// HTTP/1.1 path (serve.go, relay.go) every answer's: no allocation, the
// fields as slices of the head's bytes, and strict. A request it does
// not take (anything but CRLF lines of token names and visible values,
// HTTP/1.0 or 1.1, one Host in 1.1, at most one framing) is refused
// with the status its headError carries, and its connection closed; a
// response it does not take is the proxy's failure.

// fieldKind is what the gateway does with a header field.
type fieldKind uint8

const (
	fieldOther              fieldKind = iota // forwarded as it is
	fieldHop                                 // a connection's own: never forwarded
	fieldConnection                          // Connection (hop)
	fieldProxyConnection                     // Proxy-Connection (hop)
	fieldContentLength                       // framing: written by the gateway
	fieldTransferEncoding                    // framing: written by the gateway
	fieldHost                                // replaced by the request target's
	fieldProxyAuthorization                  // the client's credential (hop)
	fieldExpect                              // handled by the gateway
)

// kindOf classifies a field name (any case).
func kindOf(name []byte) fieldKind {
	eq := func(s string) bool { return len(name) == len(s) && asciiEqualFold(name, s) }
	switch len(name) {
	case 2:
		if eq("Te") {
			return fieldHop
		}
	case 4:
		if eq("Host") {
			return fieldHost
		}
	case 6:
		if eq("Expect") {
			return fieldExpect
		}
	case 7:
		if eq("Upgrade") || eq("Trailer") {
			return fieldHop
		}
	case 10:
		if eq("Connection") {
			return fieldConnection
		}
		if eq("Keep-Alive") {
			return fieldHop
		}
	case 14:
		if eq("Content-Length") {
			return fieldContentLength
		}
	case 16:
		if eq("Proxy-Connection") {
			return fieldProxyConnection
		}
	case 17:
		if eq("Transfer-Encoding") {
			return fieldTransferEncoding
		}
	case 18:
		if eq("Proxy-Authenticate") {
			return fieldHop
		}
	case 19:
		if eq("Proxy-Authorization") {
			return fieldProxyAuthorization
		}
	}
	return fieldOther
}

// asciiEqualFold compares b with s (ASCII letters in any case).
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// field is one header line: name and value (trimmed) point into the head.
type field struct {
	name, value []byte
	kind        fieldKind
}

// maxConnTokens bounds the field names a Connection header may name.
const maxConnTokens = 8

// head is a parsed message head. Its slices point into the bytes it was
// parsed from, valid until the reader they came from reads again.
type head struct {
	line   [3][]byte // request: method, target, version; response: version, code, reason
	fields []field   // in order, reused from head to head
	http10 bool      // HTTP/1.0 (keep-alive only when asked)
	// A request's method, known once (the head's bytes do not outlive
	// its consumption): HEAD, and one a proxy may be sent again
	// (idempotent, as http.Transport's isReplayable).
	isHead, idempotent bool

	close, keepAlive bool  // Connection (or Proxy-Connection): close, keep-alive
	length           int64 // Content-Length, -1 without
	chunked          bool  // Transfer-Encoding: chunked
	// both: Content-Length came with Transfer-Encoding: chunked (framed
	// as chunked, its length dropped). RFC 9112 6.1: the connection
	// closes after the answer (a request's) or is not kept (a proxy's).
	both      bool
	expect100 bool // Expect: 100-continue
	// Transfer-Encoding, over all its fields: present, how many chunked
	// codings, and any other coding.
	te, teOther bool
	teChunked   int
	hosts       int  // Host fields (a request's)
	badHost     bool // one of them is no host[:port]

	auth []byte // the first Proxy-Authorization, nil without

	connTokens [maxConnTokens][]byte // other names Connection lists (hop)
	nTokens    int
}

// headError is why a head is refused, with the status a request is
// refused with (RFC 9112; a response's is the proxy's failure).
type headError struct {
	status int
	text   string
}

func (e *headError) Error() string { return e.text }

// Why a head is refused.
var (
	errHeadSyntax   = &headError{http.StatusBadRequest, "malformed request head"}
	errHeadTooLarge = &headError{http.StatusRequestHeaderFieldsTooLarge, "request head too large"}
	// errHeadFraming: a body's length that cannot be known (RFC 9112
	// 6.3): Content-Length values that disagree or are not digits,
	// Transfer-Encoding whose final coding is not chunked, or in an
	// HTTP/1.0 message; or more Connection options than the gateway
	// keeps.
	errHeadFraming = &headError{http.StatusBadRequest, "bad message framing"}
	// errHeadCoding: a transfer coding besides chunked (RFC 9112 6.1).
	errHeadCoding  = &headError{http.StatusNotImplemented, "transfer coding not implemented"}
	errHeadExpect  = &headError{http.StatusExpectationFailed, "expectation not supported"}
	errHeadVersion = &headError{http.StatusHTTPVersionNotSupported, "HTTP version not supported"}
	// errHeadHost: an HTTP/1.1 request without exactly one Host, or
	// with a Host that is no host[:port] (RFC 9112 3.2).
	errHeadHost = &headError{http.StatusBadRequest, "a request needs exactly one valid Host"}
)

// tchar is RFC 9110's token character set.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return
}()

// validValue: visible ASCII, SP, HTAB and obs-text (bytes over 0x7f);
// no other control.
func validValue(v []byte) bool {
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// parse parses raw (a whole head, its empty line included). request:
// the first line is a request line, and the head is taken strictly
// (CRLF line ends, no obs-fold: what is not is refused);
// else a status line, taken as http.Transport does (LF line ends too,
// obs-fold unfolded in place to spaces, RFC 9112 5.2).
func (h *head) parse(raw []byte, request bool) error {
	*h = head{fields: h.fields[:0], length: -1}
	if !request {
		unfold(raw)
	}
	line, rest, ok := nextLine(raw, request)
	if !ok {
		return errHeadSyntax
	}
	if err := h.parseFirst(line, request); err != nil {
		return err
	}
	for {
		line, rest, ok = nextLine(rest, request)
		if !ok {
			return errHeadSyntax
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return errHeadSyntax // no name, or obs-fold (a line starting with SP)
		}
		f := field{name: line[:colon], value: trimOWS(line[colon+1:])}
		if !isToken(f.name) || !validValue(f.value) {
			return errHeadSyntax
		}
		f.kind = kindOf(f.name)
		if err := h.note(&f); err != nil {
			return err
		}
		h.fields = append(h.fields, f)
	}
	if err := h.framing(request); err != nil {
		return err
	}
	if h.chunked && h.length >= 0 {
		// Chunked wins (RFC 9112 6.3, as net/http); the length is not
		// forwarded, and the connection is not used again.
		h.length, h.both = -1, true
		if request {
			h.close = true
		}
	}
	if h.nTokens > 0 {
		for i := range h.fields {
			f := &h.fields[i]
			for _, t := range h.connTokens[:h.nTokens] {
				if asciiEqualFold(f.name, string(t)) {
					f.kind = fieldHop
				}
			}
		}
	}
	return nil
}

// nextLine cuts b's first line (its CRLF, or LF unless strict, off).
func nextLine(b []byte, strict bool) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, nil, false
	}
	line, rest = b[:i], b[i+1:]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	} else if strict {
		return nil, nil, false
	}
	return line, rest, true
}

// unfold turns every obs-fold (a line end followed by SP or HTAB) of a
// head into spaces.
func unfold(raw []byte) {
	for i := bytes.IndexByte(raw, '\n'); i >= 0 && i+1 < len(raw); {
		if raw[i+1] == ' ' || raw[i+1] == '\t' {
			raw[i] = ' '
			if i > 0 && raw[i-1] == '\r' {
				raw[i-1] = ' '
			}
		}
		j := bytes.IndexByte(raw[i+1:], '\n')
		if j < 0 {
			return
		}
		i += 1 + j
	}
}

func (h *head) parseFirst(line []byte, request bool) error {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return errHeadSyntax
	}
	h.line[0] = line[:sp1]
	rest := line[sp1+1:]
	if request {
		sp2 := bytes.IndexByte(rest, ' ')
		if sp2 <= 0 {
			return errHeadSyntax
		}
		h.line[1], h.line[2] = rest[:sp2], rest[sp2+1:]
		if !isToken(h.line[0]) || !validValue(h.line[1]) || bytes.IndexByte(h.line[1], ' ') >= 0 || bytes.IndexByte(h.line[1], '\t') >= 0 {
			return errHeadSyntax
		}
		switch string(h.line[0]) {
		case "HEAD":
			h.isHead, h.idempotent = true, true
		case "GET", "OPTIONS", "TRACE":
			h.idempotent = true
		}
		return h.version(h.line[2])
	}
	if err := h.version(h.line[0]); err != nil {
		return err
	}
	code, reason, _ := bytes.Cut(rest, []byte{' '})
	if len(code) != 3 || code[0] < '1' || code[0] > '9' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' || !validValue(reason) {
		return errHeadSyntax
	}
	h.line[1], h.line[2] = code, reason
	return nil
}

func (h *head) version(v []byte) error {
	switch string(v) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		h.http10 = true
	default:
		if len(v) == len("HTTP/1.1") && bytes.HasPrefix(v, []byte("HTTP/")) && isDigit(v[5]) && v[6] == '.' && isDigit(v[7]) {
			return errHeadVersion // well formed, not 1.x (RFC 9110 15.6.6)
		}
		return errHeadSyntax
	}
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// status is a response head's code.
func (h *head) status() int {
	c := h.line[1]
	return int(c[0]-'0')*100 + int(c[1]-'0')*10 + int(c[2]-'0')
}

// note takes what the gateway needs from a field.
func (h *head) note(f *field) error {
	switch f.kind {
	case fieldConnection, fieldProxyConnection:
		for v := f.value; len(v) > 0; {
			var t []byte
			t, v = nextListItem(v)
			switch {
			case len(t) == 0:
			case asciiEqualFold(t, "close"):
				h.close = true
			case asciiEqualFold(t, "keep-alive"):
				h.keepAlive = true
			case f.kind == fieldProxyConnection:
			case !isToken(t):
				return errHeadSyntax
			case h.nTokens == maxConnTokens:
				return errHeadFraming
			default:
				h.connTokens[h.nTokens] = t
				h.nTokens++
			}
		}
	case fieldContentLength:
		n, ok := parseLength(f.value)
		if !ok || h.length >= 0 && h.length != n {
			return errHeadFraming
		}
		h.length = n
	case fieldTransferEncoding:
		// The codings of every Transfer-Encoding field, in order; the
		// message is chunked if the last is (checked by framing).
		h.te = true
		for v := f.value; len(v) > 0; {
			var t []byte
			t, v = nextListItem(v)
			switch {
			case len(t) == 0:
			case asciiEqualFold(t, "chunked"):
				h.teChunked++
				h.chunked = true
			default:
				h.teOther = true
				h.chunked = false
			}
		}
	case fieldHost:
		h.hosts++
		h.badHost = h.badHost || !validHostField(f.value)
	case fieldExpect:
		if !asciiEqualFold(f.value, "100-continue") {
			return errHeadExpect
		}
		h.expect100 = true
	case fieldProxyAuthorization:
		if h.auth == nil {
			h.auth = f.value
		}
	}
	return nil
}

// framing checks what the fields say of the body once all are read: a
// Transfer-Encoding of exactly one final chunked (RFC 9112 6.1: chunked
// not final, or twice, 400; another coding, 501) and not in HTTP/1.0
// (faulty framing); a request's Host (RFC 9112 3.2: an HTTP/1.1 one has
// exactly one).
func (h *head) framing(request bool) error {
	if h.te {
		switch {
		case request && h.http10:
			return errHeadFraming
		case !h.chunked || h.teChunked > 1:
			return errHeadFraming
		case h.teOther:
			return errHeadCoding
		}
	}
	if request && (h.hosts > 1 || h.hosts == 0 && !h.http10 || h.badHost) {
		return errHeadHost
	}
	return nil
}

// validHostField says whether a Host value may be a uri-host with an
// optional port (RFC 3986: unreserved, pct-encoded, sub-delims, ':' and
// IPv6 brackets); empty is taken (RFC 9112 3.2). The proxy is sent the
// target's authority, never this value.
func validHostField(v []byte) bool {
	for _, c := range v {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case bytes.IndexByte([]byte("-._~%!$&'()*+,;=:[]"), c) >= 0:
		default:
			return false
		}
	}
	return true
}

// nextListItem cuts the first item (OWS trimmed; empty ones are allowed,
// RFC 9110 5.6.1) off a comma-separated field value.
func nextListItem(v []byte) (item, rest []byte) {
	item, rest, _ = bytes.Cut(v, []byte{','})
	return trimOWS(item), rest
}

// parseLength parses a Content-Length value: digits only, under 2^62.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// peekHead waits for a whole head in br's buffer and returns it (not
// consumed: br.Discard(len) once done with it). errHeadTooLarge when it
// does not fit the buffer. strict: a bare LF line end is errHeadSyntax
// (a request's; an answer's may end its lines so). beforeWait (if not
// nil) runs once, before the first wait for more of a head begun.
func peekHead(br *bufio.Reader, strict bool, beforeWait func() error) ([]byte, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		i := bytes.Index(buf, []byte("\n\r\n"))
		j := bytes.Index(buf, []byte("\n\n"))
		switch {
		case strict && (j >= 0 && (i < 0 || j < i) || i == 0 || i > 0 && buf[i-1] != '\r'):
			return nil, errHeadSyntax
		case j >= 0 && (i < 0 || j < i):
			return buf[:j+2], nil
		case i >= 0:
			return buf[:i+3], nil
		}
		if len(buf) == br.Size() {
			return nil, errHeadTooLarge
		}
		if beforeWait != nil && len(buf) > 0 {
			if err := beforeWait(); err != nil {
				return nil, err
			}
			beforeWait = nil
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if len(buf) > 0 && errors.Is(err, bufio.ErrBufferFull) {
				return nil, errHeadTooLarge
			}
			return nil, err
		}
	}
}

// readLongHead reads an answer's head that does not fit br's buffer,
// line by line, into *acc (up to limit bytes), and consumes it.
func readLongHead(br *bufio.Reader, acc *[]byte, limit int) ([]byte, error) {
	b := (*acc)[:0]
	lineStart := 0
	for {
		line, err := br.ReadSlice('\n')
		if len(b)+len(line) > limit {
			return nil, errHeadTooLarge
		}
		b = append(b, line...)
		*acc = b
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue // the same line goes on
		case err != nil:
			return nil, err
		}
		l := bytes.TrimSuffix(b[lineStart:len(b)-1], []byte{'\r'}) // LF line ends too (an answer's)
		if len(l) == 0 && lineStart > 0 {
			return b, nil
		}
		lineStart = len(b)
	}
}
