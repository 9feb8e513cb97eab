package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"encoding/xml"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"proxyfleet/config"
	"proxyfleet/fleet"
	"proxyfleet/internal/runtest"
	"proxyfleet/kvm"
	"proxyfleet/messages"
	"proxyfleet/worker"
)

// The kvm fault campaign: faults of the test host met by the real
// worker, run in this process (so goleak sees every goroutine it and its
// kvm providers start), on an embedded nats-server, against the project's
// test host (make testhost). Each case asserts that nothing is lost (every
// command ends as it should), nothing leaks (goroutines; domains and
// volumes of the test's ids), the fleet class, and a reason naming the
// cause, and logs how long the recovery took.

// kvmFault is one case's run: an e2e recorder with a worker in-process.
type kvmFault struct {
	*e2e
	mu      sync.Mutex
	retries []worker.RetryInfo
}

// newKVMFault starts a run on the test host; mod adjusts the config. The
// goroutines of the run must all have ended when the test's clean-ups are
// done.
func newKVMFault(t *testing.T, mod func(*config.Config)) *kvmFault {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // first registered, so it runs last
	return &kvmFault{e2e: newE2E(t, mod)}
}

// startWorker runs a worker in this process with the kvm providers of the
// run's config, until the test ends. Its log goes to worker.log in the
// run's directory, and is printed if the test failed.
func (f *kvmFault) startWorker() {
	t := f.t
	t.Helper()
	logPath := filepath.Join(f.dir, "worker.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	log := newLogger(lf, slog.LevelDebug)
	provs, err := providers(f.cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	wc := workerConfig(f.cfg, provs, log)
	wc.OnRetry = func(ri worker.RetryInfo) {
		f.mu.Lock()
		f.retries = append(f.retries, ri)
		f.mu.Unlock()
	}
	nc, js := f.srv.Connect(t)
	w, err := worker.New(js, wc)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the worker stops (drains) before its
	// providers close.
	t.Cleanup(func() {
		for _, p := range provs {
			if err := p.Close(); err != nil {
				t.Errorf("close provider: %v", err)
			}
		}
		nc.Close()
		t.Logf("worker stats: %v", w.Stats().Snapshot())
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("worker log (tail):\n%s", b)
		}
	})
	runtest.Start(t, w.Run, w.Started(), 30*time.Second)
}

func (f *kvmFault) retried() []worker.RetryInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]worker.RetryInfo(nil), f.retries...)
}

// awaitResult waits for a command's final result.
func (f *kvmFault) awaitResult(bound time.Duration, cmdID string) messages.Result {
	f.t.Helper()
	var r messages.Result
	waitUntil(f.t, "the result of "+cmdID, bound, func() bool {
		var ok bool
		r, ok = f.result(cmdID)
		return ok
	})
	return r
}

// testhostState is the directory `make testhost` keeps its state in (the
// config, logs, keys).
func testhostState() string {
	if p := os.Getenv("PROXYFLEET_CONFIG"); p != "" {
		return filepath.Dir(p)
	}
	d, _ := filepath.Abs(filepath.Join("..", "..", ".testhost"))
	if r, err := filepath.EvalSymlinks(d); err == nil {
		return r
	}
	return d
}

func testhostNetns() string {
	if ns := os.Getenv("TESTHOST_NETNS"); ns != "" {
		return ns
	}
	return "pftest"
}

// libvirtdPid is the test host's libvirtd, from the pid file its -d writes;
// 0 if it is not running.
func libvirtdPid() int {
	b, err := os.ReadFile("/run/libvirtd.pid")
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !procAlive(pid, "libvirtd") {
		return 0
	}
	return pid
}

// procAlive: pid exists, is not a zombie (nothing may reap an orphaned
// daemon here) and is named name; lib.sh's pid_alive.
func procAlive(pid int, name string) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != name {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndex(s, ") ")
	return i >= 0 && !strings.HasPrefix(s[i+2:], "Z")
}

func libvirtUp() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "virsh", "-c", "qemu:///system", "version").Run() == nil
}

// killLibvirtd SIGKILLs the test host's libvirtd and waits until it is gone.
// The test's end starts it again if it is down, whatever happened.
func killLibvirtd(t *testing.T) {
	t.Helper()
	pid := libvirtdPid()
	if pid == 0 {
		t.Fatal("no libvirtd running (see /run/libvirtd.pid): is the test host up?")
	}
	t.Cleanup(func() {
		if libvirtdPid() == 0 || !libvirtUp() {
			t.Log("libvirtd down at the end of the test: starting it")
			startLibvirtd(t)
		}
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill libvirtd %d: %v", pid, err)
	}
	waitUntil(t, "libvirtd to die", 10*time.Second, func() bool { return !procAlive(pid, "libvirtd") })
}

// startLibvirtd starts libvirtd in the test host's namespace the way
// deploy/testhost/up.sh does:
//
//	rm -f /etc/libvirt/qemu/networks/autostart/default.xml
//	ip netns exec $NS env LIBVIRT_LOG_OUTPUTS="3:file:$STATE/logs/libvirtd.log" libvirtd -d 9>&-
//
// and waits, as up.sh does, until it answers on qemu:///system. up.sh
// closes its lock's descriptor for the daemon; here every descriptor above
// stderr is made close-on-exec first, so the daemon cannot inherit the
// test host lock (flock) that the test runs under.
func startLibvirtd(t *testing.T) {
	t.Helper()
	_ = os.Remove("/etc/libvirt/qemu/networks/autostart/default.xml")
	closeOnExec(t)
	out, err := os.Create(filepath.Join(t.TempDir(), "libvirtd-start.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("ip", "netns", "exec", testhostNetns(), "env",
		"LIBVIRT_LOG_OUTPUTS=3:file:"+filepath.Join(testhostState(), "logs", "libvirtd.log"), "libvirtd", "-d")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		t.Fatalf("start libvirtd: %v\n%s", err, b)
	}
	waitUntil(t, "libvirtd to answer on qemu:///system", 30*time.Second, libvirtUp)
}

// closeOnExec marks every open descriptor above stderr close-on-exec.
func closeOnExec(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// domainsLike lists the test host's domains whose name starts with prefix.
func domainsLike(t *testing.T, prefix string) []string {
	var out []string
	for _, name := range strings.Fields(virsh(t, "list", "--all", "--name")) {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

// provider is a kvm provider of the run's first host entry, for reading
// back what is on the host.
func (f *kvmFault) provider() *kvm.Provider {
	f.t.Helper()
	opts, err := kvmOptions(f.cfg, f.cfg.Hosts[0], slog.New(slog.DiscardHandler))
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := kvm.New(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { p.Close() })
	return p
}

// Case a: libvirtd is SIGKILLed while ten proxies are being created, and
// started again. All ten end running (done), one domain each, made for its
// command; then all ten are deleted at once and nothing of theirs is left
// on the host.
func TestFault_libvirtdKilledDuringCreates(t *testing.T) {
	f := newKVMFault(t, func(c *config.Config) {
		c.Worker.MaxAttempts = 40 // the outage must not exhaust them
		c.Worker.ReadyTimeout = 4 * time.Minute
	})
	const n = 10
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("flv-%02d", i)
	}
	f.removeProxies(ids...) // a run killed before its clean-up
	f.cleanupProxies(ids...)
	f.startWorker()
	waitUntil(t, "the topology", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := f.js.Stream(ctx, messages.StreamWork)
		return err == nil
	})

	start := time.Now()
	creates := map[string]string{}
	for _, id := range ids {
		creates[id] = f.command(messages.OpCreate, id)
	}
	// Kill libvirtd once the first domain is defined: the other creates
	// are then mid-way (volumes, uploads, defines, starts).
	waitUntil(t, "a first domain defined", 2*time.Minute, func() bool {
		m, _ := filepath.Glob("/etc/libvirt/qemu/pf-flv-*.xml")
		return len(m) > 0
	})
	killLibvirtd(t)
	killed := time.Now()
	t.Logf("libvirtd killed %s after the creates were published", killed.Sub(start).Round(time.Millisecond))
	// Down until the worker has met the outage (a retry), then up again.
	waitUntil(t, "a retry while libvirtd is down", time.Minute, func() bool { return len(f.retried()) > 0 })
	startLibvirtd(t)
	restarted := time.Now()
	t.Logf("libvirtd down for %s; answering again", restarted.Sub(killed).Round(time.Millisecond))

	var cmds []string
	for _, id := range ids {
		cmds = append(cmds, creates[id])
	}
	// Recovery, in two figures: every create has defined its domain again
	// (the control plane), and every guest runs with an address (which
	// the guests' boots, under TCG on two cores, dominate).
	var defined, firstDone time.Duration
	waitUntil(t, "every create done", 6*time.Minute, func() bool {
		if m, _ := filepath.Glob("/etc/libvirt/qemu/pf-flv-*.xml"); len(m) == n && defined == 0 {
			defined = time.Since(restarted)
		}
		done := 0
		for _, c := range cmds {
			if r, ok := f.result(c); ok {
				if r.Outcome != messages.OutcomeDone {
					t.Fatalf("create %s: %s (%s, %s)", r.ID, r.Outcome, r.Class, r.Reason)
				}
				done++
			}
		}
		if done > 0 && firstDone == 0 {
			firstDone = time.Since(restarted)
		}
		return done == len(cmds)
	})
	allDone := time.Since(restarted)
	t.Logf("recovery: all %d domains defined %s after the restart; first create done %s after it, all done %s after it (%s after the kill)",
		n, defined.Round(time.Millisecond), firstDone.Round(time.Millisecond), allDone.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	// Every retry was transient, and the outage's name the host's link
	// (a dead link, or a dial that libvirtd's socket refused).
	retries := f.retried()
	deadLink, namesLink := 0, 0
	reasons := map[string]bool{}
	for _, ri := range retries {
		if fleet.ClassOf(ri.Err) != fleet.ClassTransient {
			t.Errorf("retry of %s with a %q error: %v", ri.ID, fleet.ClassOf(ri.Err), ri.Err)
		}
		if errors.Is(ri.Err, kvm.ErrLinkDead) {
			deadLink++
		}
		if strings.Contains(ri.Err.Error(), "th1 ("+f.cfg.Hosts[0].SSH.Address+")") {
			namesLink++
		}
		reasons[shortReason(ri.Err)] = true
	}
	t.Logf("%d retries (%d on a dead link, %d naming the link); reasons: %v", len(retries), deadLink, namesLink, keys(reasons))
	if namesLink == 0 {
		t.Errorf("no retry names the link to th1: %v", keys(reasons))
	}

	// One domain each, made for its command, running; nothing else of ours.
	p := f.provider()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ips := map[string]string{}
	for _, id := range ids {
		in, err := p.Get(ctx, id)
		if err != nil || in.State != messages.StateRunning || in.CommandID != creates[id] {
			t.Errorf("%s on the host: %+v %v; want running, made for %s", id, in, err, creates[id])
		}
		if other, dup := ips[in.IP]; dup && in.IP != "" {
			t.Errorf("%s and %s share the address %s", id, other, in.IP)
		}
		ips[in.IP] = id
		if ev := f.lastEvent(id); ev.State != messages.StateRunning || ev.IP != in.IP {
			t.Errorf("%s: last event %+v, want running at %s", id, ev, in.IP)
		}
		if doms, vols := f.hostObjects(id); len(doms) != 1 || len(vols) != 2 {
			t.Errorf("%s on the host: domains %v, volumes %v; want one domain, its overlay and seed", id, doms, vols)
		}
	}
	if doms := domainsLike(t, "pf-flv-"); len(doms) != n {
		t.Errorf("domains pf-flv-*: %v, want exactly %d", doms, n)
	}

	// All ten deleted at once: every delete done, nothing of theirs left.
	delStart := time.Now()
	var dels []string
	for _, id := range ids {
		dels = append(dels, f.command(messages.OpDelete, id))
	}
	f.waitDone(3*time.Minute, dels...)
	t.Logf("ten deletes at once: done in %s", time.Since(delStart).Round(time.Millisecond))
	for _, id := range ids {
		if ev := f.lastEvent(id); ev.State != messages.StateDeleted {
			t.Errorf("%s: last event %+v, want deleted", id, ev)
		}
		if doms, vols := f.hostObjects(id); len(doms)+len(vols) != 0 {
			t.Errorf("%s after delete: domains %v, volumes %v", id, doms, vols)
		}
	}
}

// shortReason is an error's message with ids, numbers and addresses
// blanked, to group retries by cause in the log.
func shortReason(err error) string {
	s := err.Error()
	s = regexp.MustCompile(`flv-\d+|[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)*(ms|s|µs)?`).ReplaceAllString(s, "#")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// hostEntry is the test host's entry under another name, tuned by mod.
func hostEntry(c *config.Config, name string, mod func(*config.Host)) {
	h := c.Hosts[0]
	h.Name = name
	if mod != nil {
		mod(&h)
	}
	c.Hosts = []config.Host{h}
}

// Cases c and d: a host whose key changed, and a host that refuses our
// login. Each create fails at once, permanent, with no retry spent (also
// for the creates that meet the link inside its redial backoff), with a
// reason naming the host and the cause, and nothing is made.
func TestFault_sshRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		entry func(t *testing.T, h *config.Host)
		want  []string
	}{
		{"host key changed", func(t *testing.T, h *config.Host) {
			// known_hosts holds another key for the host's address.
			kh := filepath.Join(t.TempDir(), "known_hosts")
			writeFile(t, kh, knownHostsLine(t, h.SSH.Address)+"\n")
			h.SSH.KnownHosts = kh
		}, []string{"th-rekeyed", "198.18.0.2:22", "host key refused", "does not match"}},
		{"login refused", func(t *testing.T, h *config.Host) {
			h.SSH.KeyFile = newClientKey(t)
		}, []string{"th-stranger", "198.18.0.2:22", "refused login as root", "was not accepted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.want[0]
			f := newKVMFault(t, func(c *config.Config) {
				hostEntry(c, name, func(h *config.Host) { tc.entry(t, h) })
			})
			ids := []string{name + "-a", name + "-b", name + "-c"}
			f.cleanupProxies(ids...)
			f.startWorker()
			// One after another, each published as the one before fails:
			// the later ones meet the link inside its redial backoff.
			for _, id := range ids {
				start := time.Now()
				r := f.awaitResult(time.Minute, f.command(messages.OpCreate, id))
				t.Logf("%s: %s after %s: %s", id, r.Outcome, time.Since(start).Round(time.Millisecond), r.Reason)
				if r.Outcome != messages.OutcomeFailed || r.Class != string(fleet.ClassPermanent) {
					t.Errorf("%s: %s (class %q), want failed, permanent", id, r.Outcome, r.Class)
				}
				for _, w := range tc.want {
					if !strings.Contains(r.Reason, w) {
						t.Errorf("%s: reason %q does not say %q", id, r.Reason, w)
					}
				}
				if strings.Contains(r.Reason, "gave up") {
					t.Errorf("%s: dead-lettered after retries: %s", id, r.Reason)
				}
				if ev := f.lastEvent(id); ev.State != messages.StateFailed || ev.Class != string(fleet.ClassPermanent) {
					t.Errorf("%s: last event %+v, want failed, permanent", id, ev)
				}
				if doms, vols := f.hostObjects(id); len(doms)+len(vols) != 0 {
					t.Errorf("%s: made on the host: domains %v, volumes %v", id, doms, vols)
				}
			}
			if r := f.retried(); len(r) != 0 {
				t.Errorf("%d retries spent on a refused host, want none: first %v", len(r), r[0].Err)
			}
		})
	}
}

// knownHostsLine is a known_hosts line for address with a fresh key: not
// the host's.
func knownHostsLine(t *testing.T, address string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return knownhosts.Line([]string{knownhosts.Normalize(address)}, key)
}

// newClientKey writes a fresh client key the host has never seen.
func newClientKey(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stranger_ed25519")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Case b: a storage pool that fills up. The pool of a host entry of its
// own is a directory on a 32 MiB tmpfs; the first proxy fits (and brings
// the base image into the pool), then a volume that is not ours takes the
// space but less than one proxy's volumes need, and the next create fails
// for lack of space: failed (at once, or dead-lettered after its attempts)
// with a reason that says so, nothing of it left behind, the proxy that
// fits unharmed. The test removes the pool and the tmpfs at its end,
// whatever happened.
func TestFault_poolFull(t *testing.T) {
	pool := "pftest-full"
	dir := fullPool(t, pool, "32m")
	t.Logf("pool %s on a 32 MiB tmpfs at %s", pool, dir)
	f := newKVMFault(t, func(c *config.Config) {
		hostEntry(c, "th-full", func(h *config.Host) { h.Pool = pool })
		c.Worker.MaxAttempts = 3
	})
	f.cleanupProxies("fp-0", "fp-1")
	f.startWorker()

	start := time.Now()
	f.waitDone(3*time.Minute, f.command(messages.OpCreate, "fp-0"))
	fits := f.lastEvent("fp-0")
	if fits.State != messages.StateRunning || fits.IP == "" {
		t.Fatalf("fp-0: last event %+v, want running", fits)
	}
	t.Logf("fp-0 running at %s after %s (base image uploaded into the pool)", fits.IP, time.Since(start).Round(time.Millisecond))

	need := volBytes(t, pool, "pf-fp-0-disk.qcow2", "Allocation") + volBytes(t, pool, "pf-fp-0-seed.iso", "Capacity")
	avail := poolBytes(t, pool, "Available")
	filler := avail - need/2
	virsh(t, "vol-create-as", pool, "filler.raw", strconv.FormatInt(filler, 10), "--allocation", strconv.FormatInt(filler, 10), "--format", "raw")
	t.Logf("one proxy needs %d bytes; %d were free; a filler took %d, leaving %d", need, avail, filler, poolBytes(t, pool, "Available"))

	start = time.Now()
	r := f.awaitResult(3*time.Minute, f.command(messages.OpCreate, "fp-1"))
	took := time.Since(start)
	t.Logf("fp-1: %s (%s) after %s and %d retries: %s", r.Outcome, r.Class, took.Round(time.Millisecond), len(f.retried()), r.Reason)
	if r.Outcome != messages.OutcomeFailed {
		t.Fatalf("fp-1 on a full pool: %s, want failed", r.Outcome)
	}
	if !strings.Contains(r.Reason, "No space left on device") || !strings.Contains(r.Reason, "fp-1") {
		t.Errorf("fp-1's reason %q does not say it ran out of space", r.Reason)
	}
	if ev := f.lastEvent("fp-1"); ev.State != messages.StateFailed {
		t.Errorf("fp-1: last event %+v, want failed", ev)
	}
	if doms, vols := f.hostObjects("fp-1"); len(doms)+len(vols) != 0 {
		t.Errorf("fp-1 left on the host: domains %v, volumes %v", doms, vols)
	}

	// The proxy that fit is unharmed: running at the same address, and
	// nothing was said of it since.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, err := f.provider().Get(ctx, "fp-0")
	if err != nil || in.State != messages.StateRunning || in.IP != fits.IP {
		t.Errorf("fp-0 after the pool filled up: %+v %v, want running at %s", in, err, fits.IP)
	}
	if ev := f.lastEvent("fp-0"); !reflect.DeepEqual(ev, fits) {
		t.Errorf("fp-0: an event since it ran: %+v", ev)
	}
	if doms, vols := f.hostObjects("fp-0"); len(doms) != 1 || len(vols) != 2 {
		t.Errorf("fp-0 on the host: domains %v, volumes %v; want its domain, overlay and seed", doms, vols)
	}
	if !strings.Contains(virsh(t, "vol-list", pool), "filler.raw") {
		t.Error("the filler volume, not ours, is gone")
	}
}

// fullPool makes a transient dir pool named pool on a tmpfs of size, and
// removes both when the test ends (after its proxies' clean-up, which the
// test registers later). The tmpfs is mounted in libvirtd's own mount
// namespace: `ip netns exec` gave libvirtd one, and the root mount here is
// private, so a mount made in ours would never reach it.
func fullPool(t *testing.T, pool, size string) string {
	t.Helper()
	pid := libvirtdPid()
	if pid == 0 {
		t.Fatal("no libvirtd running (see /run/libvirtd.pid): is the test host up?")
	}
	inLibvirtd := func(args ...string) error {
		out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(pid), "-m", "--"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %v: %s", args, err, out)
		}
		return nil
	}
	removeStalePool(t, pool, "/var/lib/proxyfleet-testhost/fault-pool-", inLibvirtd)
	if err := os.MkdirAll("/var/lib/proxyfleet-testhost", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/lib/proxyfleet-testhost", "fault-pool-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	if err := inLibvirtd("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "pf-fault-pool", dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inLibvirtd("umount", dir); err != nil {
			t.Errorf("unmount the pool's tmpfs: %v", err)
		}
	})
	virsh(t, "pool-create-as", pool, "dir", "--target", dir)
	t.Cleanup(func() {
		if out, err := exec.Command("virsh", "-c", "qemu:///system", "pool-destroy", pool).CombinedOutput(); err != nil {
			t.Errorf("destroy pool %s: %v: %s", pool, err, out)
		}
	})
	return dir
}

// removeStalePool takes away a pool of a test's own name that a run
// stopped mid-test left behind (a killed `go test` runs no clean-up, and
// libvirtd keeps a transient pool while it runs, across its own restarts):
// the pool, then a tmpfs under it (inLibvirtd unmounts, when not nil) and
// its directory when that is under dirPrefix. Without this the next run
// fails at once with "pool 'pftest-full' already exists". The names are
// the tests' own, so nothing else is touched.
func removeStalePool(t *testing.T, pool, dirPrefix string, inLibvirtd func(args ...string) error) {
	t.Helper()
	out, err := exec.Command("virsh", "-c", "qemu:///system", "pool-dumpxml", pool).Output()
	if err != nil {
		return // no such pool: the usual case
	}
	var def struct {
		Target struct {
			Path string `xml:"path"`
		} `xml:"target"`
	}
	if err := xml.Unmarshal(out, &def); err != nil {
		t.Fatalf("read the leftover pool %s: %v", pool, err)
	}
	t.Logf("pool %s left by an earlier run at %s: removing it first", pool, def.Target.Path)
	virsh(t, "pool-destroy", pool)
	if dir := def.Target.Path; strings.HasPrefix(dir, dirPrefix) {
		if inLibvirtd != nil {
			_ = inLibvirtd("umount", dir) // gone already if libvirtd restarted since
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove the leftover pool's directory %s: %v", dir, err)
		}
	}
}

// poolBytes reads a size (Capacity, Allocation, Available) of a pool.
func poolBytes(t *testing.T, pool, field string) int64 {
	t.Helper()
	return infoBytes(t, virsh(t, "pool-info", "--bytes", pool), field)
}

// volBytes reads a size (Capacity, Allocation) of a volume.
func volBytes(t *testing.T, pool, vol, field string) int64 {
	t.Helper()
	return infoBytes(t, virsh(t, "vol-info", "--bytes", "--pool", pool, vol), field)
}

func infoBytes(t *testing.T, info, field string) int64 {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != field {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " bytes"), 10, 64)
		if err != nil {
			t.Fatalf("%s in %q: %v", field, line, err)
		}
		return n
	}
	t.Fatalf("no %s in:\n%s", field, info)
	return 0
}

// flushNeighbours empties the test host's neighbour table. This libvirt's
// ARP source errors ("wrong nlmsg len") only while the table fits in one
// netlink read: the stale entries guests of earlier tests leave (IPv6 ones
// above all) make it answer cleanly with whatever that read held.
func flushNeighbours(t *testing.T) {
	t.Helper()
	ns := testhostNetns()
	if out, err := exec.Command("ip", "-n", ns, "neigh", "flush", "all").CombinedOutput(); err != nil {
		t.Fatalf("flush the neighbour table of %s: %v\n%s", ns, err, out)
	}
}
