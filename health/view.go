package health

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"

	"proxyfleet/messages"
)

// view is the rotation as this process published it (the lease holder:
// exactly the state at version, the last message of its feed) or serves
// it (a standby: its fold, brought up to date when read): every proxy's
// entry with its JSON encoding, the ids in order and the encoded size.
// The snapshot, the pages and GET /rotation are built from it by joining
// encodings, never by encoding the fleet; a change costs one entry's
// encoding and an insert in the ids. It is guarded by Health.mu.
type view struct {
	entries map[string]*viewEntry
	ids     sortedIDs
	bytes   int       // the sum of the entries' encodings
	version uint64    // the version it is at
	gen     uint64    // grows with every change applied (a standby's versions stay)
	at      time.Time // when it last changed
}

type viewEntry struct {
	e   messages.RotationEntry
	enc []byte // e's JSON
}

func newView() *view { return &view{entries: make(map[string]*viewEntry)} }

// Len is the number of proxies in the view.
func (v *view) Len() int { return len(v.entries) }

// change is one proxy's change from the view to the fold, computed but
// not yet applied.
type change struct {
	op   string // messages.ChangeEntered, ChangeChanged or ChangeLeft
	id   string
	e    messages.RotationEntry // entered, changed
	enc  []byte                 // e's JSON
	wire []byte                 // the change's JSON in a feed message
	was  string                 // the address before (changed, left)
	mark uint64                 // the drain that made its id pending
}

func sameEntry(a, b messages.RotationEntry) bool {
	return a.ID == b.ID && a.Addr == b.Addr && a.Host == b.Host && a.Since.Equal(b.Since) &&
		a.Egress == b.Egress && maps.Equal(a.Labels, b.Labels) && slices.Equal(a.EgressAddrs, b.EgressAddrs)
}

// diff returns the change that brings id's place in the view to cur (in:
// whether id is in the rotation now), false if there is none.
func (v *view) diff(id string, cur messages.RotationEntry, in bool) (change, bool) {
	old := v.entries[id]
	c := change{id: id}
	switch {
	case !in && old == nil:
		return c, false
	case !in:
		c.op, c.was = messages.ChangeLeft, old.e.Addr
	case old != nil && sameEntry(old.e, cur):
		return c, false
	default:
		c.op, c.e = messages.ChangeEntered, cur
		if old != nil {
			c.op, c.was = messages.ChangeChanged, old.e.Addr
		}
		// An entry is plain strings, a time and a map of strings:
		// it always encodes.
		c.enc, _ = json.Marshal(cur)
	}
	c.wire = appendChange(nil, c)
	return c, true
}

// appendChange appends c's JSON in a feed message.
func appendChange(buf []byte, c change) []byte {
	buf = append(buf, `{"op":`...)
	buf = strconv.AppendQuote(buf, c.op)
	buf = append(buf, `,"id":`...)
	buf = appendString(buf, c.id)
	if c.op != messages.ChangeLeft {
		buf = append(buf, `,"proxy":`...)
		buf = append(buf, c.enc...)
	}
	return append(buf, '}')
}

// appendString appends s as a JSON string.
func appendString(buf []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(buf, b...)
}

func appendTime(buf []byte, t time.Time) []byte {
	b, _ := t.UTC().MarshalJSON()
	return append(buf, b...)
}

// apply applies c, changed at at.
func (v *view) apply(c change, at time.Time) {
	old := v.entries[c.id]
	if old != nil {
		v.bytes -= len(old.enc)
	}
	if c.op == messages.ChangeLeft {
		delete(v.entries, c.id)
		v.ids.Delete(c.id)
	} else {
		if old == nil {
			v.ids.Insert(c.id)
		}
		v.entries[c.id] = &viewEntry{e: c.e, enc: c.enc}
		v.bytes += len(c.enc)
	}
	v.gen++
	v.at = at
}

// sizeAfter is the number of proxies in the view once changes are applied.
func (v *view) sizeAfter(changes []change) int {
	n := len(v.entries)
	for _, c := range changes {
		switch c.op {
		case messages.ChangeEntered:
			n++
		case messages.ChangeLeft:
			n--
		}
	}
	return n
}

// snapshotOverhead bounds the bytes of a snapshot's body beyond its
// entries and the commas between them.
const snapshotOverhead = 128

// snapshotSize bounds the size of the view's snapshot (messages.Rotation).
func (v *view) snapshotSize() int { return snapshotOverhead + v.bytes + max(len(v.entries)-1, 0) }

// appendSnapshot appends the view as a messages.Rotation, proxies sorted
// by id.
func (v *view) appendSnapshot(buf []byte) []byte {
	buf = append(buf, `{"v":1,"version":`...)
	buf = strconv.AppendUint(buf, v.version, 10)
	buf = append(buf, `,"proxies":[`...)
	first := true
	v.ids.After("", func(id string) bool {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, v.entries[id].enc...)
		return true
	})
	buf = append(buf, `],"at":`...)
	buf = appendTime(buf, v.at)
	return append(buf, '}')
}

// rotation returns the view as a messages.Rotation.
func (v *view) rotation() messages.Rotation {
	out := messages.Rotation{V: messages.Version, Version: v.version, Proxies: make([]messages.RotationEntry, 0, len(v.entries)), At: v.at}
	v.ids.After("", func(id string) bool {
		out.Proxies = append(out.Proxies, v.entries[id].e)
		return true
	})
	return out
}

// pageOverhead bounds the bytes of a page's body beyond its entries and
// their commas (a 63-byte next id included).
const pageOverhead = 192

// appendPage appends the page of the ids after after, at most limit of
// them (0: no limit), within maxBytes, as a messages.RotationPage. It
// reports how many proxies it holds.
func (v *view) appendPage(buf []byte, after string, limit, maxBytes int) ([]byte, int) {
	buf = append(buf, `{"v":1,"version":`...)
	buf = strconv.AppendUint(buf, v.version, 10)
	buf = append(buf, `,"size":`...)
	buf = strconv.AppendInt(buf, int64(len(v.entries)), 10)
	buf = append(buf, `,"proxies":[`...)
	budget := maxBytes - pageOverhead
	n, last, more := 0, "", false
	v.ids.After(after, func(id string) bool {
		enc := v.entries[id].enc
		if (limit > 0 && n == limit) || (n > 0 && len(enc)+1 > budget) {
			more = true
			return false
		}
		if n > 0 {
			buf = append(buf, ',')
			budget--
		}
		buf = append(buf, enc...)
		budget -= len(enc)
		n++
		last = id
		return true
	})
	buf = append(buf, ']')
	if more {
		buf = append(buf, `,"next":`...)
		buf = appendString(buf, last)
	}
	return append(buf, '}'), n
}

// feedOverhead bounds the bytes of a feed message beyond its changes and
// their commas.
const feedOverhead = 160

// appendFeed appends a messages.RotationChanges of changes.
func appendFeed(buf []byte, version, prev uint64, size int, changes []change, at time.Time) []byte {
	buf = append(buf, `{"v":1,"version":`...)
	buf = strconv.AppendUint(buf, version, 10)
	buf = append(buf, `,"prev":`...)
	buf = strconv.AppendUint(buf, prev, 10)
	buf = append(buf, `,"size":`...)
	buf = strconv.AppendInt(buf, int64(size), 10)
	buf = append(buf, `,"changes":[`...)
	for i, c := range changes {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, c.wire...)
	}
	buf = append(buf, `],"at":`...)
	buf = appendTime(buf, at)
	return append(buf, '}')
}

// feedRing keeps the last feed messages, up to max bytes of changes, to
// answer GET /rotation?since=V.
type feedRing struct {
	msgs  []ringMsg // oldest first
	bytes int
	max   int
}

type ringMsg struct {
	version, prev uint64
	changes       []change
	bytes         int
}

// add keeps a message, dropping the oldest beyond the bound.
func (r *feedRing) add(version, prev uint64, changes []change) {
	m := ringMsg{version: version, prev: prev, changes: changes}
	for _, c := range changes {
		m.bytes += len(c.wire)
	}
	r.msgs = append(r.msgs, m)
	r.bytes += m.bytes
	for len(r.msgs) > 1 && r.bytes > r.max {
		r.bytes -= r.msgs[0].bytes
		r.msgs[0] = ringMsg{}
		r.msgs = r.msgs[1:]
	}
}

// since returns the changes after version v up to the last message, one
// per id (the last), in the order of their last change; false if v is not
// a version the ring follows on from: older than what it keeps, or behind
// a message that follows no version (a reset).
func (r *feedRing) since(v uint64) ([]change, bool) {
	from := -1
	for i := len(r.msgs) - 1; i >= 0; i-- {
		m := r.msgs[i]
		if m.prev == v && v != 0 {
			from = i
			break
		}
		if m.prev == 0 {
			return nil, false
		}
	}
	if from < 0 {
		return nil, false
	}
	last := map[string]int{}
	var out []change
	for _, m := range r.msgs[from:] {
		for _, c := range m.changes {
			if i, ok := last[c.id]; ok {
				out[i] = change{} // superseded
			}
			last[c.id] = len(out)
			out = append(out, c)
		}
	}
	kept := out[:0]
	for _, c := range out {
		if c.id != "" {
			kept = append(kept, c)
		}
	}
	return kept, true
}
