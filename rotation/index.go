package rotation

import (
	"maps"
	"slices"
	"sync/atomic"

	"proxyfleet/messages"
)

// member is one proxy in the rotation: the Proxy a pick returns, and what
// the index and the picks need of it.
type member struct {
	p      Proxy
	idHash uint64 // hash of the id, for PickSession
	// inflight counts requests on it (Acquire), for least-busy.
	inflight atomic.Int64
	// gen is the generation of the last read of the pages that found it
	// (or of a message after it): after a read, members of older
	// generations are gone.
	gen uint64
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

// index is the rotation as this process knows it: the members and the
// label sets. Every method is O(1) in the size of the fleet (O(labels of
// one proxy)), except the sweep, which runs once per read of the pages.
type index struct {
	members map[string]*member
	all     *set
	// labels[k][v] is the set of members whose labels have k = v.
	labels map[string]map[string]*set
}

func newIndex() *index {
	return &index{
		members: map[string]*member{},
		all:     newSet(),
		labels:  map[string]map[string]*set{},
	}
}

// proxyOf is the Proxy of a rotation entry.
func proxyOf(e messages.RotationEntry) Proxy {
	p := Proxy{ID: e.ID, Addr: e.Addr, Host: e.Host, Egress: e.Egress, Since: e.Since}
	if len(e.Labels) > 0 {
		p.Labels = e.Labels
	}
	if len(e.EgressAddrs) > 0 {
		// An entry whose list does not read is used without it: its
		// proxy leaves from the address it chooses itself.
		p.EgressAddrs, _ = messages.ExpandEgress(e.EgressAddrs)
	}
	return p
}

func sameProxy(a, b Proxy) bool {
	return a.ID == b.ID && a.Addr == b.Addr && a.Host == b.Host && a.Egress == b.Egress &&
		a.Since.Equal(b.Since) && maps.Equal(a.Labels, b.Labels) && slices.Equal(a.EgressAddrs, b.EgressAddrs)
}

func (x *index) indexLabels(m *member) {
	for k, v := range m.p.Labels {
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

func (x *index) unindexLabels(m *member) {
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
}

// put records that p is in the rotation, as read by the read of the
// pages of generation gen (or a message of the feed after it). It
// reports whether what Pick sees changed.
func (x *index) put(p Proxy, gen uint64) bool {
	m := x.members[p.ID]
	if m == nil {
		m = &member{p: Proxy{ID: p.ID}, idHash: hashString(p.ID)}
		x.members[p.ID] = m
		x.all.add(m)
	} else if sameProxy(m.p, p) {
		m.gen = gen
		return false
	}
	m.gen = gen
	x.unindexLabels(m)
	m.p = p
	x.indexLabels(m)
	return true
}

func (x *index) del(id string) bool {
	m := x.members[id]
	if m == nil {
		return false
	}
	x.unindexLabels(m)
	x.all.remove(m)
	delete(x.members, id)
	return true
}

// sweep drops the members a read of the pages of generation gen did not
// find: O(fleet), once per read.
func (x *index) sweep(gen uint64) (n int) {
	for id, m := range x.members {
		if m.gen < gen {
			x.del(id)
			n++
		}
	}
	return n
}
