package worker_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"proxyfleet/messages"
)

type sent struct {
	seq   uint64
	op    string
	cmdID string
	host  string
	image string
}

// TestInterleavedCommandsOnThreeWorkers drives 300 proxies through random
// interleavings of create and delete from several goroutines, against three
// workers that share nothing but NATS. Every proxy must end in the state of
// its highest-sequence command, no two calls for one id may overlap (the sim
// host records overlaps across processes with flock), and no command id may
// create twice.
func TestInterleavedCommandsOnThreeWorkers(t *testing.T) {
	const (
		proxies    = 300
		publishers = 4
		perPub     = 250
	)
	hosts := []string{"h1", "h2", "h3"}
	r := newRig(t, hosts...)
	for range 3 {
		r.startWorker()
	}

	var mu sync.Mutex
	last := map[string]sent{}
	record := func(id string, s sent) {
		mu.Lock()
		if s.seq > last[id].seq {
			last[id] = s
		}
		mu.Unlock()
	}
	publishOne := func(rng *rand.Rand, id string, n int) {
		cmdID := fmt.Sprintf("%s-%d-%d", id, n, rng.Uint64())
		if rng.IntN(3) == 0 {
			record(id, sent{seq: r.delete(id, cmdID), op: messages.OpDelete, cmdID: cmdID})
			return
		}
		s := sent{op: messages.OpCreate, cmdID: cmdID, image: []string{"img", "img2"}[rng.IntN(2)]}
		extra := fmt.Sprintf(`,"image":%q`, s.image)
		if rng.IntN(2) == 0 {
			s.host = hosts[rng.IntN(len(hosts))]
			extra += fmt.Sprintf(`,"host":%q`, s.host)
		}
		s.seq = r.create(id, cmdID, extra)
		record(id, s)
	}
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 42))
			for n := range perPub {
				publishOne(rng, fmt.Sprintf("p%03d", rng.IntN(proxies)), p*perPub+n)
			}
		}()
	}
	wg.Wait()
	// Make sure every proxy had at least one command.
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range proxies {
		id := fmt.Sprintf("p%03d", i)
		mu.Lock()
		_, ok := last[id]
		mu.Unlock()
		if !ok {
			publishOne(rng, id, 100000+i)
		}
	}

	// The last commands wait behind the whole backlog (about 8 s here
	// alone, several times that with other test packages on the 2 cores,
	// where a 30 s bound per command timed out): one generous bound for all.
	pending := map[string]bool{}
	for _, s := range last {
		pending[s.cmdID] = true
	}
	r.waitFor("every proxy's last command done", 3*time.Minute, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, res := range r.results {
			if res.Outcome == messages.OutcomeDone {
				delete(pending, res.CommandID)
			}
		}
		return len(pending) == 0
	})
	for id, s := range last {
		ev, ok := r.lastEvent(id)
		if !ok {
			t.Errorf("%s: no event", id)
			continue
		}
		switch s.op {
		case messages.OpCreate:
			if ev.State != messages.StateRunning || ev.CommandID != s.cmdID {
				t.Errorf("%s: last event %s for %s, want running for %s", id, ev.State, ev.CommandID, s.cmdID)
			}
		case messages.OpDelete:
			if ev.State != messages.StateDeleted || ev.CommandID != s.cmdID {
				t.Errorf("%s: last event %s for %s, want deleted for %s", id, ev.State, ev.CommandID, s.cmdID)
			}
		}
	}
	// A proxy moved away from a host is removed there by a work item of
	// its own; wait for those, bounded.
	r.waitFor("moved proxies to be cleaned up", time.Minute, func() bool {
		for id, s := range last {
			n := 0
			for _, h := range hosts {
				if r.domainExists(h, id) {
					n++
				}
			}
			if (s.op == messages.OpCreate && n != 1) || (s.op == messages.OpDelete && n != 0) {
				return false
			}
		}
		return true
	})
	for id, s := range last {
		found := 0
		for _, h := range hosts {
			if r.domainExists(h, id) {
				found++
				if s.op == messages.OpCreate && s.host != "" && h != s.host {
					t.Errorf("%s: domain on %s, want %s", id, h, s.host)
				}
			}
		}
		if want := map[string]int{messages.OpCreate: 1, messages.OpDelete: 0}[s.op]; found != want {
			t.Errorf("%s: %d domains, want %d", id, found, want)
		}
	}
	for _, h := range hosts {
		if b, err := os.ReadFile(filepath.Join(r.hostDir(h), "overlaps.log")); err == nil {
			t.Errorf("%s: calls for one id overlapped:\n%s", h, b)
		}
		seen := map[string]bool{}
		lines := readLines(filepath.Join(r.hostDir(h), "creates.log"))
		for i := 1; i < len(lines); i += 2 {
			if seen[lines[i]] {
				t.Errorf("%s: command %s created twice", h, lines[i])
			}
			seen[lines[i]] = true
		}
	}
	t.Logf("%d commands for %d proxies", publishers*perPub, len(last))
}
