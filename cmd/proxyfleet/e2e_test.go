package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"proxyfleet/config"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
)

// The end-to-end tests run the built binary's processes against a real
// embedded nats-server and the project's test host (make testhost): real
// libvirtd over real sshd, real guests.

// testhostConfig loads the config `make testhost` wrote.
func testhostConfig(t *testing.T) *config.Config {
	t.Helper()
	path := os.Getenv("PROXYFLEET_CONFIG")
	if path == "" {
		path = filepath.Join("..", "..", ".testhost", "proxyfleet.yaml")
	}
	c, err := config.Load(path)
	if err == nil {
		// The proxies' password, as the roles read it: tests that run a
		// provider or a prober in process need it.
		err = c.LoadSecrets(nil)
	}
	if err != nil {
		t.Fatalf("test host config: %v (run make testhost)", err)
	}
	// Without th1's address plan: rigs rename the entry and run side by
	// side on one network, where one plan under several entries would
	// give an address twice. A test that wants a plan gives its own
	// entry a block of its own (egressPlan).
	for i := range c.Hosts {
		c.Hosts[i].Addresses = nil
	}
	return c
}

// e2e is one run: a server, a config, processes, and a recorder of events.
type e2e struct {
	t    *testing.T
	bin  string
	srv  *natstest.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	dir  string
	cfg  *config.Config
	path string
	// healthHTTP is the --http address of the health process a rig
	// started (realGuestRig), for its /metrics.
	healthHTTP string

	mu      sync.Mutex
	procs   []*proc // every process start began
	events  map[string][]messages.StateEvent
	done    map[string]string          // command id -> final outcome
	results map[string]messages.Result // command id -> final result
}

func newE2E(t *testing.T, mod func(*config.Config)) *e2e {
	t.Helper()
	c := testhostConfig(t)
	srv := natstest.Start(t)
	c.NATS.URL = srv.ClientURL()
	c.Worker.AckWait = 5 * time.Second
	c.Worker.PinnedTTL = 2 * time.Second
	c.Worker.PollInterval = 500 * time.Millisecond
	c.Worker.BackoffInitial = 200 * time.Millisecond
	c.Worker.BackoffMax = 2 * time.Second
	c.Worker.ReadyTimeout = 2 * time.Minute
	c.Worker.DrainTimeout = 2 * time.Second
	c.Worker.ObserveInterval = 2 * time.Second
	if mod != nil {
		mod(c)
	}
	e := &e2e{t: t, srv: srv, dir: t.TempDir(), cfg: c,
		events: map[string][]messages.StateEvent{}, done: map[string]string{}, results: map[string]messages.Result{}}
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	e.path = filepath.Join(e.dir, "config.yaml")
	writeFile(t, e.path, string(b))
	e.nc, e.js = srv.Connect(t)
	// Set up as `proxyfleet setup` would, in process: the binary is
	// built only for the runs that start processes.
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := topologyOf(c).Setup(sctx, e.js); err != nil {
		t.Fatalf("setup: %v", err)
	}
	sub, err := e.nc.Subscribe("proxy.>", func(m *nats.Msg) {
		e.mu.Lock()
		defer e.mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, "proxy.state."):
			var ev messages.StateEvent
			if json.Unmarshal(m.Data, &ev) == nil {
				e.events[ev.ID] = append(e.events[ev.ID], ev)
			}
		case strings.HasPrefix(m.Subject, "proxy.result."):
			var r messages.Result
			if json.Unmarshal(m.Data, &r) == nil && r.Outcome != messages.OutcomeAccepted {
				e.done[r.CommandID] = r.Outcome
				e.results[r.CommandID] = r
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return e
}

// use makes e's helpers report to t, a subtest of the test that made e
// (a fleet its subtests share, one at a time), until t ends.
func (e *e2e) use(t *testing.T) *e2e {
	prev := e.t
	e.t = t
	t.Cleanup(func() { e.t = prev })
	return e
}

func (e *e2e) start(name string, env []string, args ...string) *proc {
	e.t.Helper()
	if e.bin == "" {
		e.bin = buildBinary(e.t) // only runs that start processes build it
	}
	return e.started(startProcEnv(e.t, e.bin, filepath.Join(e.dir, name+".log"), env, args...))
}

// started records p among the run's processes, for stopProcs.
func (e *e2e) started(p *proc) *proc {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.procs = append(e.procs, p)
	return p
}

// stopProcs kills every process the run started and waits for each to
// end.
func (e *e2e) stopProcs() {
	e.mu.Lock()
	ps := slices.Clone(e.procs)
	e.mu.Unlock()
	for _, p := range ps {
		p.kill()
	}
}

// startResolving starts a process like start, resolving host names by
// the hosts file hosts alone (bound over /etc/hosts in a mount namespace
// of its own, unshare(1)): names only the host network's DNS knows
// resolve alike for it and for the guests.
func (e *e2e) startResolving(name, hosts string, args ...string) *proc {
	e.t.Helper()
	if e.bin == "" {
		e.bin = buildBinary(e.t)
	}
	wrap := append([]string{"--mount", "--", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts, e.bin}, args...)
	return e.started(startProcEnv(e.t, "unshare", filepath.Join(e.dir, name+".log"), nil, wrap...))
}

func (e *e2e) worker(name string, env ...string) *proc {
	return e.start(name, env, "worker", "--config", e.path, "--debug")
}

// command publishes a create or delete and returns its command id.
func (e *e2e) command(op, id string) string {
	e.t.Helper()
	cmdID := fmt.Sprintf("%s-%s-%d", op, id, time.Now().UnixNano())
	m := nats.NewMsg(fmt.Sprintf("proxy.cmd.%s.%s", op, id))
	m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q}`, id))
	m.Header.Set(jetstream.MsgIDHeader, cmdID)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		e.t.Fatalf("publish %s %s: %v", op, id, err)
	}
	return cmdID
}

// result is the final result of a command, if it came.
func (e *e2e) result(cmdID string) (messages.Result, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.results[cmdID]
	return r, ok
}

func (e *e2e) outcome(cmdID string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.done[cmdID]
}

func (e *e2e) waitDone(bound time.Duration, cmdIDs ...string) {
	e.t.Helper()
	waitUntil(e.t, fmt.Sprintf("%d commands done", len(cmdIDs)), bound, func() bool {
		for _, c := range cmdIDs {
			switch e.outcome(c) {
			case messages.OutcomeDone:
			case "":
				return false
			default:
				e.t.Fatalf("command %s: %s", c, e.outcome(c))
			}
		}
		return true
	})
}

func (e *e2e) lastEvent(id string) messages.StateEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	evs := e.events[id]
	if len(evs) == 0 {
		return messages.StateEvent{}
	}
	return evs[len(evs)-1]
}

// virsh runs virsh on the test host's daemon.
func virsh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("virsh %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// hostObjects lists the domains and volumes of the test host that belong
// to proxy id.
func (e *e2e) hostObjects(id string) (domains, volumes []string) {
	for _, name := range strings.Fields(virsh(e.t, "list", "--all", "--name")) {
		if name == "pf-"+id {
			domains = append(domains, name)
		}
	}
	for _, line := range strings.Split(virsh(e.t, "vol-list", e.cfg.Hosts[0].Pool), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "pf-"+id+"-") {
			volumes = append(volumes, f[0])
		}
	}
	return domains, volumes
}

// cleanupProxies deletes what the test made on the host, whatever
// happened, once the run's processes have stopped: a worker still running
// would make a domain removed under it again (its re-drive), after the
// removal looked, and leave it on the host.
func (e *e2e) cleanupProxies(ids ...string) {
	e.t.Cleanup(func() {
		e.stopProcs()
		e.removeProxies(ids...)
	})
}

// cleanupProxiesLike is cleanupProxies for every proxy whose domain's
// name starts with "pf-"+prefix when the test ends (a pool's members).
func (e *e2e) cleanupProxiesLike(prefix string) {
	e.t.Cleanup(func() {
		e.stopProcs()
		var ids []string
		for _, d := range domainsLike(e.t, "pf-"+prefix) {
			ids = append(ids, strings.TrimPrefix(d, "pf-"))
		}
		e.removeProxies(ids...)
	})
}

// removeProxies deletes the domains and volumes of ids from the host.
func (e *e2e) removeProxies(ids ...string) {
	for _, id := range ids {
		name := "pf-" + id
		_ = exec.Command("virsh", "-c", "qemu:///system", "destroy", name).Run()
		_ = exec.Command("virsh", "-c", "qemu:///system", "undefine", name, "--nvram").Run()
		for _, v := range []string{name + "-disk.qcow2", name + "-seed.iso"} {
			_ = exec.Command("virsh", "-c", "qemu:///system", "vol-delete", v, "--pool", e.cfg.Hosts[0].Pool).Run()
		}
	}
}

// TestKilledMidCreateLeavesNoDuplicateAndNoOrphan SIGKILLs the worker that
// runs a create at a named point (volumes made, domain not defined; domain
// defined, not started); the other worker takes the host over and finishes
// it: one domain, its own two volumes and nothing else, running.
func TestKilledMidCreateLeavesNoDuplicateAndNoOrphan(t *testing.T) {
	for _, at := range []string{"after-overlay", "after-define"} {
		t.Run(at, func(t *testing.T) {
			rootIP := os.Getenv("TESTHOST_ROOT_IP")
			if rootIP == "" {
				rootIP = "198.18.0.1"
			}
			e := newE2E(t, func(c *config.Config) {
				c.Health = config.Health{HTTP: "127.0.0.1:0", ProbeListen: rootIP + ":0", Interval: time.Second,
					Timeout: 800 * time.Millisecond, Rise: 2, Fall: 2, Grace: 20 * time.Second, Concurrency: 8, LeaseTTL: 3 * time.Second}
			})
			id := "kill-" + strings.TrimPrefix(at, "after-")
			e.cleanupProxies(id)
			marker := filepath.Join(e.dir, "killed")
			env := []string{"PROXYFLEET_TEST_KILL_AT=" + at, "PROXYFLEET_TEST_KILL_ONCE=" + marker}
			w1 := e.worker("w1", env...)
			w2 := e.worker("w2", env...)
			e.start("health", nil, "health", "--config", e.path, "--http", freePort(t))
			waitUntil(t, "the topology", 30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err := e.js.Stream(ctx, messages.StreamWork)
				return err == nil
			})
			c := e.command(messages.OpCreate, id)
			e.waitDone(3*time.Minute, c)
			if _, err := os.Stat(marker); err != nil {
				t.Fatalf("no worker was killed at %s: the test proved nothing", at)
			}
			dead := 0
			for _, w := range []*proc{w1, w2} {
				if w.exited() {
					dead++
				}
			}
			if dead != 1 {
				t.Errorf("%d workers died, want 1", dead)
			}
			if ev := e.lastEvent(id); ev.State != messages.StateRunning || ev.IP == "" {
				t.Errorf("last event %+v, want running with an IP", ev)
			}
			rot := e.watchRotation()
			waitUntil(t, id+" in the rotation", time.Minute, func() bool { return rot.has(id) })
			doms, vols := e.hostObjects(id)
			if len(doms) != 1 || len(vols) != 2 {
				t.Errorf("on the host: domains %v, volumes %v; want one domain and its overlay and seed", doms, vols)
			}
			d := e.command(messages.OpDelete, id)
			e.waitDone(time.Minute, d)
			if doms, vols := e.hostObjects(id); len(doms)+len(vols) != 0 {
				t.Errorf("after delete: domains %v, volumes %v", doms, vols)
			}
		})
	}
}
