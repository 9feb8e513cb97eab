package health

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// A proxy asked for at once goes before the round's targets not yet
// handed out, and a proxy asked for while its probe is in flight is
// probed again after that one ends, never twice at the same time.
func TestProbeSchedSoonFirstAndOneAtATime(t *testing.T) {
	var mu sync.Mutex
	var order []string
	busy := map[string]bool{}
	gate := make(chan struct{})
	started := make(chan string, 100)
	p := ProberFunc(func(ctx context.Context, addr string) error {
		mu.Lock()
		if busy[addr] {
			t.Errorf("%s probed twice at the same time", addr)
		}
		busy[addr] = true
		order = append(order, addr)
		mu.Unlock()
		started <- addr
		<-gate
		mu.Lock()
		busy[addr] = false
		mu.Unlock()
		return nil
	})
	s := newProbeSched(p, 1, time.Minute, time.Now, func(context.Context, probeOutcome) {})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); s.run(ctx) }()
	defer func() { cancel(); <-ran }()

	tg := targets(5)
	round := s.startRound(tg)
	if a := <-started; a != tg[0].Addr {
		t.Fatalf("first probe of %s, want %s", a, tg[0].Addr)
	}
	urgent := Target{ID: "new", Addr: "198.18.200.1:3128", Epoch: 99}
	s.probeSoon(urgent)
	s.probeSoon(tg[0]) // in flight: again once it ends
	gate <- struct{}{}
	for range 6 {
		<-started
		gate <- struct{}{}
	}
	<-round
	want := []string{tg[0].Addr, urgent.Addr, tg[0].Addr, tg[1].Addr, tg[2].Addr, tg[3].Addr, tg[4].Addr}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("probed %v, want %v", order, want)
	}
}
