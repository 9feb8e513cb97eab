// Package h1 is HTTP/1.1 framing (RFC 9112) for the gateway, its one
// parser: a request head is read with PeekHead (or ReadLongHead, for
// one larger than the reader's buffer) and parsed by Head.Parse without
// allocation, the fields as slices of the head's bytes, and strictly. A
// request it does not take (anything but CRLF lines of token names and
// visible values, HTTP/1.0 or 1.1, one Host in 1.1, at most one
// framing) is an *Error carrying the status to refuse it with; an
// answer's head is taken as http.Transport takes it, and one it does
// not take is an error too (the proxy's failure). ReadChunkSize,
// ReadCRLF and ReadTrailers read a chunked body's framing; AppendStart
// writes the start of an answer.
//
// It knows nothing of users, proxies, sessions or bans: a field it
// does not define is KindOther, for its user to judge.
package h1

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
)

// Kind is what HTTP makes of a header field.
type Kind uint8

const (
	KindOther              Kind = iota // forwarded as it is
	KindHop                            // a connection's own: never forwarded
	KindConnection                     // Connection (hop)
	KindProxyConnection                // Proxy-Connection (hop)
	KindContentLength                  // framing (Length, Chunked)
	KindTransferEncoding               // framing (Length, Chunked)
	KindHost                           // replaced by the request target's
	KindProxyAuthorization             // the client's credential (hop)
	KindExpect                         // Expect (Expect100)
)

// kindOf classifies a field name (any case).
func kindOf(name []byte) Kind {
	eq := func(s string) bool { return len(name) == len(s) && EqualFold(name, s) }
	switch len(name) {
	case 2:
		if eq("Te") {
			return KindHop
		}
	case 4:
		if eq("Host") {
			return KindHost
		}
	case 6:
		if eq("Expect") {
			return KindExpect
		}
	case 7:
		if eq("Upgrade") || eq("Trailer") {
			return KindHop
		}
	case 10:
		if eq("Connection") {
			return KindConnection
		}
		if eq("Keep-Alive") {
			return KindHop
		}
	case 14:
		if eq("Content-Length") {
			return KindContentLength
		}
	case 16:
		if eq("Proxy-Connection") {
			return KindProxyConnection
		}
	case 17:
		if eq("Transfer-Encoding") {
			return KindTransferEncoding
		}
	case 18:
		if eq("Proxy-Authenticate") {
			return KindHop
		}
	case 19:
		if eq("Proxy-Authorization") {
			return KindProxyAuthorization
		}
	}
	return KindOther
}

// EqualFold compares b with s (ASCII letters in any case).
func EqualFold(b []byte, s string) bool {
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

// Field is one header line: name and value (trimmed) point into the head.
type Field struct {
	Name, Value []byte
	Kind        Kind
}

// maxConnTokens bounds the field names a Connection header may name.
const maxConnTokens = 8

// Head is a parsed message Head. Its slices point into the bytes it was
// parsed from, valid until the reader they came from reads again.
type Head struct {
	Line   [3][]byte // request: method, target, version; response: version, code, reason
	Fields []Field   // in order, reused from head to head
	HTTP10 bool      // HTTP/1.0 (keep-alive only when asked)
	// A request's method, known once (the head's bytes do not outlive
	// its consumption): HEAD, and one a proxy may be sent again
	// (Idempotent, as http.Transport's isReplayable).
	IsHead, Idempotent bool

	Close, KeepAlive bool  // Connection (or Proxy-Connection): close, keep-alive
	Length           int64 // Content-Length, -1 without
	Chunked          bool  // Transfer-Encoding: chunked
	// Both: Content-Length came with Transfer-Encoding: chunked (framed
	// as chunked, its length dropped). RFC 9112 6.1: the connection
	// closes after the answer (a request's) or is not kept (a proxy's).
	Both      bool
	Expect100 bool // Expect: 100-continue
	// Transfer-Encoding, over all its fields: present, how many chunked
	// codings, and any other coding.
	te, teOther bool
	teChunked   int
	hosts       int  // Host fields (a request's)
	badHost     bool // one of them is no host[:port]

	Auth []byte // the first Proxy-Authorization, nil without

	connTokens [maxConnTokens][]byte // other names Connection lists (hop)
	nTokens    int
}

// Error is why a head is refused, with the status a request is
// refused with (RFC 9112; a response's is the proxy's failure).
type Error struct {
	Status int
	Text   string
}

func (e *Error) Error() string { return e.Text }

// Why a head is refused.
var (
	ErrSyntax   = &Error{http.StatusBadRequest, "malformed request head"}
	ErrTooLarge = &Error{http.StatusRequestHeaderFieldsTooLarge, "request head too large"}
	// ErrFraming: a body's length that cannot be known (RFC 9112
	// 6.3): Content-Length values that disagree or are not digits,
	// Transfer-Encoding whose final coding is not chunked, or in an
	// HTTP/1.0 message; or more Connection options than the parser
	// keeps.
	ErrFraming = &Error{http.StatusBadRequest, "bad message framing"}
	// ErrCoding: a transfer coding besides chunked (RFC 9112 6.1).
	ErrCoding  = &Error{http.StatusNotImplemented, "transfer coding not implemented"}
	ErrExpect  = &Error{http.StatusExpectationFailed, "expectation not supported"}
	ErrVersion = &Error{http.StatusHTTPVersionNotSupported, "HTTP version not supported"}
	// ErrHost: an HTTP/1.1 request without exactly one Host, or
	// with a Host that is no host[:port] (RFC 9112 3.2).
	ErrHost = &Error{http.StatusBadRequest, "a request needs exactly one valid Host"}
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

// Parse parses raw (a whole head, its empty line included). request:
// the first line is a request line, and the head is taken strictly
// (CRLF line ends, no obs-fold: what is not is refused);
// else a status line, taken as http.Transport does (LF line ends too,
// obs-fold unfolded in place to spaces, RFC 9112 5.2).
func (h *Head) Parse(raw []byte, request bool) error {
	*h = Head{Fields: h.Fields[:0], Length: -1}
	if !request {
		unfold(raw)
	}
	line, rest, ok := nextLine(raw, request)
	if !ok {
		return ErrSyntax
	}
	if err := h.parseFirst(line, request); err != nil {
		return err
	}
	for {
		line, rest, ok = nextLine(rest, request)
		if !ok {
			return ErrSyntax
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return ErrSyntax // no name, or obs-fold (a line starting with SP)
		}
		f := Field{Name: line[:colon], Value: trimOWS(line[colon+1:])}
		if !isToken(f.Name) || !validValue(f.Value) {
			return ErrSyntax
		}
		f.Kind = kindOf(f.Name)
		if err := h.note(&f); err != nil {
			return err
		}
		h.Fields = append(h.Fields, f)
	}
	if err := h.framing(request); err != nil {
		return err
	}
	if h.Chunked && h.Length >= 0 {
		// Chunked wins (RFC 9112 6.3, as net/http); the length is not
		// forwarded, and the connection is not used again.
		h.Length, h.Both = -1, true
		if request {
			h.Close = true
		}
	}
	if h.nTokens > 0 {
		for i := range h.Fields {
			f := &h.Fields[i]
			for _, t := range h.connTokens[:h.nTokens] {
				if EqualFold(f.Name, string(t)) {
					f.Kind = KindHop
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

func (h *Head) parseFirst(line []byte, request bool) error {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return ErrSyntax
	}
	h.Line[0] = line[:sp1]
	rest := line[sp1+1:]
	if request {
		sp2 := bytes.IndexByte(rest, ' ')
		if sp2 <= 0 {
			return ErrSyntax
		}
		h.Line[1], h.Line[2] = rest[:sp2], rest[sp2+1:]
		if !isToken(h.Line[0]) || !validValue(h.Line[1]) || bytes.IndexByte(h.Line[1], ' ') >= 0 || bytes.IndexByte(h.Line[1], '\t') >= 0 {
			return ErrSyntax
		}
		switch string(h.Line[0]) {
		case "HEAD":
			h.IsHead, h.Idempotent = true, true
		case "GET", "OPTIONS", "TRACE":
			h.Idempotent = true
		}
		return h.version(h.Line[2])
	}
	if err := h.version(h.Line[0]); err != nil {
		return err
	}
	code, reason, _ := bytes.Cut(rest, []byte{' '})
	if len(code) != 3 || code[0] < '1' || code[0] > '9' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' || !validValue(reason) {
		return ErrSyntax
	}
	h.Line[1], h.Line[2] = code, reason
	return nil
}

func (h *Head) version(v []byte) error {
	switch string(v) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		h.HTTP10 = true
	default:
		if len(v) == len("HTTP/1.1") && bytes.HasPrefix(v, []byte("HTTP/")) && isDigit(v[5]) && v[6] == '.' && isDigit(v[7]) {
			return ErrVersion // well formed, not 1.x (RFC 9110 15.6.6)
		}
		return ErrSyntax
	}
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// Status is a response head's code.
func (h *Head) Status() int {
	c := h.Line[1]
	return int(c[0]-'0')*100 + int(c[1]-'0')*10 + int(c[2]-'0')
}

// note takes what the head says of framing and the connection from f.
func (h *Head) note(f *Field) error {
	switch f.Kind {
	case KindConnection, KindProxyConnection:
		for v := f.Value; len(v) > 0; {
			var t []byte
			t, v = nextListItem(v)
			switch {
			case len(t) == 0:
			case EqualFold(t, "close"):
				h.Close = true
			case EqualFold(t, "keep-alive"):
				h.KeepAlive = true
			case f.Kind == KindProxyConnection:
			case !isToken(t):
				return ErrSyntax
			case h.nTokens == maxConnTokens:
				return ErrFraming
			default:
				h.connTokens[h.nTokens] = t
				h.nTokens++
			}
		}
	case KindContentLength:
		n, ok := parseLength(f.Value)
		if !ok || h.Length >= 0 && h.Length != n {
			return ErrFraming
		}
		h.Length = n
	case KindTransferEncoding:
		// The codings of every Transfer-Encoding field, in order; the
		// message is chunked if the last is (checked by framing).
		h.te = true
		for v := f.Value; len(v) > 0; {
			var t []byte
			t, v = nextListItem(v)
			switch {
			case len(t) == 0:
			case EqualFold(t, "chunked"):
				h.teChunked++
				h.Chunked = true
			default:
				h.teOther = true
				h.Chunked = false
			}
		}
	case KindHost:
		h.hosts++
		h.badHost = h.badHost || !validHostField(f.Value)
	case KindExpect:
		if !EqualFold(f.Value, "100-continue") {
			return ErrExpect
		}
		h.Expect100 = true
	case KindProxyAuthorization:
		if h.Auth == nil {
			h.Auth = f.Value
		}
	}
	return nil
}

// framing checks what the fields say of the body once all are read: a
// Transfer-Encoding of exactly one final chunked (RFC 9112 6.1: chunked
// not final, or twice, 400; another coding, 501) and not in HTTP/1.0
// (faulty framing); a request's Host (RFC 9112 3.2: an HTTP/1.1 one has
// exactly one).
func (h *Head) framing(request bool) error {
	if h.te {
		switch {
		case request && h.HTTP10:
			return ErrFraming
		case !h.Chunked || h.teChunked > 1:
			return ErrFraming
		case h.teOther:
			return ErrCoding
		}
	}
	if request && (h.hosts > 1 || h.hosts == 0 && !h.HTTP10 || h.badHost) {
		return ErrHost
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

// PeekHead waits for a whole head in br's buffer and returns it (not
// consumed: br.Discard(len) once done with it). errHeadTooLarge when it
// does not fit the buffer. strict: a bare LF line end is errHeadSyntax
// (a request's; an answer's may end its lines so). beforeWait (if not
// nil) runs once, before the first wait for more of a head begun.
func PeekHead(br *bufio.Reader, strict bool, beforeWait func() error) ([]byte, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		i := bytes.Index(buf, []byte("\n\r\n"))
		j := bytes.Index(buf, []byte("\n\n"))
		switch {
		case strict && (j >= 0 && (i < 0 || j < i) || i == 0 || i > 0 && buf[i-1] != '\r'):
			return nil, ErrSyntax
		case j >= 0 && (i < 0 || j < i):
			return buf[:j+2], nil
		case i >= 0:
			return buf[:i+3], nil
		}
		if len(buf) == br.Size() {
			return nil, ErrTooLarge
		}
		if beforeWait != nil && len(buf) > 0 {
			if err := beforeWait(); err != nil {
				return nil, err
			}
			beforeWait = nil
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if len(buf) > 0 && errors.Is(err, bufio.ErrBufferFull) {
				return nil, ErrTooLarge
			}
			return nil, err
		}
	}
}

// ReadLongHead reads an answer's head that does not fit br's buffer,
// line by line, into *acc (up to limit bytes), and consumes it.
func ReadLongHead(br *bufio.Reader, acc *[]byte, limit int) ([]byte, error) {
	b := (*acc)[:0]
	lineStart := 0
	for {
		line, err := br.ReadSlice('\n')
		if len(b)+len(line) > limit {
			return nil, ErrTooLarge
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
