package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"proxyfleet/topology"
)

// Stray pins. The server pins a host's work consumer to a waiting pull
// request as it picks one to deliver to, before the message goes out; a
// request left on the server by a consume its worker has just stopped (a
// handover) can be picked, and the pin then belongs to no worker that
// knows it. Its worker never learns the pin, so it does not unpin it, and
// the host's next owner would wait for the pin to expire
// (worker.pinned_ttl, 15s by default) before any of the host's work runs
// (docs/DECISIONS.md, "Stray pins are released").
//
// So a worker that pulls a host it is assigned, and still has no pin a
// heartbeat after claiming it, looks at the consumer's pin; one that no
// worker's record holds (every worker publishes the pins it knows, and
// writes its record at once when it learns one) at two looks a heartbeat
// apart is a stray, and it unpins it. A worker that knows its pin (it got
// a message with it) is never unpinned this way: its record holds it, so
// a worker working on a host keeps it.

// strayLooks is the membership's state of the looks at pins; the
// membership's loop owns it.
type strayLooks struct {
	seen     chan straySighting
	wg       sync.WaitGroup // looks and unpins in flight
	pinless  map[*consumerRun]int
	inFlight map[*consumerRun]bool
	once     map[*consumerRun]string // a pin no record held at the last look
}

// straySighting is what a look found: the consumer's pin ("" for none).
type straySighting struct {
	run *consumerRun
	pin string
	err error
}

func newStrayLooks(runs int) strayLooks {
	return strayLooks{seen: make(chan straySighting, runs), pinless: map[*consumerRun]int{},
		inFlight: map[*consumerRun]bool{}, once: map[*consumerRun]string{}}
}

// lookForStrays is called every heartbeat, after the claims: it counts the
// heartbeats each assigned, pulled host has gone without a pin, and looks
// at the pin of those past one.
func (m *membership) lookForStrays(ctx context.Context) {
	s := &m.strays
	if !m.viewed {
		return // no records read: every pin would look stray
	}
	for _, c := range m.runs {
		if c.host == "" || !c.pulling.Load() || !c.wanted.Load() || c.getPin() != "" || !m.assigned(c.host) {
			delete(s.pinless, c)
			delete(s.once, c)
			continue
		}
		s.pinless[c]++
		if s.pinless[c] < 2 || s.inFlight[c] {
			continue
		}
		s.inFlight[c] = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			pin, err := m.pinOf(ctx, c)
			select {
			case s.seen <- straySighting{run: c, pin: pin, err: err}:
			case <-ctx.Done():
			}
		}()
	}
}

// pinOf reads the pin of c's consumer, within a heartbeat.
func (m *membership) pinOf(ctx context.Context, c *consumerRun) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.w.cfg.Heartbeat)
	defer cancel()
	cons, err := m.w.js.Consumer(ctx, c.stream, c.name())
	if err != nil {
		return "", fmt.Errorf("look at the pin of host %s: %w", c.host, err)
	}
	for _, g := range cons.CachedInfo().PriorityGroups {
		if g.Group == topology.PriorityGroup {
			return g.PinnedClientID, nil
		}
	}
	return "", nil
}

// judgeStray takes what a look found: a pin that no record holds at two
// looks in a row is unpinned.
func (m *membership) judgeStray(ctx context.Context, f straySighting) {
	s, c := &m.strays, f.run
	delete(s.inFlight, c)
	if f.err != nil || f.pin == "" || c.getPin() != "" || !c.pulling.Load() || m.pinHeld(f.pin) {
		delete(s.once, c)
		return
	}
	if s.once[c] != f.pin {
		s.once[c] = f.pin // look again at the next heartbeat
		return
	}
	delete(s.once, c)
	delete(s.pinless, c)
	m.w.log.Info("unpinning host: its pin is held by no worker (a pull request left by a stopped consume)", "host", c.host)
	m.w.metrics.strayPins.Inc()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := m.w.unpins.unpin(ctx, ctx, m.w.js, c.stream, c.name())
		if err != nil && ctx.Err() == nil {
			m.w.log.Warn("unpin host whose pin no worker holds (it expires after pinned_ttl)", "host", c.host, "err", err)
		}
	}()
}

// pinHeld reports whether a worker's record, this worker's own runs
// included, holds pin.
func (m *membership) pinHeld(pin string) bool {
	for _, c := range m.runs {
		if c.getPin() == pin {
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
func (m *membership) assigned(host string) bool {
	return slices.Contains(m.share, host)
}
