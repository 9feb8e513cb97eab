package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AddrState is a host's address assignments (package addrplan decides
// them). A slot is a place in the plan: an IPv4 slot is one IPv4
// address, an IPv6 slot the plan's ipv6_per_proxy addresses. Slots are
// numbered from 1; 0 means none.
//
// Every proxy holding a slot is also in HostRecord.Proxies, and no slot
// is held by two proxies: both are changed together, by compare-and-set
// of the whole record.
type AddrState struct {
	// Slots are the slots each proxy holds, by proxy id.
	Slots SlotMap   `json:"slots,omitempty"`
	V4    SlotSpace `json:"v4,omitzero"`
	V6    SlotSpace `json:"v6,omitzero"`
}

// HostAddrs is a host record's AddrState as the record stores it. A
// decoded record keeps it in that form and Decode parses it, so a reader
// that needs only a host's room (every worker's view of every host,
// decoding each write of every record) does not build it: with a hundred
// proxies a host, parsing it more than doubled the cost of decoding a
// record. The zero HostAddrs is an empty AddrState; a HostAddrs is never
// changed, only replaced (EncodeAddrs), so copies of a record share it
// safely.
type HostAddrs struct{ raw []byte }

// EncodeAddrs is st as a record stores it; the zero HostAddrs for an
// empty st.
func EncodeAddrs(st AddrState) HostAddrs {
	if len(st.Slots) == 0 && st.V4.IsZero() && st.V6.IsZero() {
		return HostAddrs{}
	}
	// By hand, as encoding/json would write it (TestEncodeAddrsIsJSON):
	// json.Marshal checks and compacts what a MarshalJSON returns, which
	// was half of the encoding's cost.
	b := make([]byte, 0, 32+len(st.Slots)*20+(len(st.V4.Freed)+len(st.V6.Freed))*48)
	b = append(b, '{')
	if len(st.Slots) > 0 {
		slots, err := st.Slots.MarshalJSON()
		if err != nil {
			panic(fmt.Sprintf("encode address slots: %v", err)) // ints and strings always encode
		}
		b = append(b, `"slots":`...)
		b = append(b, slots...)
	}
	return HostAddrs{raw: appendSpaces(b, st.V4, st.V6)}
}

// appendSpaces appends the spaces v4 and v6 to b, the assignments as
// EncodeAddrs writes them up to the spaces, and closes the object.
func appendSpaces(b []byte, v4, v6 SlotSpace) []byte {
	for _, f := range []struct {
		name string
		sp   SlotSpace
	}{{"v4", v4}, {"v6", v6}} {
		if f.sp.IsZero() {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, f.name...)
		b = append(b, `":{`...)
		if f.sp.Next != 0 {
			b = append(b, `"next":`...)
			b = strconv.AppendInt(b, int64(f.sp.Next), 10)
		}
		if len(f.sp.Freed) > 0 {
			if f.sp.Next != 0 {
				b = append(b, ',')
			}
			b = append(b, `"freed":{`...)
			// Sorted as their text, as encoding/json sorts int keys.
			keys := slices.SortedFunc(maps.Keys(f.sp.Freed), func(x, y int) int {
				return strings.Compare(strconv.Itoa(x), strconv.Itoa(y))
			})
			for i, k := range keys {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, '"')
				b = strconv.AppendInt(b, int64(k), 10)
				b = append(b, `":`...)
				at, err := f.sp.Freed[k].MarshalJSON()
				if err != nil {
					panic(fmt.Sprintf("encode freed time: %v", err)) // a year past 9999
				}
				b = append(b, at...)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// Decode parses the assignments; an error names what is malformed. The
// AddrState returned is the caller's own to change.
func (h HostAddrs) Decode() (AddrState, error) {
	var st AddrState
	if len(h.raw) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(h.raw, &st); err != nil {
		return AddrState{}, fmt.Errorf("decode addresses: %w", err)
	}
	return st, nil
}

// Held returns the slots proxy id holds, as Decode's Slots[id] would,
// without building the assignments: where h is in the form EncodeAddrs
// writes, its slots are looked through in place (an executor asks this of
// its host's record for every create, and decoding every pair of the
// host for one was most of that cost); anything else is decoded. Only the
// slots are read: a fault in the rest shows when Decode is asked.
func (h HostAddrs) Held(id string) (AddrSlots, bool, error) {
	if len(h.raw) == 0 {
		return AddrSlots{}, false, nil
	}
	if s, found, sure := scanSlots(h.raw, id); sure {
		return s, found, nil
	}
	st, err := h.Decode()
	if err != nil {
		return AddrSlots{}, false, err
	}
	s, ok := st.Slots[id]
	return s, ok, nil
}

// scanSlots looks for id among the slots of b as EncodeAddrs writes them:
// {"slots":{"id":[v4,v6],...} first, plain keys, no whitespace. sure is
// false where b is not in that form (the caller decodes it); a key
// repeated counts as its last, as encoding/json reads it.
func scanSlots(b []byte, id string) (s AddrSlots, found, sure bool) {
	const head = `{"slots":{`
	if !plainKey(id) || !bytes.HasPrefix(b, []byte(head)) {
		return s, false, false
	}
	i := len(head)
	for {
		if i >= len(b) || b[i] != '"' {
			return s, false, false
		}
		end := bytes.IndexByte(b[i+1:], '"')
		if end < 0 {
			return s, false, false
		}
		key := b[i+1 : i+1+end]
		if !plainKeyBytes(key) {
			return s, false, false
		}
		i += end + 2
		if !bytes.HasPrefix(b[i:], []byte(":[")) {
			return s, false, false
		}
		closing := bytes.IndexByte(b[i:], ']')
		if closing < 0 {
			return s, false, false
		}
		var pair AddrSlots
		if pair.UnmarshalJSON(b[i+1:i+closing+1]) != nil {
			return AddrSlots{}, false, false
		}
		if string(key) == id {
			s, found = pair, true
		}
		i += closing + 1
		if i >= len(b) {
			return s, false, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return s, found, true
		default:
			return s, false, false
		}
	}
}

// AddrsAdding is a host's assignments read for adding the slots of one
// proxy that holds none (HostAddrs.Adding): what a reservation on a
// host with a plan needs of them, without building the map of every
// proxy's slots or writing it anew.
type AddrsAdding struct {
	// Spaces are the assignments' V4 and V6 (Slots is nil), the caller's
	// to change.
	Spaces AddrState
	// Held are the slots every proxy holds.
	Held []AddrSlots

	raw      []byte // the slots object of the assignments, from its '{' to its '}' (nil: none)
	at       int    // where in raw the new pair goes
	id       string
	anyPairs bool
}

// Adding reads h for adding proxy id's slots. ok is false where h is not
// in the form EncodeAddrs writes (its proxies' keys sorted and plain), is
// malformed, or id holds slots in it: the caller decodes it (Decode)
// instead, which tells.
func (h HostAddrs) Adding(id string) (a AddrsAdding, ok bool) {
	a.id = id
	if len(h.raw) == 0 {
		return a, plainKey(id)
	}
	const head = `{"slots":{`
	if !plainKey(id) || !bytes.HasPrefix(h.raw, []byte(head)) {
		return a, false
	}
	b := h.raw
	i := len(head)
	a.Held = make([]AddrSlots, 0, bytes.Count(b, []byte("]")))
	a.at = -1
	var prev []byte
	for {
		if i >= len(b) || b[i] != '"' {
			return a, false
		}
		end := bytes.IndexByte(b[i+1:], '"')
		if end < 0 {
			return a, false
		}
		key := b[i+1 : i+1+end]
		if !plainKeyBytes(key) || prev != nil && bytes.Compare(prev, key) >= 0 {
			return a, false // not sorted, or repeated
		}
		switch c := bytes.Compare(key, []byte(id)); {
		case c == 0:
			return a, false
		case c > 0 && a.at < 0:
			a.at = i - (len(head) - 1)
		}
		prev = key
		pair, next, ok := slotsAt(b, i+end+2)
		if !ok {
			return a, false
		}
		a.Held = append(a.Held, pair)
		i = next
		if i >= len(b) {
			return a, false
		}
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != '}' {
			return a, false
		}
		break
	}
	a.raw = b[len(head)-1 : i+1]
	if a.at < 0 {
		a.at = len(a.raw) - 1
	}
	a.anyPairs = true
	// The rest, read as Decode reads it: any field but the slots.
	rest := b[i+1:]
	if len(rest) == 0 {
		return a, false
	}
	var st AddrState
	switch rest[0] {
	case '}':
		if len(bytes.TrimSpace(rest[1:])) != 0 {
			return a, false
		}
	case ',':
		obj := make([]byte, 0, len(rest))
		obj = append(append(obj, '{'), rest[1:]...)
		if json.Unmarshal(obj, &st) != nil || st.Slots != nil {
			return a, false // malformed, or slots named twice
		}
	default:
		return a, false
	}
	a.Spaces = AddrState{V4: st.V4, V6: st.V6}
	return a, true
}

// With is the assignments a was read from with its proxy holding s and
// the spaces a.Spaces: what EncodeAddrs writes of them, decoded, so
// changed. The pairs of the other proxies are copied as they are.
func (a AddrsAdding) With(s AddrSlots) HostAddrs {
	b := make([]byte, 0, len(a.raw)+len(a.id)+64+(len(a.Spaces.V4.Freed)+len(a.Spaces.V6.Freed))*48)
	b = append(b, `{"slots":`...)
	pair := func(b []byte) []byte {
		b = append(b, '"')
		b = append(b, a.id...)
		b = append(b, '"', ':', '[')
		b = strconv.AppendInt(b, int64(s.V4), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(s.V6), 10)
		return append(b, ']')
	}
	switch {
	case !a.anyPairs:
		b = append(pair(append(b, '{')), '}')
	case a.at == len(a.raw)-1: // last
		b = append(b, a.raw[:a.at]...)
		b = append(pair(append(b, ',')), '}')
	default:
		b = append(b, a.raw[:a.at]...)
		b = append(pair(b), ',')
		b = append(b, a.raw[a.at:]...)
	}
	return HostAddrs{raw: appendSpaces(b, a.Spaces.V4, a.Spaces.V6)}
}

// IsZero says whether h holds no assignments (encoding/json's omitzero).
func (h HostAddrs) IsZero() bool { return len(h.raw) == 0 }

// MarshalJSON writes the stored form as it is.
func (h HostAddrs) MarshalJSON() ([]byte, error) {
	if len(h.raw) == 0 {
		return []byte("{}"), nil
	}
	return h.raw, nil
}

// UnmarshalJSON keeps a copy of b, checked only to be a JSON object (or
// null, no assignments); Decode parses it.
func (h *HostAddrs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")) || bytes.Equal(b, []byte("{}")):
		h.raw = nil
	case len(b) > 0 && b[0] == '{':
		h.raw = bytes.Clone(b)
	default:
		return fmt.Errorf("addresses: want an object, got %.20q", b)
	}
	return nil
}

// SlotMap is AddrState.Slots: each proxy's slots by id, written as a
// JSON object of [v4, v6] pairs. A reservation on a host with a plan
// decodes and encodes every pair of its host's record, so both are done
// by hand for the form this package writes (keys sorted, nothing to
// escape, no whitespace), at a fifth of what reflection cost; anything
// else is read by encoding/json.
type SlotMap map[string]AddrSlots

// MarshalJSON writes m with its keys sorted, as encoding/json does.
func (m SlotMap) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("null"), nil
	}
	keys := make([]string, 0, len(m))
	size := 2
	for k := range m {
		if !plainKey(k) {
			return json.Marshal(map[string]AddrSlots(m))
		}
		keys = append(keys, k)
		size += len(k) + 16
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, '"', ':', '[')
		b = strconv.AppendInt(b, int64(m[k].V4), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(m[k].V6), 10)
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// plainKey says whether k is written as it is between quotes by
// encoding/json (no control byte, quote, backslash, HTML-escaped byte or
// non-ASCII byte).
func plainKey(k string) bool {
	for i := 0; i < len(k); i++ {
		switch c := k[i]; {
		case c < 0x20, c >= 0x80, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// plainKeyBytes is plainKey of k, which also holds none of {}[] (so that
// scanSlots cannot take a key's bytes for the form around it).
func plainKeyBytes(k []byte) bool {
	for _, c := range k {
		switch {
		case c < 0x20, c >= 0x80, c == '"', c == '\\', c == '<', c == '>', c == '&', c == '{', c == '}', c == '[', c == ']':
			return false
		}
	}
	return true
}

// UnmarshalJSON reads what MarshalJSON writes directly and anything else
// through encoding/json; null changes nothing.
func (m *SlotMap) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if out, ok := parseSlotMap(b); ok {
		*m = out
		return nil
	}
	var plain map[string]AddrSlots
	if err := json.Unmarshal(b, &plain); err != nil {
		return err
	}
	*m = plain
	return nil
}

// slotsAt parses a key's value as MarshalJSON writes it, `:[v4,v6]`, at
// b[i:]; next is the index after its `]`.
func slotsAt(b []byte, i int) (s AddrSlots, next int, ok bool) {
	if !bytes.HasPrefix(b[i:], []byte(":[")) {
		return s, 0, false
	}
	closing := bytes.IndexByte(b[i:], ']')
	if closing < 0 || s.UnmarshalJSON(b[i+1:i+closing+1]) != nil {
		return s, 0, false
	}
	return s, i + closing + 1, true
}

// parseSlotMap parses the form MarshalJSON writes: {"id":[v4,v6],...}
// with plain keys and no whitespace; false for anything else (the caller
// then decodes it the general way). The keys share one string.
func parseSlotMap(b []byte) (SlotMap, bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil, false
	}
	src := string(b)
	out := make(SlotMap, bytes.Count(b, []byte("]")))
	i := 1
	for i < len(src)-1 {
		if src[i] != '"' {
			return nil, false
		}
		end := strings.IndexByte(src[i+1:], '"')
		if end < 0 {
			return nil, false
		}
		key := src[i+1 : i+1+end]
		if !plainKey(key) {
			return nil, false
		}
		s, next, ok := slotsAt(b, i+end+2)
		if !ok {
			return nil, false
		}
		out[key] = s
		i = next
		if i < len(src)-1 {
			if src[i] != ',' {
				return nil, false
			}
			i++
		}
	}
	return out, true
}

// AddrSlots are one proxy's slots: its IPv4 slot and its IPv6 slot, 0
// where the plan has none of that family. A record writes them as the
// pair [v4, v6], a third of the bytes of an object with a hundred
// proxies a host.
type AddrSlots struct {
	V4 int
	V6 int
}

// MarshalJSON writes s as [v4, v6]. (By hand: a reservation encodes
// every pair of its host's record, and reflection made that most of its
// cost.)
func (s AddrSlots) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 16)
	b = append(b, '[')
	b = strconv.AppendInt(b, int64(s.V4), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(s.V6), 10)
	return append(b, ']'), nil
}

// UnmarshalJSON reads [v4, v6] (JSON whitespace allowed): two slot
// numbers, 0 or more.
func (s *AddrSlots) UnmarshalJSON(b []byte) error {
	bad := func() error { return fmt.Errorf("slots: want [v4, v6] of slots 0 or more, got %.40s", b) }
	rest, ok := bytes.CutPrefix(bytes.TrimSpace(b), []byte("["))
	if !ok {
		return bad()
	}
	rest, ok = bytes.CutSuffix(rest, []byte("]"))
	if !ok {
		return bad()
	}
	first, second, ok := bytes.Cut(rest, []byte(","))
	if !ok {
		return bad()
	}
	v4, err4 := slotNumber(first)
	v6, err6 := slotNumber(second)
	if err4 != nil || err6 != nil {
		return bad()
	}
	s.V4, s.V6 = v4, v6
	return nil
}

// slotNumber parses one slot number of a pair: decimal digits, at most
// nine (slots are far fewer), surrounded by JSON whitespace.
func slotNumber(b []byte) (int, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || len(b) > 9 {
		return 0, errors.New("not a slot")
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errors.New("not a slot")
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// SlotSpace is what a host's record keeps of one family's slots besides
// who holds them: slots 1 to Next have been given at least once (or
// passed over by a proxy found holding a later one), and
// Freed says when slots not held now were last freed. A slot at most
// Next that is not held and not in Freed was freed long ago (entries are
// dropped once they no longer decide anything).
type SlotSpace struct {
	Next  int               `json:"next,omitempty"`
	Freed map[int]time.Time `json:"freed,omitempty"`
}

// IsZero says whether sp says nothing (encoding/json's omitzero).
func (sp SlotSpace) IsZero() bool { return sp.Next == 0 && len(sp.Freed) == 0 }
