package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/config"
	"proxyfleet/messages"
)

// poolWatch follows PROXY_ROTATION change by change and counts, after
// each, the members of one pool in it: the fewest seen once the pool was
// full is exact, not sampled.
type poolWatch struct {
	mu     sync.Mutex
	in     map[string]bool
	full   bool
	fewest int
	at     time.Time
}

func (e *e2e) watchPool(name string, size int) *poolWatch {
	t := e.t
	p := &poolWatch{in: map[string]bool{}, fewest: -1}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kv, err := e.js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for entry := range w.Updates() {
			if entry == nil || !strings.HasPrefix(entry.Key(), name+"-") {
				continue
			}
			p.mu.Lock()
			if entry.Operation() == jetstream.KeyValuePut {
				p.in[entry.Key()] = true
			} else {
				delete(p.in, entry.Key())
			}
			if len(p.in) >= size {
				p.full = true
			}
			if p.full && (p.fewest < 0 || len(p.in) < p.fewest) {
				p.fewest, p.at = len(p.in), time.Now()
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = w.Stop(); cancel(); <-done })
	return p
}

func (p *poolWatch) least() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fewest, p.at
}

// TestPoolRecycledOnRealGuests keeps a pool of 2 test guests on the test
// host, recycles it once (`proxyfleet pool recycle --all --wait`), and
// follows the rotation change by change: it never lacks a member of the
// pool (it never holds fewer than 2, min_ready), the new members proxy,
// and every old member's domain and volumes are gone after. Deleted, the
// pool leaves nothing on the host. The host has an address plan: the new
// members take addresses none of the old ones had (reuse_after).
func TestPoolRecycledOnRealGuests(t *testing.T) {
	root := rootIP()
	e := newE2E(t, func(c *config.Config) {
		c.Hosts[0].Addresses = egressPlan(t, 1)
		c.Health = config.Health{HTTP: "127.0.0.1:0", ProbeListen: root + ":0", Interval: time.Second,
			Timeout: 800 * time.Millisecond, Rise: 2, Fall: 3, Grace: 20 * time.Second, Concurrency: 8, LeaseTTL: 3 * time.Second}
		c.Pools = config.Pools{Interval: 500 * time.Millisecond, LeaseTTL: 3 * time.Second, BackoffInitial: 2 * time.Second, BackoffMax: 10 * time.Second}
	})
	// Whatever happens, nothing of the pool stays on the host.
	t.Cleanup(func() {
		var ids []string
		for _, d := range domainsLike(t, "pf-rg-") {
			ids = append(ids, strings.TrimPrefix(d, "pf-"))
		}
		e.removeProxies(ids...)
	})
	e.worker("w1")
	e.start("health", nil, "health", "--config", e.path, "--http", freePort(t))
	e.start("pools", nil, "pools", "--config", e.path, "--http", freePort(t))
	watch := e.watchPool("rg", 2)
	targetURL, token := target(t, root)
	cl, err := client.New(e.nc, "")
	if err != nil {
		t.Fatal(err)
	}
	url := e.srv.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	if o, errs, code := runCLI(ctx, "pool", "set", "rg", "--size", "2", "--surge", "2", "--wait", "--server", url); code != 0 {
		t.Fatalf("pool set rg --size 2 --wait: exit %d\n%s\n%s", code, o, errs)
	}
	st, err := cl.Pool(ctx, "rg")
	if err != nil || st.Summary.Ready != 2 {
		t.Fatalf("pool rg: %+v %v", st.Summary, err)
	}
	var old []string
	oldEgress := map[string]string{} // address -> member
	for _, m := range st.Record.Members {
		old = append(old, m.ID)
		for _, a := range e.lastEvent(m.ID).Egress {
			oldEgress[a] = m.ID
		}
		if doms, vols := e.hostObjects(m.ID); len(doms) != 1 || len(vols) != 2 {
			t.Errorf("%s on the host: domains %v, volumes %v", m.ID, doms, vols)
		}
	}
	began := time.Now()
	if o, errs, code := runCLI(ctx, "pool", "recycle", "rg", "--all", "--wait", "--server", url); code != 0 {
		t.Fatalf("pool recycle rg --all --wait: exit %d\n%s\n%s", code, o, errs)
	}
	t.Logf("recycled 2 test guests in %s", time.Since(began).Round(time.Second))
	for _, id := range old {
		if doms, vols := e.hostObjects(id); len(doms)+len(vols) != 0 {
			t.Errorf("old member %s: domains %v, volumes %v left on the host", id, doms, vols)
		}
	}
	st, err = cl.Pool(ctx, "rg")
	if err != nil || st.Summary.Live != 2 {
		t.Fatalf("pool rg after the recycle: %+v %v", st.Summary, err)
	}
	rot, err := cl.Rotation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(oldEgress) != 4 {
		t.Errorf("the old members' egress %v: want 2 addresses each (an IPv4 one, a /124)", oldEgress)
	}
	for _, m := range st.Record.Members {
		for _, id := range old {
			if m.ID == id {
				t.Errorf("%s is still a member after its recycle", id)
			}
		}
		for _, a := range e.lastEvent(m.ID).Egress {
			if was, ok := oldEgress[a]; ok {
				t.Errorf("new member %s got %s, old member %s's within reuse_after", m.ID, a, was)
			}
		}
		for _, p := range rot.Proxies {
			if p.ID == m.ID {
				if got, err := e.through(p.Addr, targetURL); err != nil || got != token {
					t.Errorf("through the new member %s (%s): %q, %v", p.ID, p.Addr, got, err)
				}
			}
		}
	}
	least, at := watch.least()
	t.Logf("the rotation held at least %d members of rg (at %s) from the moment it was full", least, at.Format(time.TimeOnly))
	if least < 1 {
		t.Errorf("the rotation had no member of rg at %s", at.Format(time.TimeOnly))
	} else if least < 2 {
		t.Errorf("the rotation held %d member of rg at %s, fewer than min_ready 2", least, at.Format(time.TimeOnly))
	}

	if o, errs, code := runCLI(ctx, "pool", "rm", "rg", "--wait", "--server", url); code != 0 {
		t.Fatalf("pool rm rg --wait: exit %d\n%s\n%s", code, o, errs)
	}
	for _, m := range st.Record.Members {
		if doms, vols := e.hostObjects(m.ID); len(doms)+len(vols) != 0 {
			t.Errorf("member %s: domains %v, volumes %v left after the pool's delete", m.ID, doms, vols)
		}
	}
}
