package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/sim"
)

// simServeConfig writes a config of one sim host h1 in dir, with extra
// YAML appended.
func simServeConfig(t *testing.T, dir, simOpts, extra string) string {
	t.Helper()
	return simServeConfigHost(t, dir, simOpts, "", extra)
}

// simServeConfigHost is simServeConfig with more keys of host h1
// (hostOpts, each starting with ", ").
func simServeConfigHost(t *testing.T, dir, simOpts, hostOpts, extra string) string {
	t.Helper()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf(`hosts:
  - {name: h1, driver: sim, sim: {dir: %q%s}%s}
images:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
%s`, filepath.Join(dir, "h1"), simOpts, hostOpts, extra))
	return cfg
}

// A component that fails ends serve with its error: here the embedded
// server's JetStream goes off (as nats-server does itself when it cannot
// write its store), without which no role can work. The other components
// stop, as on a signal, and serve returns the failure, which main turns
// into a non-zero exit.
func TestServeEndsWhenAComponentFails(t *testing.T) {
	dir := t.TempDir()
	cfg := simServeConfig(t, dir, "", "worker: {check_interval: 100ms}\nhealth: {lease_ttl: 2s}\n")
	got := make(chan *server.Server, 1)
	var logs syncBuffer
	served := make(chan error, 1)
	go func() {
		served <- serveWith(context.Background(), []string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"),
			"--listen", freePort(t), "--http", freePort(t)}, &logs, &logs, serveHooks{embedded: func(s *server.Server) { got <- s }})
	}()
	var s *server.Server
	select {
	case s = <-got:
	case err := <-served:
		t.Fatalf("serve ended before its server ran: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("no embedded server within 30s")
	}
	waitUntil(t, "the worker and health to start", 30*time.Second, func() bool {
		l := logs.String()
		return strings.Contains(l, `"msg":"worker started"`) && strings.Contains(l, `"msg":"health started`)
	})

	if err := s.ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var err error
	select {
	case err = <-served:
	case <-time.After(30 * time.Second):
		t.Fatalf("serve still running 30s after its JetStream went off\n%s", logs.String())
	}
	t.Logf("serve returned %s after its JetStream went off", time.Since(killed).Round(time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "nats-server") || !strings.Contains(err.Error(), "JetStream") {
		t.Fatalf("serve = %v, want the nats-server component's failure naming JetStream", err)
	}
	for _, want := range []string{
		`"level":"ERROR","msg":"nats-server failed: stopping the other components"`,
		`"msg":"worker stopped"`, `"msg":"health stopped"`, `"msg":"repairer stopped"`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %s in the log:\n%s", want, logs.String())
		}
	}
}

// A SIGTERM drains: here the worker waits for a create that takes a
// minute. A second SIGTERM ends the process at once, non-zero.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfg := simServeConfig(t, dir, ", delay: 1m", "worker: {drain_timeout: 1m}\n")
	listen := freePort(t)
	p := startProc(t, bin, filepath.Join(dir, "serve.log"), "serve", "--config", cfg, "--data-dir", filepath.Join(dir, "data"),
		"--listen", listen, "--http", freePort(t))
	logHas := func(s string) bool {
		b, _ := os.ReadFile(p.log)
		return strings.Contains(string(b), s)
	}
	waitUntil(t, "the worker to start", 30*time.Second, func() bool { return logHas(`"msg":"worker started"`) })

	nc, err := nats.Connect("nats://" + listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	m := nats.NewMsg(messages.NewSubjects("").Create("p1"))
	m.Data = []byte(`{"v":1,"id":"p1"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	// The sim host takes its lock of p1 when the create starts.
	waitUntil(t, "the create to be in flight", 30*time.Second, func() bool {
		busy, err := sim.Busy(filepath.Join(dir, "h1"), "p1")
		return err == nil && busy
	})

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the worker to drain", 30*time.Second, func() bool { return logHas(`"msg":"draining worker"`) })
	if p.exited() {
		t.Fatal("the process ended before the drain was over")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	second := time.Now()
	select {
	case <-p.exit:
	case <-time.After(15 * time.Second):
		t.Fatal("still running 15s after a second SIGTERM (the drain would take a minute)")
	}
	t.Logf("exited %s after the second SIGTERM", time.Since(second).Round(time.Millisecond))
	if code := p.cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status %d after a second SIGTERM, want %d", code, 128+int(syscall.SIGTERM))
	}
	if !logHas("exiting at once") {
		b, _ := os.ReadFile(p.log)
		t.Errorf("the process did not say why it exited:\n%s", b)
	}
}

// A component that returns by itself, even without an error, ends the
// others: a process never runs on without one of its parts.
func TestRunAllStopsTheOthersWhenOneEnds(t *testing.T) {
	var logs syncBuffer
	others := make(chan struct{})
	err := runAll(context.Background(), newLogger(&logs, slog.LevelInfo),
		component{"quitter", func(context.Context) error { return nil }},
		component{"other", func(ctx context.Context) error {
			<-ctx.Done()
			close(others)
			return nil
		}})
	if !errors.Is(err, errStoppedByItself) || !strings.HasPrefix(err.Error(), "quitter: ") {
		t.Fatalf("runAll = %v, want quitter's %v", err, errStoppedByItself)
	}
	select {
	case <-others:
	default:
		t.Fatal("runAll returned before the other component stopped")
	}
	if !strings.Contains(logs.String(), `"msg":"quitter failed: stopping the other components"`) {
		t.Errorf("no error-level log of the failure:\n%s", logs.String())
	}
}

// A lifecycle closes what it opened last first: a role's providers
// before its connection, the connections before serve's embedded server.
func TestLifecycleClosesLastOpenedFirst(t *testing.T) {
	var logs syncBuffer
	lc := &lifecycle{log: newLogger(&logs, slog.LevelInfo)}
	var order []string
	for _, name := range []string{"server", "connection", "providers"} {
		lc.onClose(func() { order = append(order, name) })
	}
	failed := errors.New("failed")
	lc.add(component{"quitter", func(context.Context) error { return failed }},
		component{"other", func(ctx context.Context) error { <-ctx.Done(); return nil }})
	if err := lc.run(context.Background()); !errors.Is(err, failed) {
		t.Errorf("run = %v, want %v", err, failed)
	}
	lc.close()
	lc.close() // closes once
	if got := strings.Join(order, " "); got != "providers connection server" {
		t.Errorf("closed %q, want providers connection server", got)
	}
}
