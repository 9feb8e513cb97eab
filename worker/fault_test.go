package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// The fault campaign's cases that need no test host: each
// asserts nothing lost (every command ends in its outcome), nothing leaked
// (goleak in TestMain; one domain and one volume per proxy, no duplicate
// create), and, for refusals, the right class and a named field.

// storedResults reads every result kept in PROXY_RESULTS, by command id.
// Unlike the rig's live subscription it misses nothing published while the
// test's connection was away. It returns what it read before an error (the
// stream may be missing; callers poll).
func (r *rig) storedResults() map[string][]messages.Result {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string][]messages.Result{}
	cons, err := r.js.OrderedConsumer(ctx, messages.StreamResults, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return out
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return out
	}
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return out
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var res messages.Result
			if err := json.Unmarshal(m.Data(), &res); err != nil {
				r.t.Fatalf("result %q: %v", m.Data(), err)
			}
			out[res.CommandID] = append(out[res.CommandID], res)
		}
		if n == 0 {
			break
		}
		left -= uint64(n)
	}
	return out
}

// fenceCut is what a worker's fence logs when it abandons the work in
// flight, cut off from NATS.
const fenceCut = "cut off from NATS: abandoning in-flight work, which JetStream will deliver again"

func hasOutcome(rs []messages.Result, outcome string) bool {
	for _, r := range rs {
		if r.Outcome == outcome {
			return true
		}
	}
	return false
}

// TestNATSRestartWithCommandsInFlight stops nats-server while 200 creates
// are being carried out on three sim hosts by two workers, and starts it
// again on the same store: every command ends done, every proxy has one
// domain and one volume, none was created twice.
func TestNATSRestartWithCommandsInFlight(t *testing.T) {
	const n = 200
	hosts := []string{"h1", "h2", "h3"}
	r := newRig(t, hosts...)
	// Each worker's fence says when the outage has cut its work off.
	var cuts [2]chan struct{}
	for i := range cuts {
		cut := make(chan struct{})
		cuts[i] = cut
		var once sync.Once
		r.startWorker(func(c *worker.Config) {
			c.Logger = slog.New(onMessage{fenceCut, func() { once.Do(func() { close(cut) }) }})
			c.MaxAttempts = 8
			for h := range c.Providers {
				p, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: 20 * time.Millisecond, BootDelay: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				c.Providers[h] = p
			}
		})
	}
	for i := range n {
		r.create(fmt.Sprintf("p%d", i), fmt.Sprintf("c%d", i), "")
	}
	// Stop in the middle: some done, most not.
	r.waitFor("the first creates to finish", 30*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		done := 0
		for _, res := range r.results {
			if res.Outcome == messages.OutcomeDone {
				done++
			}
		}
		return done >= 10
	})
	stopped := time.Now()
	r.srv.Stop()
	// The outage lasts until every worker has seen it: down past its
	// fence's limit (a quarter of AckWait), its work in flight is cut off,
	// and its calls and publishes fail meanwhile.
	r.waitFor("every worker's fence to cut its work off", 30*time.Second, func() bool {
		for _, cut := range cuts {
			select {
			case <-cut:
			default:
				return false
			}
		}
		return true
	})
	r.srv.Start(t)
	restarted := time.Now()
	t.Logf("nats-server down for %s", restarted.Sub(stopped).Round(time.Millisecond))

	var results map[string][]messages.Result
	r.waitFor("every command done after the restart", 120*time.Second, func() bool {
		results = r.storedResults()
		for i := range n {
			if !hasOutcome(results[fmt.Sprintf("c%d", i)], messages.OutcomeDone) {
				return false
			}
		}
		return true
	})
	t.Logf("all %d commands done %s after the restart", n, time.Since(restarted).Round(time.Millisecond))
	for id, rs := range results {
		if hasOutcome(rs, messages.OutcomeFailed) || hasOutcome(rs, messages.OutcomeRejected) {
			t.Errorf("command %s: %+v", id, rs)
		}
	}
	creates := map[string]int{}
	domains, volumes := 0, 0
	for _, h := range hosts {
		lines := readLines(filepath.Join(r.hostDir(h), "creates.log"))
		for i := 0; i+1 < len(lines); i += 2 {
			creates[lines[i]]++
		}
		ds, _ := filepath.Glob(filepath.Join(r.hostDir(h), "domains", "*.json"))
		vs, _ := filepath.Glob(filepath.Join(r.hostDir(h), "volumes", "*.disk"))
		domains += len(ds)
		volumes += len(vs)
		if b, err := os.ReadFile(filepath.Join(r.hostDir(h), "overlaps.log")); err == nil {
			t.Errorf("%s: two calls for one id overlapped (id, op, pid):\n%s", h, b)
		}
	}
	for id, c := range creates {
		if c != 1 {
			t.Errorf("%s created %d times", id, c)
		}
	}
	if len(creates) != n || domains != n || volumes != n {
		t.Errorf("%d proxies created, %d domains, %d volumes; want %d of each", len(creates), domains, volumes, n)
	}
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		if ev, _ := r.lastEvent(id); ev.State != messages.StateRunning || ev.CommandID != fmt.Sprintf("c%d", i) {
			t.Errorf("%s: last event %+v, want running", id, ev)
		}
	}
}

// TestThousandMalformedAmongValidCommands mixes 1,000 bad commands (every
// kind, in random order, some aimed at proxies that run) with 100 valid
// creates: each bad one is answered rejected once, naming its field, and
// changes no state; every valid one ends done.
func TestThousandMalformedAmongValidCommands(t *testing.T) {
	const bad, good = 1000, 100
	r := newRig(t, "h1", "h2")
	r.startWorker()
	r.startWorker()
	r.create("live", "live-1", "")
	r.waitOutcome("live-1", messages.OutcomeDone)
	before, _ := r.lastEvent("live")

	rng := rand.New(rand.NewPCG(7, 11))
	kinds := badCommands("live")
	want := map[string]badCase{}
	type cmd struct{ subject, body, id string }
	var cmds []cmd
	for i := range bad {
		c := kinds[rng.IntN(len(kinds))]
		id := fmt.Sprintf("bad-%d", i)
		want[id] = c
		cmds = append(cmds, cmd{c.subject, c.body, id})
	}
	for i := range good {
		id := fmt.Sprintf("g%d", i)
		cmds = append(cmds, cmd{subj.Create(id), fmt.Sprintf(`{"v":1,"id":%q}`, id), "good-" + id})
	}
	rng.Shuffle(len(cmds), func(i, j int) { cmds[i], cmds[j] = cmds[j], cmds[i] })
	start := time.Now()
	for _, c := range cmds {
		r.publish(c.subject, []byte(c.body), c.id)
	}

	var results map[string][]messages.Result
	r.waitFor("every command answered", 60*time.Second, func() bool {
		results = r.storedResults()
		for id := range want {
			if len(results[id]) == 0 {
				return false
			}
		}
		for i := range good {
			if !hasOutcome(results[fmt.Sprintf("good-g%d", i)], messages.OutcomeDone) {
				return false
			}
		}
		return true
	})
	t.Logf("%d bad and %d valid commands settled in %s", bad, good, time.Since(start).Round(time.Millisecond))
	for id, c := range want {
		rs := results[id]
		if len(rs) != 1 || rs[0].Outcome != messages.OutcomeRejected || rs[0].Field != c.field || rs[0].Class != "permanent" || rs[0].Reason == "" {
			t.Errorf("%s (%s): %+v, want one rejection naming %q", id, c.name, rs, c.field)
		}
	}
	if after, _ := r.lastEvent("live"); after.Seq != before.Seq {
		t.Errorf("bad commands changed the running proxy: %+v, then %+v", before, after)
	}
	for _, id := range []string{"other", "Live_1"} {
		if ev, ok := r.lastEvent(id); ok {
			t.Errorf("a bad command made state for %s: %+v", id, ev)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := r.js.Consumer(ctx, messages.StreamCommands, topology.IntakeConsumer)
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor("intake to settle", 10*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
	})
}
