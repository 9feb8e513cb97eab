package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// withRoom gives every host of the rig room for n proxies.
func withRoom(r *rig, n int) workerOpt {
	return func(c *worker.Config) {
		c.Catalog.MaxProxies = map[string]int{}
		for _, h := range r.hosts {
			c.Catalog.MaxProxies[h] = n
		}
	}
}

// hostRecord reads host's record in PROXY_HOSTS.
func (r *rig) hostRecord(host string) (messages.HostRecord, bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketHosts)
	if err != nil {
		r.t.Fatal(err)
	}
	e, err := kv.Get(ctx, host)
	if err != nil {
		return messages.HostRecord{}, false
	}
	var rec messages.HostRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		r.t.Fatal(err)
	}
	return rec, true
}

// domains counts the sim domains on host.
func (r *rig) domains(host string) int {
	m, _ := filepath.Glob(filepath.Join(r.hostDir(host), "domains", "*.json"))
	return len(m)
}

// waitFinal waits for a final result of cmdID and returns it.
func (r *rig) waitFinal(cmdID string) messages.Result {
	r.t.Helper()
	var got messages.Result
	r.waitFor("a final result of "+cmdID, 30*time.Second, func() bool {
		for _, res := range r.resultsFor(cmdID) {
			switch res.Outcome {
			case messages.OutcomeDone, messages.OutcomeRejected, messages.OutcomeFailed, messages.OutcomeSuperseded:
				got = res
				return true
			}
		}
		return false
	})
	return got
}

// Two hosts with room for three each: seven creates naming no host give
// six proxies, three on each, and one rejection naming the host field and
// no room; after a delete, a new create finds the room it freed.
func TestPlacementByRoom(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.startWorker(withRoom(r, 3))
	for i := range 7 {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	var done []string
	rejected := 0
	for i := range 7 {
		res := r.waitFinal(fmt.Sprintf("c%d", i))
		switch res.Outcome {
		case messages.OutcomeDone:
			done = append(done, res.ID)
		case messages.OutcomeRejected:
			rejected++
			if res.Field != "host" || !strings.Contains(res.Reason, "no room") {
				t.Errorf("rejection of %s: field %q, reason %q; want host, no room", res.ID, res.Field, res.Reason)
			}
		default:
			t.Errorf("%s: %s (%s)", res.ID, res.Outcome, res.Reason)
		}
	}
	if len(done) != 6 || rejected != 1 {
		t.Fatalf("%d done, %d rejected; want 6 and 1", len(done), rejected)
	}
	for _, h := range r.hosts {
		rec, _ := r.hostRecord(h)
		if n := r.domains(h); n != 3 || len(rec.Proxies) != 3 || rec.MaxProxies != 3 {
			t.Errorf("%s: %d domains, reservations %v (max %d); want 3 each", h, n, rec.Proxies, rec.MaxProxies)
		}
	}

	r.delete(done[0], "d0")
	if res := r.waitFinal("d0"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("delete: %+v", res)
	}
	r.create("p7", "c7", "")
	if res := r.waitFinal("c7"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("create after a delete: %s (%s), want done", res.Outcome, res.Reason)
	}
	// A create again of a placed proxy needs no new room.
	r.create("p7", "c7-again", "")
	if res := r.waitFinal("c7-again"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("create again of a placed proxy: %s (%s), want done", res.Outcome, res.Reason)
	}
	// Both hosts are full again: a create naming one is rejected,
	// naming it full.
	host := "h1"
	r.create("p8", "c8", `,"host":"`+host+`"`)
	if res := r.waitFinal("c8"); res.Outcome != messages.OutcomeRejected || res.Field != "host" || !strings.Contains(res.Reason, "full") ||
		!strings.Contains(res.Reason, host) {
		t.Errorf("create on full %s: %+v; want rejected, host, full", host, res)
	}
	for _, h := range r.hosts {
		if n := r.domains(h); n != 3 {
			t.Errorf("%s: %d domains, want 3", h, n)
		}
	}
}

// Fifty creates at once, half naming a host, through three workers' intakes,
// against two hosts with room for ten each: exactly twenty run, and no host
// ever holds more than ten domains or reservations.
func TestConcurrentCreatesNeverOverfillAHost(t *testing.T) {
	r := newRig(t, "h1", "h2")
	const room = 10
	for range 3 {
		r.startWorker(withRoom(r, room), func(c *worker.Config) { c.Concurrency = 16 })
	}
	var (
		mu      sync.Mutex
		maxSeen = map[string]int{}
		maxRes  = map[string]int{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a sampler of domains and reservations
		defer wg.Done()
		for {
			for _, h := range r.hosts {
				n := r.domains(h)
				rec, _ := r.hostRecord(h)
				mu.Lock()
				maxSeen[h] = max(maxSeen[h], n)
				maxRes[h] = max(maxRes[h], len(rec.Proxies))
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	const n = 50
	var pub sync.WaitGroup
	for g := range 5 {
		pub.Add(1)
		go func() {
			defer pub.Done()
			for i := g; i < n; i += 5 {
				extra := ""
				if i%2 == 0 {
					extra = fmt.Sprintf(`,"host":"h%d"`, 1+i/2%2)
				}
				r.create(fmt.Sprintf("q%02d", i), fmt.Sprintf("cq%02d", i), extra)
			}
		}()
	}
	pub.Wait()
	done, rejected := 0, 0
	for i := range n {
		res := r.waitFinal(fmt.Sprintf("cq%02d", i))
		switch res.Outcome {
		case messages.OutcomeDone:
			done++
		case messages.OutcomeRejected:
			rejected++
			if res.Field != "host" {
				t.Errorf("rejection of %s names %q", res.ID, res.Field)
			}
		default:
			t.Errorf("%s: %s (%s)", res.ID, res.Outcome, res.Reason)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d done, %d rejected; most domains seen %v, most reservations seen %v", done, rejected, maxSeen, maxRes)
	if done != 2*room || rejected != n-2*room {
		t.Errorf("%d done, %d rejected; want %d and %d", done, rejected, 2*room, n-2*room)
	}
	for _, h := range r.hosts {
		rec, _ := r.hostRecord(h)
		if maxSeen[h] > room || maxRes[h] > room || r.domains(h) != room || len(rec.Proxies) != room {
			t.Errorf("%s: at most %d domains and %d reservations seen, %d domains and %d reservations at the end; room is %d",
				h, maxSeen[h], maxRes[h], r.domains(h), len(rec.Proxies), room)
		}
	}
	// Every reservation is a domain there.
	for _, h := range r.hosts {
		rec, _ := r.hostRecord(h)
		for id := range rec.Proxies {
			if _, err := os.Stat(filepath.Join(r.hostDir(h), "domains", id+".json")); err != nil {
				t.Errorf("%s reserved on %s, no domain there", id, h)
			}
		}
	}
}

// A reservation left by a crash is reconciled by the host's owner: one whose
// proxy was removed but not released (an executor that died in between) is
// released at the next observation; one whose command was never recorded
// (an intake that died after reserving) only after two AckWaits; and a
// domain with no reservation (PROXY_HOSTS lost) takes its room again.
func TestLeakedRoomIsReconciled(t *testing.T) {
	r := newRig(t, "h1")
	const ackWait = time.Second
	r.startWorker(withRoom(r, 5), func(c *worker.Config) {
		c.AckWait = ackWait
		c.ObserveInterval = 100 * time.Millisecond
	})
	createSeq := r.create("gone", "cg", "")
	r.waitOutcome("cg", messages.OutcomeDone)
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	r.delete("gone", "dg")
	r.waitOutcome("dg", messages.OutcomeDone)
	if rec, _ := r.hostRecord("h1"); len(rec.Proxies) != 1 || rec.Proxies["p1"] == 0 {
		t.Fatalf("reservations %v, want p1 alone", rec.Proxies)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketHosts)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	var rec messages.HostRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	rec.Proxies = map[string]uint64{"gone": createSeq, "ghost": 1 << 40}
	b, _ := json.Marshal(rec)
	if _, err := kv.Update(ctx, "h1", b, e.Revision()); err != nil {
		t.Fatal(err)
	}
	planted := time.Now()

	r.waitFor("the removed proxy's room released and p1's taken again", 10*time.Second, func() bool {
		rec, _ := r.hostRecord("h1")
		_, gone := rec.Proxies["gone"]
		_, p1 := rec.Proxies["p1"]
		return !gone && p1
	})
	if rec, _ := r.hostRecord("h1"); len(rec.Proxies) != 2 || rec.Proxies["ghost"] != 1<<40 {
		t.Errorf("reservations %v, want p1 and ghost (its command may still be on its way)", rec.Proxies)
	}
	r.waitFor("the unrecorded reservation released", 30*time.Second, func() bool {
		rec, _ := r.hostRecord("h1")
		_, ghost := rec.Proxies["ghost"]
		return !ghost
	})
	if d := time.Since(planted); d < 2*ackWait {
		t.Errorf("an unrecorded reservation released after %s, before two AckWaits", d)
	}
	t.Logf("unrecorded reservation released %s after it was planted", time.Since(planted).Round(time.Millisecond))
	if rec, _ := r.hostRecord("h1"); len(rec.Proxies) != 1 || !r.domainExists("h1", "p1") {
		t.Errorf("reservations %v, want p1 alone", rec.Proxies)
	}
}

// Placing creates ranks the hosts from the worker's view of PROXY_HOSTS:
// sixty creates over ten hosts read the host records a few times per
// create (the writer's batches, the executor's check before it creates),
// not once per host per create (600 reads before the view), and still
// spread evenly.
func TestPlacementDoesNotReadEveryHostPerCreate(t *testing.T) {
	hosts := make([]string, 10)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%d", i)
	}
	r := newRig(t, hosts...)
	var reads atomic.Int64
	sub, err := r.nc.Subscribe("$JS.API.DIRECT.GET.KV_"+messages.BucketHosts+".>", func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	r.startWorker(withRoom(r, 6))
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := reads.Load()
	const n = 60
	for i := range n {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	for i := range n {
		if res := r.waitFinal(fmt.Sprintf("c%d", i)); res.Outcome != messages.OutcomeDone {
			t.Fatalf("c%d: %s (%s)", i, res.Outcome, res.Reason)
		}
	}
	if got := reads.Load() - start; got >= n*int64(len(hosts))/2 {
		t.Errorf("%d reads of host records for %d creates over %d hosts; want fewer than %d", got, n, len(hosts), n*len(hosts)/2)
	} else {
		t.Logf("%d reads of host records for %d creates over %d hosts", got, n, len(hosts))
	}
	// Room for six on each of ten hosts, sixty creates: all placed, six
	// on each.
	for _, h := range hosts {
		if d := r.domains(h); d != 6 {
			t.Errorf("%s: %d domains, want 6", h, d)
		}
	}
}

// PROXY_HOSTS deleted and made anew while a worker runs: the worker's view
// of the records may still say every host is full, but placement reads a
// host afresh before it passes it over as full, so a new create is placed
// (as it was when placement read every record), not rejected for no room.
func TestPlacementAfterHostsBucketMadeAnew(t *testing.T) {
	r := newRig(t, "h1", "h2")
	r.startWorker(withRoom(r, 2))
	for i := range 4 {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	for i := range 4 {
		if res := r.waitFinal(fmt.Sprintf("c%d", i)); res.Outcome != messages.OutcomeDone {
			t.Fatalf("c%d: %s (%s)", i, res.Outcome, res.Reason)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.js.DeleteKeyValue(ctx, messages.BucketHosts); err != nil {
		t.Fatal(err)
	}
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, r.js); err != nil {
		t.Fatal(err)
	}
	r.create("p4", "c4", "")
	if res := r.waitFinal("c4"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("create after PROXY_HOSTS was made anew: %s (field %q, %s); want done", res.Outcome, res.Field, res.Reason)
	}
}
