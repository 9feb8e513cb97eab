package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
	"proxyfleet/worker/hostshare"
)

// hostCalls records the provider calls in flight on each host, by worker,
// and every call that started while another worker had one in flight on
// the same host: two owners of one host at once.
type hostCalls struct {
	mu       sync.Mutex
	active   map[string]map[string]int // host → worker → calls in flight
	calls    map[string]int            // worker → calls made
	overlaps []string
}

func newHostCalls() *hostCalls {
	return &hostCalls{active: map[string]map[string]int{}, calls: map[string]int{}}
}

func (hc *hostCalls) enter(host, id, call string) func() {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.active[host] == nil {
		hc.active[host] = map[string]int{}
	}
	for other, n := range hc.active[host] {
		if other != id && n > 0 {
			hc.overlaps = append(hc.overlaps, fmt.Sprintf("%s: %s by %s while %s had %d calls in flight", host, call, id, other, n))
		}
	}
	hc.active[host][id]++
	hc.calls[id]++
	return func() {
		hc.mu.Lock()
		hc.active[host][id]--
		hc.mu.Unlock()
	}
}

// busy reports whether every one of hosts has a call in flight.
func (hc *hostCalls) busy(hosts []string) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	for _, h := range hosts {
		n := 0
		for _, c := range hc.active[h] {
			n += c
		}
		if n == 0 {
			return false
		}
	}
	return true
}

// tracked is a host's provider that tells hc of its calls.
type tracked struct {
	worker.Provider
	host, id string
	hc       *hostCalls
}

func (p tracked) Create(ctx context.Context, s fleet.Spec) (fleet.Instance, error) {
	defer p.hc.enter(p.host, p.id, "create "+s.ID)()
	return p.Provider.Create(ctx, s)
}

func (p tracked) Get(ctx context.Context, id string) (fleet.Instance, error) {
	defer p.hc.enter(p.host, p.id, "get "+id)()
	return p.Provider.Get(ctx, id)
}

func (p tracked) Delete(ctx context.Context, id string) error {
	defer p.hc.enter(p.host, p.id, "delete "+id)()
	return p.Provider.Delete(ctx, id)
}

func (p tracked) List(ctx context.Context) ([]fleet.Instance, error) {
	defer p.hc.enter(p.host, p.id, "list")()
	return p.Provider.List(ctx)
}

// as names the worker id and tracks its calls on sim hosts of delay.
func as(r *rig, hc *hostCalls, id string, delay time.Duration) workerOpt {
	return func(c *worker.Config) {
		c.ID = id
		for _, h := range r.hosts {
			d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: delay})
			if err != nil {
				r.t.Fatal(err)
			}
			c.Providers[h] = tracked{d, h, id, hc}
		}
	}
}

// owners is who owns each host as the server sees it (the pinned client
// of its work consumer, named by a worker record); hosts pinned to nobody,
// or to a client no record names, are absent.
func (r *rig) owners() map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	os, err := hostshare.Owners(ctx, r.js, r.hosts)
	if err != nil {
		r.t.Logf("owners: %v", err)
		return nil
	}
	out := map[string]string{}
	for h, o := range os {
		if o.Worker != "" {
			out[h] = o.Worker
		}
	}
	return out
}

// shares counts the hosts each worker owns.
func shares(owners map[string]string) map[string]int {
	out := map[string]int{}
	for _, id := range owners {
		out[id]++
	}
	return out
}

// waitShares waits until every host is owned and each of ids owns n, and
// returns how long after start that was.
func (r *rig) waitShares(start time.Time, what string, n int, ids ...string) time.Duration {
	r.t.Helper()
	var last map[string]string
	held := poll.WaitEvery(30*time.Second, 50*time.Millisecond, func() bool {
		last = r.owners()
		if len(last) != len(r.hosts) {
			return false
		}
		got := shares(last)
		if len(got) != len(ids) {
			return false
		}
		for _, id := range ids {
			if got[id] != n {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	if !held {
		r.t.Fatalf("timed out after %s waiting for %s; owners (of pinned hosts): %v", took.Round(time.Millisecond), what, last)
	}
	r.t.Logf("%s after %s: %v", what, took.Round(time.Millisecond), last)
	return took
}

// traffic publishes a create for a new proxy on each host in turn until
// stop is called, which returns the command ids.
func (r *rig) traffic(every time.Duration) (stop func() []string) {
	quit, done := make(chan struct{}), make(chan struct{})
	var cmds []string
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			id, cmd := fmt.Sprintf("t%03d", i), fmt.Sprintf("ct%03d", i)
			m := nats.NewMsg(subj.Create(id))
			m.Data = fmt.Appendf(nil, `{"v":1,"id":%q,"host":%q}`, id, r.hosts[i%len(r.hosts)])
			m.Header.Set("Nats-Msg-Id", cmd)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := r.js.PublishMsg(ctx, m)
			cancel()
			if err != nil {
				r.t.Errorf("publish %s: %v", id, err)
				return
			}
			cmds = append(cmds, cmd)
		}
	}()
	return func() []string {
		close(quit)
		<-done
		return cmds
	}
}

// Three workers share six hosts two each, as the server sees it (which
// worker each host's consumer is pinned to); a drained worker's hosts go
// to the other two, three each, at once; back, it takes two again. Work
// keeps flowing meanwhile, and no host ever has calls from two workers at
// once: a worker handing a host over keeps its pin until the host's work
// in flight has ended.
func TestHostsSharedOverWorkers(t *testing.T) {
	r := newRig(t, "s1", "s2", "s3", "s4", "s5", "s6")
	hc := newHostCalls()
	const delay = 100 * time.Millisecond
	start := time.Now()
	r.startWorker(as(r, hc, "w1", delay))
	r.startWorker(as(r, hc, "w2", delay))
	w3 := r.startWorker(as(r, hc, "w3", delay))
	settle := r.waitShares(start, "two hosts each", 2, "w1", "w2", "w3")

	// What the workers say they own is what the server says.
	r.waitFor("the records to say what the server says", 10*time.Second, func() bool {
		recs, err := hostshare.WorkerRecords(context.Background(), r.js)
		if err != nil {
			return false
		}
		owned := map[string]string{}
		for _, rec := range recs {
			for _, h := range rec.Owned {
				owned[h] = rec.ID
			}
		}
		return maps.Equal(owned, r.owners())
	})

	stop := r.traffic(25 * time.Millisecond)
	r.waitFor("work in flight on every host", 10*time.Second, func() bool { return hc.busy(r.hosts) })
	start = time.Now()
	if err := r.stopWorker(w3); err != nil {
		t.Fatal(err)
	}
	handover := r.waitShares(start, "three hosts each after w3 drained", 3, "w1", "w2")
	start = time.Now()
	r.startWorker(as(r, hc, "w3", delay))
	back := r.waitShares(start, "two hosts each with w3 back", 2, "w1", "w2", "w3")
	cmds := stop()
	for _, c := range cmds {
		r.waitOutcome(c, messages.OutcomeDone)
	}
	t.Logf("settled %s after the first start; w3's hosts owned again %s after its stop began (it drains); two each again %s after its start began; %d commands done",
		settle.Round(time.Millisecond), handover.Round(time.Millisecond), back.Round(time.Millisecond), len(cmds))

	hc.mu.Lock()
	for _, o := range hc.overlaps {
		t.Error("two owners:", o)
	}
	calls := maps.Clone(hc.calls)
	hc.mu.Unlock()
	t.Logf("provider calls by worker: %v", calls)
	for _, h := range r.hosts {
		if lines := readLines(r.hostDir(h) + "/overlaps.log"); len(lines) > 0 {
			t.Errorf("%s: calls for one id overlapped: %v", h, lines)
		}
		fields := readLines(r.hostDir(h) + "/creates.log") // "id command" per create
		ids := map[string]bool{}
		for i := 0; i+1 < len(fields); i += 2 {
			if ids[fields[i]] {
				t.Errorf("%s: %s created twice", h, fields[i])
			}
			ids[fields[i]] = true
		}
	}
}

// A worker live by its record that does not pull the hosts assigned to it
// (here a record the test renews, of no worker at all) does not leave them
// without an owner: once it has not pulled them for Liveness, the others
// pull them too.
func TestHostsOfAWorkerThatDoesNotPullThemAreOwned(t *testing.T) {
	r := newRig(t, "s1", "s2", "s3", "s4")
	hc := newHostCalls()
	r.startWorker(as(r, hc, "w1", 0))
	r.waitShares(time.Now(), "w1 alone to own every host", 4, "w1")

	kv, err := r.js.KeyValue(ctxFor(t, 5*time.Second), messages.BucketWorkers)
	if err != nil {
		t.Fatal(err)
	}
	quit, stopped := make(chan struct{}), make(chan struct{})
	defer func() { close(quit); <-stopped }()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		started := time.Now().UTC()
		for {
			b, _ := json.Marshal(messages.WorkerRecord{V: 1, ID: "ghost", State: messages.WorkerActive, Hosts: r.hosts, Started: started, At: time.Now().UTC()})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = kv.Put(ctx, "ghost", b)
			cancel()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	// The ghost's share is handed over to it, and nobody owns it...
	r.waitFor("w1 to give the ghost its share", 30*time.Second, func() bool {
		return len(r.owners()) == 2
	})
	// ... until w1 pulls it too.
	start := time.Now()
	took := r.waitShares(start, "w1 to own the ghost's share too", 4, "w1")
	t.Logf("the hosts of a worker that does not pull them were owned again %s after it was given them", took.Round(time.Millisecond))
}
