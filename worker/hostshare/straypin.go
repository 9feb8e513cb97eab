package hostshare

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Stray pins. The server pins a host's work consumer to a waiting pull
// request as it picks one to deliver to, before the message goes out; a
// request left on the server by a consume its worker has just stopped (a
// handover) can be picked, and the pin then belongs to no worker that
// knows it. Its worker never learns the pin, so it does not unpin it, and
// the host's next owner would wait for the pin to expire
// (worker.pinned_ttl) before any of the host's work runs
// (docs/DECISIONS.md, "Stray pins are released").
//
// So a worker that pulls a host it is assigned, and still has no pin a
// heartbeat after claiming it, looks at the consumer's pin; one that no
// worker's record holds (every worker publishes the pins it knows, and
// writes its record at once when it learns one) at two looks a heartbeat
// apart is a stray, and it unpins it. A worker that knows its pin (it got
// a message with it) is never unpinned this way: its record holds it, so
// a worker working on a host keeps it.

// strayLooks is the membership's state of the looks at pins, by host;
// the membership's loop owns it.
type strayLooks struct {
	seen     chan straySighting
	wg       sync.WaitGroup // looks and unpins in flight
	pinless  map[string]int
	inFlight map[string]bool
	once     map[string]string // a pin no record held at the last look
}

// straySighting is what a look at host's consumer found: its pin ("" for
// none).
type straySighting struct {
	host string
	pin  string
	err  error
}

func newStrayLooks(hosts int) strayLooks {
	return strayLooks{seen: make(chan straySighting, hosts), pinless: map[string]int{},
		inFlight: map[string]bool{}, once: map[string]string{}}
}

// lookForStrays is called every heartbeat, after the claims: it counts the
// heartbeats each assigned, pulled host has gone without a pin, and looks
// at the pin of those past one.
func (m *Membership) lookForStrays(ctx context.Context) {
	s := &m.strays
	if !m.viewed {
		return // no records read: every pin would look stray
	}
	for h, c := range m.cfg.Hosts {
		if !c.Pulling() || !m.wanted[h] || c.Pin() != "" || !m.assigned(h) {
			delete(s.pinless, h)
			delete(s.once, h)
			continue
		}
		s.pinless[h]++
		if s.pinless[h] < 2 || s.inFlight[h] {
			continue
		}
		s.inFlight[h] = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			pin, err := m.pinOf(ctx, h)
			select {
			case s.seen <- straySighting{host: h, pin: pin, err: err}:
			case <-ctx.Done():
			}
		}()
	}
}

// pinOf reads the pin of host's work consumer, within a heartbeat.
func (m *Membership) pinOf(ctx context.Context, host string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	cons, err := m.js.Consumer(ctx, messages.StreamWork, topology.WorkConsumer(host))
	if err != nil {
		return "", fmt.Errorf("look at the pin of host %s: %w", host, err)
	}
	return pinnedTo(cons), nil
}

// judgeStray takes what a look found: a pin that no record holds at two
// looks in a row is unpinned.
func (m *Membership) judgeStray(ctx context.Context, f straySighting) {
	s, h := &m.strays, f.host
	delete(s.inFlight, h)
	c := m.cfg.Hosts[h]
	if f.err != nil || f.pin == "" || c.Pin() != "" || !c.Pulling() || m.pinHeld(f.pin) {
		delete(s.once, h)
		return
	}
	if s.once[h] != f.pin {
		s.once[h] = f.pin // look again at the next heartbeat
		return
	}
	delete(s.once, h)
	delete(s.pinless, h)
	m.cfg.Log.Info("unpinning host: its pin is held by no worker (a pull request left by a stopped consume)", "host", h)
	if m.cfg.StrayUnpinned != nil {
		m.cfg.StrayUnpinned()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := m.cfg.Unpins.Unpin(ctx, ctx, h)
		if err != nil && ctx.Err() == nil {
			m.cfg.Log.Warn("unpin host whose pin no worker holds (it expires after pinned_ttl)", "host", h, "err", err)
		}
	}()
}

// pinHeld reports whether a worker's record, this worker's own hosts
// included, holds pin.
func (m *Membership) pinHeld(pin string) bool {
	for _, c := range m.cfg.Hosts {
		if c.Pin() == pin {
			return true
		}
	}
	for _, mem := range m.recs {
		for _, p := range mem.rec.Pins {
			if p == pin {
				return true
			}
		}
	}
	return false
}

// assigned reports whether host is one of this worker's share.
func (m *Membership) assigned(host string) bool {
	return slices.Contains(m.share, host)
}
