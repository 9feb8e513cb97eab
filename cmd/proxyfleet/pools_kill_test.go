package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// TestPoolControllerKilled runs the built binary's processes on sim hosts:
// a worker, a health process and two pool controllers. A pool of 20 is set
// with `proxyfleet pool set --wait`; while it grows to 40 the active
// controller is SIGKILLed: the standby takes over and finishes, and no
// member is created twice (every member's creates carry one command id,
// and each host made each domain once). The rotation, sampled every
// 100 ms, never holds fewer of the pool than it did once full. Deleted,
// the pool leaves nothing: no member desired, no domain, no record.
func TestPoolControllerKilled(t *testing.T) {
	bin := buildBinary(t)
	// Killed after it stored the new members and before it published
	// their creates; and after it published them, before it recorded so
	// (the standby must publish the same members again, not make others,
	// or the published ones would run outside the pool).
	for _, at := range []string{"pool-after-intent", "pool-after-publish"} {
		t.Run(at, func(t *testing.T) { poolControllerKilled(t, bin, at) })
	}
}

func poolControllerKilled(t *testing.T, bin, at string) {
	srv := natstest.Start(t)
	dir := t.TempDir()
	hosts := []string{"s1", "s2", "s3"}
	var hostYAML strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hostYAML, "  - {name: %s, driver: sim, sim: {dir: %q, delay: 20ms, boot_delay: 100ms}}\n", h, filepath.Join(dir, h))
	}
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf(`nats: {url: %q}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {ack_wait: 2s, pinned_ttl: 2s, poll_interval: 50ms, backoff_initial: 50ms, backoff_max: 500ms, observe_interval: 500ms, check_interval: 200ms}
health: {lease_ttl: 2s}
pools: {interval: 200ms, lease_ttl: 2s, backoff_initial: 500ms, backoff_max: 2s}
`, srv.ClientURL(), hostYAML.String()))
	setupTopology(t, bin, cfg)
	startProc(t, bin, filepath.Join(dir, "worker.log"), "worker", "--config", cfg)
	startProc(t, bin, filepath.Join(dir, "health.log"), "health", "--config", cfg, "--http", freePort(t))
	type ctl struct {
		p    *proc
		http string
	}
	// The controllers SIGKILL themselves at the kill point after a pass
	// stored new members and before it published their creates, once the
	// marker is gone: not for the first 20, for the growth to 40.
	marker := filepath.Join(dir, "killed")
	writeFile(t, marker, "not yet\n")
	env := []string{"PROXYFLEET_TEST_KILL_AT=" + at, "PROXYFLEET_TEST_KILL_ONCE=" + marker}
	ctls := make([]ctl, 2)
	for i := range ctls {
		ctls[i].http = freePort(t)
		ctls[i].p = startProcEnv(t, bin, filepath.Join(dir, fmt.Sprintf("pools%d.log", i)), env,
			"pools", "--config", cfg, "--http", ctls[i].http, "--id", fmt.Sprintf("c%d", i))
	}

	nc, _ := srv.Connect(t)
	creates := recordCreates(t, nc)
	rot, err := rotation.Follow(ctxFor(t, 30*time.Second), nc, rotation.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer rot.Close()
	smp := sampleRotation(t, rot)
	cl, err := client.New(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 3*time.Minute)
	waitUntil(t, "both controllers ready", 30*time.Second, func() bool {
		return status(ctls[0].http, "/readyz") == 200 && status(ctls[1].http, "/readyz") == 200
	})

	if o, e, code := runCLI(ctx, "pool", "set", "eu", "--size", "20", "--label", "team=a", "--wait", "--server", srv.ClientURL()); code != 0 {
		t.Fatalf("pool set eu --size 20 --wait: exit %d\n%s\n%s", code, o, e)
	}
	// The pool is full once the controller's rotation holds its 20; this
	// test's follower of the same feed may apply the last changes later.
	waitUntil(t, "this test's rotation to hold the 20 of eu", 30*time.Second, func() bool { return poolCounts(rot)["eu"] >= 20 })
	full := time.Now()
	waitPool(t, cl, "eu", 20)
	o, _, code := runCLI(ctx, "pool", "ls", "--server", srv.ClientURL())
	if code != 0 || !strings.Contains(o, "eu    20    20     0") || !strings.Contains(o, "ready") {
		t.Errorf("pool ls: exit %d\n%s", code, o)
	}

	// Grow to 40: the active controller stores 20 new members and dies at
	// the kill point; the standby takes the lease over and publishes them.
	active := -1
	for i, c := range ctls {
		if value(scrape(t, c.http), "proxyfleet_pool_active") == 1 {
			active = i
		}
	}
	if active < 0 {
		t.Fatal("no controller says it is active")
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if o, e, code := runCLI(ctx, "pool", "set", "eu", "--size", "40", "--label", "team=a", "--server", srv.ClientURL()); code != 0 {
		t.Fatalf("pool set eu --size 40: exit %d\n%s\n%s", code, o, e)
	}
	waitUntil(t, "the active controller dead at its kill point", 30*time.Second, func() bool { return ctls[active].p.exited() })
	killedAt, out := time.Now(), len(creates.ids("eu"))
	want := map[string]int{"pool-after-intent": 20, "pool-after-publish": 40}[at]
	if _, err := os.Stat(marker); err != nil || out != want {
		t.Fatalf("the active controller died with %d members' creates out (want %d) and marker %v", out, want, err)
	}
	standby := ctls[1-active]
	waitUntil(t, "the standby active", 20*time.Second, func() bool { return value(scrape(t, standby.http), "proxyfleet_pool_active") == 1 })
	t.Logf("controller c%d killed at %s; c%d active %s later", active, at, 1-active, time.Since(killedAt).Round(time.Millisecond))
	waitPool(t, cl, "eu", 40)
	if twice := creates.twice(); len(twice) > 0 {
		t.Errorf("members created under two command ids: %v", twice)
	}
	if n := len(creates.ids("eu")); n != 40 {
		t.Errorf("creates of %d members, want 40", n)
	}
	for _, h := range hosts {
		for line := range strings.Lines(readFile(filepath.Join(dir, h, "creates.log"))) {
			id, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			for _, h2 := range hosts {
				if n := strings.Count(readFile(filepath.Join(dir, h2, "creates.log")), id+" "); h2 != h && n > 0 || h2 == h && n != 1 {
					t.Errorf("%s made %d times on %s", id, n, h2)
				}
			}
		}
	}
	least, when := smp.fewest("eu", full)
	if least < 20 {
		t.Errorf("the rotation held %d members of eu at %s, fewer than the 20 it had", least, when.Format(time.TimeOnly))
	}
	o, _, code = runCLI(ctx, "pool", "get", "eu", "--server", srv.ClientURL())
	if code != 0 || !strings.Contains(o, "members:        40 ready, 0 creating, 0 recycling, 0 retiring") {
		t.Errorf("pool get eu: exit %d\n%s", code, o)
	}

	if o, e, code := runCLI(ctx, "pool", "rm", "eu", "--wait", "--server", srv.ClientURL()); code != 0 {
		t.Fatalf("pool rm eu --wait: exit %d\n%s\n%s", code, o, e)
	}
	if _, err := cl.Pool(ctx, "eu"); err == nil {
		t.Error("pool eu still has a record")
	}
	waitUntil(t, "every domain gone", 30*time.Second, func() bool {
		for _, h := range hosts {
			if ds, _ := filepath.Glob(filepath.Join(dir, h, "domains", "*.json")); len(ds) > 0 {
				return false
			}
		}
		return true
	})
	sts, err := cl.List(ctx, client.IncludeDeleted())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.State() != messages.StateDeleted {
			t.Errorf("%s is %s after the pool's delete", st.ID, st.State())
		}
	}
	if len(sts) != 40 {
		t.Errorf("%d proxies listed, want the 40 members, deleted", len(sts))
	}
}

// waitPool waits until pool name is ready with n members in the rotation.
func waitPool(t *testing.T, cl *client.Client, name string, n int) {
	t.Helper()
	var st client.PoolStatus
	waitUntil(t, fmt.Sprintf("pool %s ready with %d", name, n), time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		st, err = cl.Pool(ctx, name)
		return err == nil && st.Record.State == messages.PoolReady && st.Summary.Ready == n && st.Summary.Live == n
	})
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createLog records every create command published (a core subscriber
// sees each publish, duplicates too), by proxy id: its command ids.
type createLog struct {
	mu sync.Mutex
	by map[string][]string
}

func recordCreates(t *testing.T, nc *nats.Conn) *createLog {
	t.Helper()
	l := &createLog{by: map[string][]string{}}
	sub, err := nc.Subscribe("proxy.cmd.create.*", func(m *nats.Msg) {
		id := strings.TrimPrefix(m.Subject, "proxy.cmd.create.")
		l.mu.Lock()
		l.by[id] = append(l.by[id], m.Header.Get(jetstream.MsgIDHeader))
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// ids returns the ids of pool name's members that had a create.
func (l *createLog) ids(name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id := range l.by {
		if strings.HasPrefix(id, name+"-") {
			out = append(out, id)
		}
	}
	return out
}

// twice lists the ids whose creates carried more than one command id.
func (l *createLog) twice() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, cmds := range l.by {
		for _, c := range cmds[1:] {
			if c != cmds[0] {
				out = append(out, fmt.Sprintf("%s: %s and %s", id, cmds[0], c))
				break
			}
		}
	}
	return out
}

// rotationSamples records, every 100 ms, the members of each pool the
// rotation holds (by the id's prefix before its last '-').
type rotationSamples struct {
	mu      sync.Mutex
	samples []struct {
		at    time.Time
		count map[string]int
	}
}

// poolCounts is how many members of each pool rot holds (by the id's
// prefix before its last '-').
func poolCounts(rot *rotation.Rotation) map[string]int {
	count := map[string]int{}
	for _, p := range rot.Proxies() {
		if i := strings.LastIndexByte(p.ID, '-'); i > 0 {
			count[p.ID[:i]]++
		}
	}
	return count
}

func sampleRotation(t *testing.T, rot *rotation.Rotation) *rotationSamples {
	s := &rotationSamples{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			count := poolCounts(rot)
			s.mu.Lock()
			s.samples = append(s.samples, struct {
				at    time.Time
				count map[string]int
			}{time.Now(), count})
			s.mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return s
}

// fewest is the fewest members of pool name in a sample taken after
// since, and when.
func (s *rotationSamples) fewest(name string, since time.Time) (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	least, at := -1, time.Time{}
	for _, smp := range s.samples {
		if smp.at.After(since) && (least < 0 || smp.count[name] < least) {
			least, at = smp.count[name], smp.at
		}
	}
	return least, at
}
