package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/sim"
)

// built is the package run's one build of the binary: every test that
// starts processes runs the same source with the same tags, so one build
// serves them all. TestMain removes its directory after the run.
var built struct {
	once sync.Once
	dir  string
	bin  string
	out  []byte
	err  error
}

// buildBinary returns proxyfleet built with the kill points
// (killpoints.go) that PROXYFLEET_TEST_KILL_AT switches on, building it
// on the package run's first call. Tests only execute it.
func buildBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "proxyfleet-test-bin-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "proxyfleet")
		built.out, built.err = exec.Command("go", "build", "-tags", "killpoints", "-o", built.bin, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// removeBuilt removes the package run's build, if there is one.
func removeBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

type proc struct {
	cmd  *exec.Cmd
	log  string
	exit chan struct{} // closed when the process has ended and been reaped
}

func startProc(t *testing.T, bin, logPath string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, bin, logPath, nil, args...)
}

// startProcEnv starts bin with extra environment variables; the process
// is SIGKILLed when the test ends.
func startProcEnv(t *testing.T, bin, logPath string, env []string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logPath, exit: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exit) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			logTail(t, logPath, 40)
		}
	})
	return p
}

// logTail logs the last n lines of the log at path, for a failed test's
// reader: the test's directory is removed when it ends.
func logTail(t *testing.T, path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s: %v", path, err)
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("the last %d lines of %s:\n%s", len(lines), filepath.Base(path), strings.Join(lines, "\n"))
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exit
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

// TestWorkersKilledMidCommand runs three worker processes of the built
// binary on sim hosts and SIGKILLs them, one at a time, while commands run.
// The others (and the restarted ones) finish the work: every proxy ends in
// the state of its last command, no command id creates twice, and no
// proxy's event seq ever goes back.
func TestWorkersKilledMidCommand(t *testing.T) {
	bin := buildBinary(t)
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	hosts := []string{"s1", "s2"}
	var hostYAML strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hostYAML, "  - {name: %s, driver: sim, sim: {dir: %q, delay: 100ms, boot_delay: 200ms}}\n", h, filepath.Join(dir, h))
	}
	writeFile(t, cfg, fmt.Sprintf(`nats: {url: %q}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {concurrency: 2, ack_wait: 2s, pinned_ttl: 2s, poll_interval: 50ms, backoff_initial: 50ms, backoff_max: 500ms, max_attempts: 30, drain_timeout: 2s}
`, srv.ClientURL(), hostYAML.String()))

	// concurrency 2 keeps work queued on each host's pool for the whole
	// kill loop: with the default of 20 every command of a round finished
	// between two kills, and no kill landed mid-command (CI, a107148).
	setupTopology(t, bin, cfg)
	workers := make([]*proc, 3)
	starts := make([]int, len(workers))
	logOf := func(i int) string { return filepath.Join(dir, fmt.Sprintf("worker%d.log", i)) }
	start := func(i int) {
		workers[i] = startProc(t, bin, logOf(i), "worker", "--config", cfg, "--debug")
		starts[i]++
	}
	// up waits until worker i's last start has got as far as pulling (its
	// log says "worker started" once per start: the logs are appended).
	// A kill of a worker still starting lands in no command: on a slow
	// machine (CI, fresh, -race) a worker restarted every 1.2s never got
	// that far, and no kill of the loop landed mid-command.
	up := func(i int) {
		waitUntil(t, fmt.Sprintf("worker %d started (start %d)", i, starts[i]), 60*time.Second, func() bool {
			b, _ := os.ReadFile(logOf(i))
			return strings.Count(string(b), `"worker started"`) >= starts[i]
		})
	}
	for i := range workers {
		start(i)
	}

	nc, js := srv.Connect(t)
	// Every event of a proxy must carry a higher seq than the one before.
	var mu sync.Mutex
	lastSeq := map[string]uint64{}
	var backwards []string
	done := map[string]string{} // command id -> final outcome
	sub, err := nc.Subscribe("proxy.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, "proxy.state."):
			var ev messages.StateEvent
			if json.Unmarshal(m.Data, &ev) != nil {
				return
			}
			if ev.Seq <= lastSeq[ev.ID] {
				backwards = append(backwards, fmt.Sprintf("%s: seq %d after %d", ev.ID, ev.Seq, lastSeq[ev.ID]))
			}
			lastSeq[ev.ID] = ev.Seq
		case strings.HasPrefix(m.Subject, "proxy.result."):
			var r messages.Result
			if json.Unmarshal(m.Data, &r) == nil && r.Outcome != messages.OutcomeAccepted {
				done[r.CommandID] = r.Outcome
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// Wait for the topology, which the workers create.
	waitUntil(t, "the topology", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.Stream(ctx, messages.StreamWork)
		return err == nil
	})

	const proxies = 40
	last := map[string]string{} // id -> last command id
	lastOp := map[string]string{}
	publish := func(op, id string, n int) {
		cmdID := fmt.Sprintf("%s-%s-%d", op, id, n)
		m := nats.NewMsg(fmt.Sprintf("proxy.cmd.%s.%s", op, id))
		m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q}`, id))
		m.Header.Set(jetstream.MsgIDHeader, cmdID)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish: %v", err)
		}
		last[id], lastOp[id] = cmdID, op
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range proxies {
		publish(messages.OpCreate, fmt.Sprintf("k%02d", i), 0)
	}
	// inFlight reports whether a command's call holds its proxy's lock on
	// a sim host now (sim.Busy).
	inFlight := func() bool {
		for _, h := range hosts {
			for n := range proxies {
				if busy, err := sim.Busy(filepath.Join(dir, h), fmt.Sprintf("k%02d", n)); err == nil && busy {
					return true
				}
			}
		}
		return false
	}
	// Kill a worker at a time, restarting it at once, while commands are
	// in flight and deletes and re-creates arrive.
	for round := range 10 {
		i := round % len(workers) // each worker is killed, the pinned ones among them
		up(i)
		waitUntil(t, fmt.Sprintf("a command in flight on the hosts (round %d)", round), 60*time.Second, inFlight)
		workers[i].kill()
		start(i)
		for range 4 {
			id := fmt.Sprintf("k%02d", rng.IntN(proxies))
			op := messages.OpDelete
			if lastOp[id] == messages.OpDelete {
				op = messages.OpCreate
			}
			publish(op, id, round+1)
		}
	}
	waitUntil(t, "every last command to be done", 120*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range last {
			if done[c] != messages.OutcomeDone {
				return false
			}
		}
		return true
	})
	// Final states, from the hosts themselves.
	for id, op := range lastOp {
		n := 0
		for _, h := range hosts {
			if _, err := os.Stat(filepath.Join(dir, h, "domains", id+".json")); err == nil {
				n++
			}
		}
		if want := map[string]int{messages.OpCreate: 1, messages.OpDelete: 0}[op]; n != want {
			t.Errorf("%s: %d domains after %s, want %d", id, n, op, want)
		}
	}
	checkSimLogs(t, dir, hosts)
	mu.Lock()
	defer mu.Unlock()
	// Work a killed worker held is redelivered to the next owner, which
	// logs it: proof the kills landed in the middle of commands.
	redelivered := 0
	for i := range workers {
		b, _ := os.ReadFile(logOf(i))
		redelivered += strings.Count(string(b), "work redelivered")
	}
	t.Logf("%d work items redelivered after kills", redelivered)
	if redelivered == 0 {
		t.Error("no kill landed in the middle of a command; the test proved nothing")
	}
	for _, b := range backwards {
		t.Error("event seq went back:", b)
	}
}

// setupTopology runs `proxyfleet setup`: workers and health processes do
// not create streams or buckets.
func setupTopology(t *testing.T, bin, cfg string) {
	t.Helper()
	out, err := exec.Command(bin, "setup", "--config", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("proxyfleet setup: %v\n%s", err, out)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func waitUntil(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, what, bound, cond)
}
