package rotation

import (
	"maps"
	"sync/atomic"
	"time"
)

// member is one proxy in the rotation: the Proxy a pick returns, and what
// the index and the picks need of it.
type member struct {
	p      Proxy
	idHash uint64 // hash of the id, for PickSession
	// inflight counts requests on it (Acquire), for least-busy.
	inflight atomic.Int64
	// gen is the generation of the PROXY_ROTATION watcher that last
	// delivered its key: after a remade watcher's initial values, members
	// of older generations are gone.
	gen uint64
	// labelled is whether its labels are indexed (known from an event).
	labelled bool
}

// set is a set of members that supports O(1) add, remove and pick by
// position: the members in a slice, with each one's position in a map.
// Removal moves the last member into the hole, so the order changes with
// churn, which round robin does not mind.
type set struct {
	items []*member
	// hashes[i] is items[i].idHash, so that PickSession's walk reads one
	// contiguous slice rather than every member.
	hashes []uint64
	pos    map[*member]int
	// rr is the round-robin cursor of picks over this set.
	rr atomic.Uint64
}

func newSet() *set { return &set{pos: map[*member]int{}} }

func (s *set) add(m *member) {
	if _, ok := s.pos[m]; ok {
		return
	}
	s.pos[m] = len(s.items)
	s.items = append(s.items, m)
	s.hashes = append(s.hashes, m.idHash)
}

func (s *set) remove(m *member) {
	i, ok := s.pos[m]
	if !ok {
		return
	}
	last := len(s.items) - 1
	if i != last {
		s.items[i] = s.items[last]
		s.hashes[i] = s.hashes[last]
		s.pos[s.items[i]] = i
	}
	s.items[last] = nil
	s.items = s.items[:last]
	s.hashes = s.hashes[:last]
	delete(s.pos, m)
}

// eventInfo is what a proxy's latest state event says that the rotation
// shows: its host and labels.
type eventInfo struct {
	host   string
	labels map[string]string
	gen    uint64
}

// checkInfo is what health's check record of a proxy says: the address it
// checked and the egress its probe target saw.
type checkInfo struct {
	addr, egress string
	gen          uint64
}

// index is the rotation as this process knows it: the members, the
// secondary sources' records by id (kept also for ids not in the rotation,
// so a proxy that enters shows its host and labels at once), and the label
// sets. Every method is O(1) in the size of the fleet (O(labels of one
// proxy)), except the sweeps, which run once per remade source.
type index struct {
	members map[string]*member
	all     *set
	// labels[k][v] is the set of members whose labels have k = v.
	labels map[string]map[string]*set
	events map[string]*eventInfo
	checks map[string]*checkInfo
}

func newIndex() *index {
	return &index{
		members: map[string]*member{},
		all:     newSet(),
		labels:  map[string]map[string]*set{},
		events:  map[string]*eventInfo{},
		checks:  map[string]*checkInfo{},
	}
}

// build makes the Proxy of member m at addr since since from the secondary
// sources, and indexes its labels. It reports whether the Proxy changed.
func (x *index) build(m *member, addr string, since time.Time) bool {
	old := m.p
	p := Proxy{ID: old.ID, Addr: addr, Since: since}
	ev := x.events[p.ID]
	if ev != nil {
		p.Host, p.Labels = ev.host, ev.labels
	}
	if c := x.checks[p.ID]; c != nil && c.addr == p.Addr {
		p.Egress = c.egress
	}
	if p.Host == old.Host && p.Egress == old.Egress && p.Addr == old.Addr && p.Since.Equal(old.Since) &&
		maps.Equal(p.Labels, old.Labels) && m.labelled == (ev != nil) {
		return false
	}
	x.unindexLabels(m)
	m.p = p
	if ev != nil {
		m.labelled = true
		for k, v := range p.Labels {
			byValue := x.labels[k]
			if byValue == nil {
				byValue = map[string]*set{}
				x.labels[k] = byValue
			}
			s := byValue[v]
			if s == nil {
				s = newSet()
				byValue[v] = s
			}
			s.add(m)
		}
	}
	return true
}

// refresh rebuilds m after a secondary source changed.
func (x *index) refresh(m *member) bool { return x.build(m, m.p.Addr, m.p.Since) }

func (x *index) unindexLabels(m *member) {
	if !m.labelled {
		return
	}
	for k, v := range m.p.Labels {
		byValue := x.labels[k]
		if s := byValue[v]; s != nil {
			s.remove(m)
			if len(s.items) == 0 {
				delete(byValue, v)
				if len(byValue) == 0 {
					delete(x.labels, k)
				}
			}
		}
	}
	m.labelled = false
}

// putMember records that id is in the rotation at addr since since (its
// key's write), as delivered by watcher generation gen. It reports whether
// what Pick sees changed.
func (x *index) putMember(id, addr string, since time.Time, gen uint64) bool {
	m := x.members[id]
	if m == nil {
		m = &member{p: Proxy{ID: id}, idHash: hashString(id)}
		x.members[id] = m
		x.all.add(m)
	}
	m.gen = gen
	return x.build(m, addr, since)
}

func (x *index) delMember(id string) bool {
	m := x.members[id]
	if m == nil {
		return false
	}
	x.unindexLabels(m)
	x.all.remove(m)
	delete(x.members, id)
	return true
}

func (x *index) putEvent(id, host string, labels map[string]string, gen uint64) bool {
	ev := x.events[id]
	existed := ev != nil
	if !existed {
		ev = &eventInfo{}
		x.events[id] = ev
	}
	ev.gen = gen
	if existed && ev.host == host && maps.Equal(ev.labels, labels) {
		return false
	}
	ev.host, ev.labels = host, labels
	if m := x.members[id]; m != nil {
		return x.refresh(m)
	}
	return false
}

func (x *index) delEvent(id string) bool {
	if _, ok := x.events[id]; !ok {
		return false
	}
	delete(x.events, id)
	if m := x.members[id]; m != nil {
		return x.refresh(m)
	}
	return false
}

func (x *index) putCheck(id, addr, egress string, gen uint64) bool {
	c := x.checks[id]
	existed := c != nil
	if !existed {
		c = &checkInfo{}
		x.checks[id] = c
	}
	c.gen = gen
	if existed && c.addr == addr && c.egress == egress {
		return false
	}
	c.addr, c.egress = addr, egress
	if m := x.members[id]; m != nil {
		return x.refresh(m)
	}
	return false
}

func (x *index) delCheck(id string) bool {
	if _, ok := x.checks[id]; !ok {
		return false
	}
	delete(x.checks, id)
	if m := x.members[id]; m != nil {
		return x.refresh(m)
	}
	return false
}

// The sweeps drop what a remade source did not deliver among its initial
// values (generation gen): O(fleet), once per remake.

func (x *index) sweepMembers(gen uint64) (n int) {
	for id, m := range x.members {
		if m.gen < gen {
			x.delMember(id)
			n++
		}
	}
	return n
}

func (x *index) sweepEvents(gen uint64) (n int) {
	for id, ev := range x.events {
		if ev.gen < gen {
			if x.delEvent(id) {
				n++
			}
		}
	}
	return n
}

func (x *index) sweepChecks(gen uint64) (n int) {
	for id, c := range x.checks {
		if c.gen < gen {
			if x.delCheck(id) {
				n++
			}
		}
	}
	return n
}
