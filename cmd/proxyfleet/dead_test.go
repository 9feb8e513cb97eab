package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"proxyfleet/client"
	"proxyfleet/fleet"
	"proxyfleet/sim"
)

// servedSim is `proxyfleet serve` on one sim host, in the test process.
type servedSim struct {
	url  string // the embedded server's
	dir  string // the sim host's directory
	logs *syncBuffer
}

// serveSim runs serve with its embedded server on a sim host h1 and args
// added, until the test ends; stop stops it sooner and waits.
func serveSim(t *testing.T, extraCfg string, args ...string) (s servedSim, stop func()) {
	t.Helper()
	dir := t.TempDir()
	return serveSimConfig(t, dir, simServeConfig(t, dir, "", extraCfg), args...)
}

// serveSimConfig is serveSim on the config file cfg, whose sim host h1
// keeps its state in dir/h1.
func serveSimConfig(t *testing.T, dir, cfg string, args ...string) (s servedSim, stop func()) {
	t.Helper()
	s = servedSim{dir: filepath.Join(dir, "h1"), logs: &syncBuffer{}}
	got := make(chan *server.Server, 1)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serveWith(ctx, append([]string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"),
			"--listen", freePort(t), "--http", freePort(t)}, args...), s.logs, s.logs, serveHooks{embedded: func(srv *server.Server) { got <- srv }})
	}()
	select {
	case srv := <-got:
		s.url = srv.ClientURL()
	case err := <-served:
		cancel()
		t.Fatalf("serve ended before its server ran: %v\n%s", err, s.logs.String())
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("serve: no embedded server within 30s\n%s", s.logs.String())
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("serve did not stop within 60s")
		}
	}
	t.Cleanup(stop)
	return s, stop
}

// TestDeadLettersListedAndReplayed: a create whose host keeps failing
// transiently runs out of attempts; `dead ls` shows its dead letter, and
// `dead replay` publishes it again as a new command, which (the fault
// gone) creates the proxy, and removes the dead letter. serve runs with
// --prefix, which every role and the verbs honour.
func TestDeadLettersListedAndReplayed(t *testing.T) {
	isolateNATSEnv(t)
	srv, _ := serveSim(t, "worker: {max_attempts: 2, backoff_initial: 10ms, backoff_max: 20ms, quarantine_failures: 100}\n", "--prefix", "pfx")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := func(args ...string) (string, string, int) {
		return runCLI(ctx, append(args, "--server", srv.url, "--prefix", "pfx")...)
	}
	if err := sim.InjectFault(srv.dir, sim.Fault{Op: "create", ID: "p1", Class: fleet.ClassTransient, Count: 2}); err != nil {
		t.Fatal(err)
	}
	o, e, code := cli("create", "p1", "--wait", "--command-id", "c1")
	if code != 1 || !strings.Contains(o, "gave up after 2 attempts") {
		t.Fatalf("create p1 with a failing host: exit %d, want 1 and a failure after 2 attempts\nstdout: %s\nstderr: %s\nlogs:\n%s", code, o, e, srv.logs.String())
	}

	o, e, code = cli("dead", "ls")
	if code != 0 || !strings.HasPrefix(o, "SEQ  ID  OP      COMMAND  ATTEMPTS  AT") || !strings.Contains(o, "  p1  create  c1       2         ") ||
		!strings.Contains(o, "injected fault") {
		t.Fatalf("dead ls: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	o, e, code = cli("dead", "ls", "--json")
	var dls []client.DeadEntry
	if code != 0 || json.Unmarshal([]byte(o), &dls) != nil || len(dls) != 1 || dls[0].ID != "p1" || dls[0].CommandID != "c1" || dls[0].Sequence == 0 {
		t.Fatalf("dead ls --json: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}

	// Usage: an ID or --all, not both, not neither.
	for _, args := range [][]string{{"dead", "replay"}, {"dead", "replay", "p1", "--all"}} {
		if _, e, code := cli(args...); code != 2 || !strings.HasPrefix(e, "usage: proxyfleet dead replay ID | --all [flags]") {
			t.Errorf("%v: exit %d, %q", args, code, e)
		}
	}
	if _, e, code := cli("dead", "replay", "p9"); code != 1 || e != "no dead letter of p9\n" {
		t.Errorf("dead replay of a proxy without one: exit %d, %q", code, e)
	}

	o, e, code = cli("dead", "replay", "p1", "--wait")
	if code != 0 || !strings.HasPrefix(o, "create p1: command ") || !strings.Contains(o, ": done\n") || strings.Contains(o, "command c1,") {
		t.Fatalf("dead replay p1 --wait: exit %d, want a new command, done\nstdout: %s\nstderr: %s\nlogs:\n%s", code, o, e, srv.logs.String())
	}
	o, e, code = cli("get", "p1")
	if code != 0 || !regexp.MustCompile(`(?m)^state: +running$`).MatchString(o) {
		t.Fatalf("get p1 after the replay: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	o, e, code = cli("dead", "ls", "--json")
	if code != 0 || strings.TrimSpace(o) != "[]" {
		t.Fatalf("dead ls after the replay: exit %d, want no dead letters\nstdout: %s\nstderr: %s", code, o, e)
	}
	if _, e, code := cli("dead", "replay", "--all"); code != 0 || e != "no dead letters\n" {
		t.Errorf("dead replay --all with none: exit %d, %q", code, e)
	}
}

// TestDeadReplaySkipsASupersededCommand: a dead create of a proxy that a
// later delete decided is not replayed unless --force.
func TestDeadReplaySkipsASupersededCommand(t *testing.T) {
	isolateNATSEnv(t)
	srv, _ := serveSim(t, "worker: {max_attempts: 1, quarantine_failures: 100}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := func(args ...string) (string, string, int) {
		return runCLI(ctx, append(args, "--server", srv.url)...)
	}
	if err := sim.InjectFault(srv.dir, sim.Fault{Op: "create", ID: "p2", Class: fleet.ClassTransient, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if o, e, code := cli("create", "p2", "--wait"); code != 1 {
		t.Fatalf("create p2 with a failing host: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	if o, e, code := cli("delete", "p2", "--wait"); code != 0 {
		t.Fatalf("delete p2: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	o, e, code := cli("dead", "replay", "--all")
	if code != 1 || o != "" || !strings.HasPrefix(e, "skipped: dead letter ") || !strings.Contains(e, "a later command (delete ") {
		t.Fatalf("dead replay --all of a superseded create: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	if o, e, code := cli("dead", "ls", "--json"); code != 0 || !strings.Contains(o, `"id": "p2"`) {
		t.Fatalf("dead ls: a skipped dead letter stays: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
	if o, e, code := cli("dead", "replay", "p2", "--force", "--wait"); code != 0 || !strings.Contains(o, ": done\n") {
		t.Fatalf("dead replay p2 --force: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
}
