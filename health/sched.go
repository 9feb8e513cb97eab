package health

import (
	"context"
	"sync"
	"time"
)

// probeSched hands probes to a fixed pool of workers (Concurrency of
// them): first the proxies to probe at once (soon: new candidates, and
// rising ones after a pass), then the current round's. A proxy is never
// probed twice at the same time: one asked for while its probe is in
// flight is probed again once that one ends. report is called from the
// worker for each probe that ran, before the proxy counts as no longer in
// flight.
type probeSched struct {
	p       Prober
	workers int
	timeout time.Duration
	now     func() time.Time
	report  func(context.Context, probeOutcome)

	mu        sync.Mutex
	wake      chan struct{}       // closed (and replaced) when work is added
	inflight  map[string]struct{} // ids being probed
	soon      []string            // ids to probe at once, in order
	soonT     map[string]Target   // their latest targets
	waiting   map[string]Target   // to probe at once once the probe in flight ends
	round     []Target            // the current round's targets not handed out yet
	roundLeft int                 // its probes not ended yet
	roundDone chan struct{}       // closed when roundLeft reaches 0
}

func newProbeSched(p Prober, workers int, timeout time.Duration, now func() time.Time, report func(context.Context, probeOutcome)) *probeSched {
	return &probeSched{
		p: p, workers: max(1, workers), timeout: timeout, now: now, report: report,
		wake:     make(chan struct{}),
		inflight: make(map[string]struct{}),
		soonT:    make(map[string]Target),
		waiting:  make(map[string]Target),
	}
}

// run runs the workers until ctx is done and they have ended.
func (s *probeSched) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t, inRound, ok := s.next(ctx)
				if !ok {
					return
				}
				s.report(ctx, probeOne(ctx, s.p, t, s.timeout, s.now))
				s.done(t, inRound)
			}
		}()
	}
	wg.Wait()
}

func (s *probeSched) broadcastLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// probeSoon asks for t to be probed at once, ahead of the round.
func (s *probeSched) probeSoon(t Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.inflight[t.ID]; busy {
		s.waiting[t.ID] = t
		return
	}
	if _, queued := s.soonT[t.ID]; !queued {
		s.soon = append(s.soon, t.ID)
	}
	s.soonT[t.ID] = t
	s.broadcastLocked()
}

// startRound hands out targets as a round and returns a channel closed
// once every one of its probes has ended (a target already in flight
// counts as probed). It must not be called before the last round is done.
func (s *probeSched) startRound(targets []Target) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.round, s.roundLeft, s.roundDone = targets, len(targets), make(chan struct{})
	if len(targets) == 0 {
		close(s.roundDone)
	}
	s.broadcastLocked()
	return s.roundDone
}

func (s *probeSched) roundEndedLocked() {
	if s.roundLeft--; s.roundLeft == 0 {
		close(s.roundDone)
	}
}

// next returns the next target to probe, marking it in flight, and
// whether it is the round's; or false once ctx is done.
func (s *probeSched) next(ctx context.Context) (Target, bool, bool) {
	for {
		if ctx.Err() != nil {
			return Target{}, false, false
		}
		s.mu.Lock()
		for len(s.soon) > 0 {
			id := s.soon[0]
			if s.soon = s.soon[1:]; len(s.soon) == 0 {
				s.soon = nil
			}
			t, ok := s.soonT[id]
			if !ok {
				continue
			}
			delete(s.soonT, id)
			if _, busy := s.inflight[id]; busy {
				s.waiting[id] = t
				continue
			}
			s.inflight[id] = struct{}{}
			s.mu.Unlock()
			return t, false, true
		}
		for len(s.round) > 0 {
			t := s.round[0]
			s.round = s.round[1:]
			if _, busy := s.inflight[t.ID]; busy {
				s.roundEndedLocked()
				continue
			}
			s.inflight[t.ID] = struct{}{}
			s.mu.Unlock()
			return t, true, true
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Target{}, false, false
		}
	}
}

// done marks t's probe as ended.
func (s *probeSched) done(t Target, inRound bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, t.ID)
	if inRound {
		s.roundEndedLocked()
	}
	if w, ok := s.waiting[t.ID]; ok {
		delete(s.waiting, t.ID)
		if _, queued := s.soonT[w.ID]; !queued {
			s.soon = append(s.soon, w.ID)
		}
		s.soonT[w.ID] = w
		s.broadcastLocked()
	}
}
