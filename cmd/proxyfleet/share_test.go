package main

import (
	"cmp"
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
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker/hostshare"
)

// TestHostsSpreadOverWorkerProcesses runs three `proxyfleet worker`
// processes of the built binary over six sim hosts and reads, from the
// server's side, which worker owns each host (the client each host's work
// consumer is pinned to, named by the worker records): two each once the
// membership settles; three each for the two survivors within the pin TTL
// plus 5s of SIGKILLing one; two each again once it is back. Commands
// published all along end done, none creates twice, no calls for one id
// overlap.
func TestHostsSpreadOverWorkerProcesses(t *testing.T) {
	bin := buildBinary(t)
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	hosts := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	var hostYAML strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hostYAML, "  - {name: %s, driver: sim, sim: {dir: %q, delay: 30ms, boot_delay: 50ms}}\n", h, filepath.Join(dir, h))
	}
	const pinnedTTL = 2 * time.Second
	writeFile(t, cfg, fmt.Sprintf(`nats: {url: %q}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {ack_wait: 2s, pinned_ttl: %s, heartbeat: 250ms, liveness: 750ms, poll_interval: 50ms,
         backoff_initial: 50ms, backoff_max: 500ms, max_attempts: 30, drain_timeout: 2s}
`, srv.ClientURL(), hostYAML.String(), pinnedTTL))
	setupTopology(t, bin, cfg)

	ids := []string{"w0", "w1", "w2"}
	workers := map[string]*proc{}
	start := func(id string) {
		workers[id] = startProc(t, bin, filepath.Join(dir, id+".log"), "worker", "--config", cfg, "--id", id, "--debug")
	}
	_, js := srv.Connect(t)
	// waitShares waits until every host is owned, each of ids owning n,
	// and returns how long after since that was.
	waitShares := func(since time.Time, what string, n int, ids ...string) time.Duration {
		t.Helper()
		var last map[string]hostshare.Owner
		held := poll.WaitEvery(30*time.Second, 50*time.Millisecond, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var err error
			if last, err = hostshare.Owners(ctx, js, hosts); err != nil {
				return false
			}
			count := map[string]int{}
			for _, o := range last {
				if o.Worker == "" {
					return false
				}
				count[o.Worker]++
			}
			if len(last) != len(hosts) || len(count) != len(ids) {
				return false
			}
			for _, id := range ids {
				if count[id] != n {
					return false
				}
			}
			return true
		})
		took := time.Since(since)
		owners := map[string]string{}
		for h, o := range last {
			owners[h] = cmp.Or(o.Worker, "pinned to "+cmp.Or(o.Pin, "nobody"))
		}
		if !held {
			t.Fatalf("timed out after %s waiting for %s; owners: %v", took.Round(time.Millisecond), what, owners)
		}
		t.Logf("%s after %s: %v", what, took.Round(time.Millisecond), owners)
		return took
	}

	began := time.Now()
	for _, id := range ids {
		start(id)
	}
	settle := waitShares(began, "two hosts each", 2, ids...)

	// Commands all along: a create of a new proxy on each host in turn.
	var mu sync.Mutex
	done := map[string]string{} // command id → final outcome
	nc, _ := srv.Connect(t)
	sub, err := nc.Subscribe("proxy.result.>", func(m *nats.Msg) {
		var r messages.Result
		if json.Unmarshal(m.Data, &r) == nil && r.Outcome != messages.OutcomeAccepted {
			mu.Lock()
			done[r.CommandID] = r.Outcome
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var cmds []string
	var published atomic.Int64 // creates published: k000 on s1, k001 on s2, …
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(40 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			id, cmd := fmt.Sprintf("k%03d", i), fmt.Sprintf("ck%03d", i)
			m := nats.NewMsg("proxy.cmd.create." + id)
			m.Data = fmt.Appendf(nil, `{"v":1,"id":%q,"host":%q}`, id, hosts[i%len(hosts)])
			m.Header.Set(jetstream.MsgIDHeader, cmd)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.PublishMsg(ctx, m)
			cancel()
			if err != nil {
				t.Errorf("publish %s: %v", id, err)
				return
			}
			cmds = append(cmds, cmd)
			published.Add(1)
		}
	}()

	// Work in flight everywhere: a create has held its lock on every
	// host (sim.Busy), and one holds it now on a host of w0, which is
	// killed mid-command. The shares are settled: w0's hosts stay its own
	// until the kill.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	owners, err := hostshare.Owners(ctx, js, hosts)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	busySeen := map[string]bool{}
	waitUntil(t, "work in flight on every host, and now on one of w0's", 30*time.Second, func() bool {
		onW0 := false
		for i := range int(published.Load()) {
			h := hosts[i%len(hosts)]
			if busy, err := sim.Busy(filepath.Join(dir, h), fmt.Sprintf("k%03d", i)); err == nil && busy {
				busySeen[h] = true
				onW0 = onW0 || owners[h].Worker == "w0"
			}
		}
		return len(busySeen) == len(hosts) && onW0
	})
	killed := time.Now()
	workers["w0"].kill()
	takeover := waitShares(killed, "three hosts each after w0 was killed", 3, "w1", "w2")
	if bound := pinnedTTL + 5*time.Second; takeover > bound {
		t.Errorf("the killed worker's hosts were owned again %s after the kill, more than the pin TTL plus 5s (%s)", takeover.Round(time.Millisecond), bound)
	}
	returned := time.Now()
	start("w0")
	back := waitShares(returned, "two hosts each with w0 back", 2, ids...)
	close(quit)
	<-stopped

	waitUntil(t, "every command to be done", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cmds {
			if done[c] != messages.OutcomeDone {
				return false
			}
		}
		return true
	})
	if os.Getenv("PROXYFLEET_KEEP_LOGS") != "" {
		for _, id := range ids {
			b, _ := os.ReadFile(filepath.Join(dir, id+".log"))
			t.Logf("%s log:\n%s", id, b)
		}
	}
	t.Logf("figures: settled %s after the workers started; the killed worker's hosts owned again %s after the kill (pin TTL %s); two each again %s after it was started again; %d commands done",
		settle.Round(time.Millisecond), takeover.Round(time.Millisecond), pinnedTTL, back.Round(time.Millisecond), len(cmds))
	checkSimLogs(t, dir, hosts)
}
