package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

func runSetup(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, "setup", args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// `proxyfleet setup` creates everything, then has nothing to do, then
// updates what the config changed, naming each setting old → new; a
// setting JetStream cannot change in place makes it exit non-zero, naming it.
func TestSetupVerb(t *testing.T) {
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	conf := func(extra string) {
		writeFile(t, cfg, fmt.Sprintf("nats: {url: %q%s}\nhosts:\n  - {name: h1, driver: sim, sim: {dir: %q}}\n", srv.ClientURL(), extra, dir))
	}
	conf("")
	out, _, err := runSetup(t, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"created stream PROXY_CMDS", "created stream PROXY_EVENTS", "created bucket PROXY_LEASES"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("first setup printed %q, want a line %q", out, want)
		}
	}
	if out, _, err = runSetup(t, "--config", cfg); err != nil || out != "every stream and bucket is as configured\n" {
		t.Fatalf("second setup: %q, %v", out, err)
	}
	conf(", results_max_age: 2h, command_id_max_age: 48h")
	if out, _, err = runSetup(t, "--config", cfg); err != nil ||
		out != "updated stream PROXY_RESULTS: max_age 24h0m0s → 2h0m0s\nupdated bucket PROXY_CMDIDS: ttl 168h0m0s → 48h0m0s\n" {
		t.Fatalf("setup after a change: %q, %v", out, err)
	}

	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, messages.StreamDead); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: messages.StreamDead, Subjects: []string{"proxy.dead.>"}, Storage: jetstream.MemoryStorage, MaxAge: 30 * 24 * time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runSetup(t, "--config", cfg)
	var re *topology.RefusedError
	if !errors.As(err, &re) || re.Refused[0].Field != "storage" || !strings.Contains(err.Error(), "storage Memory → File") {
		t.Fatalf("setup over a memory PROXY_DEAD: %v (stderr %q), want a refusal naming storage", err, stderr)
	}
}

// `setup --repair` is a daemon (a unit, a Deployment): what it creates goes
// into its JSON log, a line per change, and nothing to stdout, so that the
// journal holds JSON only (deploy/systemd_boot_test.go reads it there).
func TestSetupRepairLogsChanges(t *testing.T) {
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf("nats: {url: %q}\nhosts:\n  - {name: h1, driver: sim, sim: {dir: %q}}\n", srv.ClientURL(), dir))
	var out, errOut syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "setup", []string{"--config", cfg, "--repair", "--log-format", "json"}, &out, &errOut)
	}()
	ok := poll.Wait(30*time.Second, func() bool { return strings.Contains(errOut.String(), `"msg":"repairing`) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("setup --repair: %v\n%s", err, errOut.String())
	}
	if !ok {
		t.Fatalf("setup --repair never started repairing:\n%s", errOut.String())
	}
	if out.String() != "" {
		t.Errorf("setup --repair printed %q to stdout, want nothing (its log has it)", out.String())
	}
	changes := 0
	for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("setup --repair logged a line that is not JSON: %q", l)
		}
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, "set-up: created ") {
			changes++
		}
	}
	if changes == 0 {
		t.Errorf("no set-up: created ... in the log:\n%s", errOut.String())
	}
}

// `serve` sets up its embedded server and repairs it: a deleted stream and
// a deleted consumer come back, and commands published after are done.
func TestServeRepairsItsTopology(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf(`nats: {repair_interval: 100ms}
hosts:
  - {name: h1, driver: sim, sim: {dir: %q}}
images:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {check_interval: 100ms, poll_interval: 20ms, backoff_initial: 20ms, backoff_max: 200ms}
health: {lease_ttl: 2s}
`, dir))
	listen := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	var logs syncBuffer
	go func() {
		served <- run(ctx, "serve", []string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", listen, "--http", freePort(t)}, &logs, &logs)
	}()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	nc, err := nats.Connect("nats://"+listen, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	done := map[string]bool{}
	var mu sync.Mutex
	sub, err := nc.Subscribe("proxy.result.>", func(m *nats.Msg) {
		var r messages.Result
		if json.Unmarshal(m.Data, &r) == nil && r.Outcome == messages.OutcomeDone {
			mu.Lock()
			done[r.CommandID] = true
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	create := func(id string) {
		t.Helper()
		waitUntil(t, "create "+id+" published", 30*time.Second, func() bool {
			m := nats.NewMsg("proxy.cmd.create." + id)
			m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q}`, id))
			m.Header.Set(jetstream.MsgIDHeader, "c-"+id)
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			defer pcancel()
			_, err := js.PublishMsg(pctx, m, jetstream.WithExpectStream(messages.StreamCommands))
			return err == nil
		})
		waitUntil(t, "create "+id+" done", 30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return done["c-"+id]
		})
	}
	create("p1")
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	if err := js.DeleteConsumer(dctx, messages.StreamCommands, topology.IntakeConsumer); err != nil {
		t.Fatal(err)
	}
	create("p2")
	if err := js.DeleteStream(dctx, messages.StreamCommands); err != nil {
		t.Fatal(err)
	}
	create("p3")
	if !strings.Contains(logs.String(), "stream PROXY_CMDS was deleted: recreated it") {
		t.Errorf("no repair in the log:\n%s", logs.String())
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// `proxyfleet health` creates no stream: started before set-up, it says
// what is missing at error level and starts once set-up has run.
func TestHealthWaitsForSetup(t *testing.T) {
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf("nats: {url: %q}\nhosts:\n  - {name: h1, driver: sim, sim: {dir: %q}}\nworker: {check_interval: 50ms}\n", srv.ClientURL(), dir))
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuffer
	ran := make(chan error, 1)
	go func() { ran <- run(ctx, "health", []string{"--config", cfg, "--http", freePort(t)}, &logs, &logs) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("health: %v", err)
		}
	}()
	waitUntil(t, "an error-level log of the missing stream", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), `"level":"ERROR","msg":"stream PROXY_EVENTS is missing`)
	})
	_, js := srv.Connect(t)
	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer lcancel()
	names := js.StreamNames(lctx)
	for n := range names.Name() {
		t.Errorf("health created stream %s", n)
	}
	if _, _, err := runSetup(t, "--config", cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "health to start", 20*time.Second, func() bool { return strings.Contains(logs.String(), `health started`) })
}
