package messages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// HostRoom is what a stored HostRecord says of its host's room, and no
// more: the proxies holding room there and the host's state. Every
// worker's view of the hosts reads this of every write of every host's
// record; the address plan and assignments, most of a planned record's
// bytes, are skipped over, never decoded or copied.
type HostRoom struct {
	Proxies map[string]uint64 // as HostRecord.Proxies; read it, never change it
	State   string            // as HostRecord.State (empty when absent)

	// rest is the stored record, its proxies left out where they were
	// read without encoding/json (kept once, in Proxies); Record decodes
	// it.
	rest []byte
}

// Record decodes the rest of the record r was read from, as
// json.Unmarshal of it into rec would, with r's Proxies (shared: read
// them, never change them). Fields the stored record lacks keep rec's.
func (r HostRoom) Record(rec HostRecord) (HostRecord, error) {
	into := struct {
		*HostRecord
		Proxies skippedJSON `json:"proxies"` // hides the record's: r has them
	}{HostRecord: &rec}
	if err := json.Unmarshal(r.rest, &into); err != nil {
		return HostRecord{}, fmt.Errorf("decode host record: %w", err)
	}
	rec.Proxies = r.Proxies
	return rec, nil
}

// skippedJSON is a JSON value passed over.
type skippedJSON struct{}

func (*skippedJSON) UnmarshalJSON([]byte) error { return nil }

// Quarantined reports whether the host is in quarantine.
func (r HostRoom) Quarantined() bool { return r.State == HostQuarantined }

// DecodeHostRoom reads b, a stored HostRecord, as json.Unmarshal into a
// HostRecord would read its Proxies and State, and fails where b is not
// JSON or those two are not what a HostRecord's are (a fault only in
// another field shows when Record decodes the rest). The form
// encoding/json writes is read by a single pass over b (the proxies' ids
// share one string); anything else is read by encoding/json. The
// HostRoom keeps no reference to b.
func DecodeHostRoom(b []byte) (HostRoom, error) {
	if r, ok := scanHostRoom(b); ok {
		return r, nil
	}
	var r struct {
		Proxies map[string]uint64 `json:"proxies"`
		State   string            `json:"state"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return HostRoom{}, fmt.Errorf("decode host record: %w", err)
	}
	return HostRoom{Proxies: r.Proxies, State: r.State, rest: bytes.Clone(b)}, nil
}

// hostRecordKeys are the keys encoding/json writes for a HostRecord. A key
// not among them may name a field in another case (encoding/json matches
// keys without regard to case), so scanHostRoom leaves such a record to
// encoding/json.
var hostRecordKeys = map[string]uint{
	"v": 1 << 0, "host": 1 << 1, "max_proxies": 1 << 2, "proxies": keyProxies, "state": keyState, "since": 1 << 5,
	"until": 1 << 6, "cool_down_ms": 1 << 7, "reason": 1 << 8, "at": 1 << 9, "plan": 1 << 10, "addresses": 1 << 11,
}

const (
	keyProxies = 1 << 3
	keyState   = 1 << 4
)

// scanHostRoom reads b if it is a JSON object whose keys are
// hostRecordKeys, each once, with a proxies object of plain ids and
// unsigned integers (or no proxies) and a state of plain text; false for
// anything else, malformed JSON included.
func scanHostRoom(b []byte) (HostRoom, bool) {
	var r HostRoom
	s := jsonScan{b: b}
	s.space()
	if !s.byte('{') {
		return r, false
	}
	var seen uint
	s.space()
	if s.byte('}') {
		r.rest = bytes.Clone(b)
		return r, s.end()
	}
	for {
		s.space()
		start, end, ok := s.plainSpan()
		if !ok {
			return r, false
		}
		bit := hostRecordKeys[string(b[start:end])]
		if bit == 0 || seen&bit != 0 {
			return r, false
		}
		seen |= bit
		s.space()
		if !s.byte(':') {
			return r, false
		}
		s.space()
		switch bit {
		case keyProxies:
			from := s.i
			if r.Proxies, ok = s.proxies(); !ok {
				return r, false
			}
			// The rest is b with null for the proxies (which Record
			// passes over).
			r.rest = make([]byte, 0, len(b)-(s.i-from)+4)
			r.rest = append(append(append(r.rest, b[:from]...), "null"...), b[s.i:]...)
		case keyState:
			if r.State, ok = s.plainString(); !ok {
				return r, false
			}
		default:
			if !s.skip(0) {
				return r, false
			}
		}
		s.space()
		if s.byte('}') {
			if !s.end() {
				return r, false
			}
			if r.rest == nil {
				r.rest = bytes.Clone(b)
			}
			return r, true
		}
		if !s.byte(',') {
			return r, false
		}
	}
}

// jsonScan reads JSON from b at i.
type jsonScan struct {
	b []byte
	i int
}

// maxScanDepth bounds the nesting jsonScan.skip follows; deeper values
// are left to encoding/json.
const maxScanDepth = 32

func (s *jsonScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c if it is next.
func (s *jsonScan) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether nothing but whitespace follows.
func (s *jsonScan) end() bool {
	s.space()
	return s.i == len(s.b)
}

// plainString reads a string of plainKey's bytes (no escapes).
func (s *jsonScan) plainString() (string, bool) {
	start, end, ok := s.plainSpan()
	if !ok {
		return "", false
	}
	return string(s.b[start:end]), true
}

// plainSpan reads a string of plainKey's bytes and returns where its text
// starts and ends in b.
func (s *jsonScan) plainSpan() (int, int, bool) {
	if !s.byte('"') {
		return 0, 0, false
	}
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return start, s.i - 1, true
		case c < 0x20, c >= 0x80, c == '\\', c == '<', c == '>', c == '&':
			return 0, 0, false
		}
		s.i++
	}
	return 0, 0, false
}

// proxies reads an object of plain ids to unsigned integers; its ids
// share one string of them all. It reads the object three times (to
// check and size it, to gather the ids, to fill the map) rather than
// keep where each id was.
func (s *jsonScan) proxies() (map[string]uint64, bool) {
	from := s.i
	n, size := 0, 0
	if !s.eachProxy(func(start, end int, _ uint64) { n, size = n+1, size+end-start }) {
		return nil, false
	}
	to := s.i
	var ids strings.Builder
	ids.Grow(size)
	s.i = from
	s.eachProxy(func(start, end int, _ uint64) { ids.Write(s.b[start:end]) })
	text, at := ids.String(), 0
	out := make(map[string]uint64, n)
	s.i = from
	s.eachProxy(func(start, end int, seq uint64) {
		out[text[at:at+end-start]] = seq // a repeated id: the last, as encoding/json
		at += end - start
	})
	s.i = to
	return out, true
}

// eachProxy reads an object of plain ids to unsigned integers, calling fn
// with where each id is in b and its number.
func (s *jsonScan) eachProxy(fn func(start, end int, seq uint64)) bool {
	if !s.byte('{') {
		return false // null, among others: left to encoding/json
	}
	s.space()
	if s.byte('}') {
		return true
	}
	for {
		s.space()
		start, end, ok := s.plainSpan()
		if !ok {
			return false
		}
		s.space()
		if !s.byte(':') {
			return false
		}
		s.space()
		seq, ok := s.uint()
		if !ok {
			return false
		}
		fn(start, end, seq)
		s.space()
		if s.byte('}') {
			return true
		}
		if !s.byte(',') {
			return false
		}
	}
}

// uint reads an unsigned integer as encoding/json reads one into a
// uint64: digits, no leading zero, no fraction or exponent, no overflow.
func (s *jsonScan) uint() (uint64, bool) {
	start := s.i
	var n uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		d := uint64(s.b[s.i] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
		s.i++
	}
	switch {
	case s.i == start, s.i-start > 1 && s.b[start] == '0':
		return 0, false
	case s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E'):
		return 0, false
	}
	return n, true
}

// skip passes over one JSON value, checking its syntax as encoding/json
// does; depth is how deep in objects and arrays it is.
func (s *jsonScan) skip(depth int) bool {
	if s.i >= len(s.b) || depth > maxScanDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{' || c == '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		s.i++
		s.space()
		if s.byte(closer) {
			return true
		}
		for {
			s.space()
			if c == '{' {
				if !s.string() {
					return false
				}
				s.space()
				if !s.byte(':') {
					return false
				}
				s.space()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.space()
			if s.byte(closer) {
				return true
			}
			if !s.byte(',') {
				return false
			}
		}
	case c == '"':
		return s.string()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.word("true")
	case c == 'f':
		return s.word("false")
	case c == 'n':
		return s.word("null")
	}
	return false
}

func (s *jsonScan) word(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// string passes over a string: no control bytes, only JSON's escapes.
func (s *jsonScan) string() bool {
	if !s.byte('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if s.i >= len(s.b) {
				return false
			}
			e := s.b[s.i]
			s.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.b)-s.i < 4 {
					return false
				}
				for _, h := range s.b[s.i : s.i+4] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// number passes over a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScan) number() bool {
	s.byte('-')
	digits := func() int {
		start := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i - start
	}
	if s.byte('0') {
		// no more digits may follow a leading zero
	} else if digits() == 0 {
		return false
	}
	if s.byte('.') && digits() == 0 {
		return false
	}
	if s.byte('e') || s.byte('E') {
		if !s.byte('+') {
			s.byte('-')
		}
		if digits() == 0 {
			return false
		}
	}
	return s.i >= len(s.b) || !(s.b[s.i] >= '0' && s.b[s.i] <= '9')
}
