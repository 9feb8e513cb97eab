package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Shape of the fleet section: proxies over sim hosts, each call and boot
// delayed as on a small real host.
const (
	fleetProxies   = 2000
	fleetHosts     = 20
	fleetCallDelay = 20 * time.Millisecond
	fleetBootDelay = 200 * time.Millisecond
)

// runFleet measures, b.runs times on a fresh server each, how long 2,000
// creates published at once take to be in the rotation, with one
// `proxyfleet worker` and one `proxyfleet health` process over 20 sim
// hosts, and the worker's peak RSS.
func runFleet(ctx context.Context, b *bench) (sectionResult, error) {
	bin := filepath.Join(b.dir, "proxyfleet")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "proxyfleet/cmd/proxyfleet").CombinedOutput(); err != nil {
		return sectionResult{}, fmt.Errorf("go build: %w: %s", err, out)
	}
	var secs, rss, healthRSS, intake, anon, file, fsyncMs []float64
	var last fleetResult
	for i := range b.runs {
		r, err := fleetRun(ctx, b, bin, i)
		if err != nil {
			return sectionResult{}, fmt.Errorf("run %d: %w", i+1, err)
		}
		secs = append(secs, r.took.Seconds())
		rss = append(rss, r.workerHWM)
		healthRSS = append(healthRSS, r.healthHWM)
		intake = append(intake, r.accepted.Seconds())
		anon, file = append(anon, r.anonEnd), append(file, r.fileEnd)
		fsyncMs = append(fsyncMs, float64(r.fsync.Microseconds())/1000)
		last = r
		b.log.Printf("fleet run %d: %d proxies in the rotation after %.1fs (%.0f/s); worker peak RSS %.1f MiB, health %.1f MiB",
			i+1, fleetProxies, r.took.Seconds(), fleetProxies/r.took.Seconds(), r.workerHWM, r.healthHWM)
	}
	how := fmt.Sprintf("an embedded nats-server in the bench process (no nats-server binary is installed; file store, sync_always true as nats.conf), `proxyfleet setup`, then one `proxyfleet worker` and one `proxyfleet health` process (the binary built once with `go build`), with a config of %d hosts of driver `sim` (%s per call, %s from create to an address, max_proxies %d each) and every worker and health setting at its default. Health has neither `probe_listen` nor `target`, as for sim hosts: it probes nothing and a `running` event with an address puts a proxy in the rotation. %d create commands (no host named: placement spreads them) published at once (async, with Nats-Msg-Id);",
		fleetHosts, fleetCallDelay, fleetBootDelay, fleetProxies/fleetHosts, fleetProxies)
	secF := figure{
		Key: "fleet_2000_s", Value: median(secs), Unit: "s", Target: atMost(10), Runs: secs,
		Ours: fmt.Sprintf("%.0f proxies/s into the rotation (median)", fleetProxies/median(secs)),
		Peer: fmt.Sprintf("%d × (%s boot + 2 calls of %s) over %d hosts", fleetProxies, fleetBootDelay, fleetCallDelay, fleetHosts),
		How:  how + " the time from the first publish until a watcher of PROXY_ROTATION (the bucket `proxyfleet rotation` reads) has seen all of them put.",
	}
	if !secF.met() {
		secF.Bound = fmt.Sprintf("intake: all %d commands were accepted after %.1fs (median; %.0f commands/s), and the last proxy was in the rotation %.1fs after that. Each command costs intake about eight NATS round trips, five of them stored writes fsync'd one by one (sync_always), 64 commands at once; execution (%d hosts × 8 at once, each proxy holding its place for its calls and its boot) and the rotation keep up with it. The same path, without sim delays, is `control_plane_ratio`. The store: a small write and its fsync took %.2f ms on this disk just after each run (median), and each stream's writes are fsync'd one after another: PROXY_RESULTS (accepted, done) and PROXY_EVENTS (provisioning, running) take %d each, at least %.1fs of serial store time apiece at that rate, beside the commands, desired records, command ids, work items and host records.",
			fleetProxies, median(intake), fleetProxies/median(intake), median(secs)-median(intake), fleetHosts,
			median(fsyncMs), 2*fleetProxies, 2*fleetProxies*median(fsyncMs)/1000)
	}
	rssF := figure{
		Key: "worker_peak_rss_mib", Value: median(rss), Unit: "MiB", Target: atMost(48), Runs: rss,
		Ours: fmt.Sprintf("%.1f MiB (at the end: %.1f MiB anonymous, %.1f MiB of the binary's pages; health process %.1f MiB)", median(rss), median(anon), median(file), median(healthRSS)),
		How:  how + " the worker process's VmHWM (/proc/PID/status) once all are in the rotation, and its RssAnon and RssFile then.",
	}
	if !rssF.met() {
		rssF.Bound = fmt.Sprintf("%.1f MiB of the peak are file-backed pages of the %.0f MiB binary (its text and read-only data, all mapped once the page cache holds the file; shared with every process running it, and the same whatever the load), leaving %.1f MiB for the worker's own memory, which was %.1f MiB at the end.",
			median(file), binMiB(bin), 48-median(file), median(anon))
	}
	notes := fmt.Sprintf("When all %d proxies had reached each stage, in the last fleet run (seen on core subscriptions of results and states): %s. The worker at the end: %s.\n", fleetProxies, last.stages, last.workerStats)
	return sectionResult{figures: []figure{secF, rssF}, notes: notes}, nil
}

type fleetResult struct {
	took                 time.Duration
	workerHWM, healthHWM float64 // MiB
	workerStats          string
	stages               string        // when each stage was reached by all proxies
	accepted             time.Duration // when intake had accepted all
	anonEnd, fileEnd     float64       // the worker's RssAnon and RssFile at the end, MiB
	fsync                time.Duration // one small write and fsync on the store's disk, just after
}

// fsyncTime is the mean time of n small appends, each fsync'd, to a file
// at path (removed after), as the server's store does with sync_always.
func fsyncTime(path string, n int) time.Duration {
	f, err := os.Create(path)
	if err != nil {
		return 0
	}
	defer os.Remove(path)
	defer f.Close()
	rec := make([]byte, 256)
	start := time.Now()
	for range n {
		if _, err := f.Write(rec); err != nil {
			return 0
		}
		if err := f.Sync(); err != nil {
			return 0
		}
	}
	return time.Since(start) / time.Duration(n)
}

// met reports whether f meets its target.
func (f figure) met() bool {
	f.check()
	return f.Met
}

// binMiB is the size of the file at path in MiB.
func binMiB(path string) float64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return float64(st.Size()) / (1 << 20)
}

// fleetRun is one run on its own server, store and sim directories.
func fleetRun(ctx context.Context, b *bench, bin string, run int) (res fleetResult, err error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("fleet%d", run))
	defer func() {
		if err != nil {
			// Keep the logs of a failed run; the sim hosts' files go.
			keep, kerr := os.MkdirTemp("", "proxyfleet-bench-fleet")
			if kerr == nil {
				for _, f := range []string{"worker.log", "health.log", "config.yaml"} {
					_ = os.Rename(filepath.Join(dir, f), filepath.Join(keep, f))
				}
				err = fmt.Errorf("%w (logs in %s)", err, keep)
			}
		}
		os.RemoveAll(dir)
	}()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true, SyncAlways: true})
	if err != nil {
		return res, err
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		return res, errors.New("nats-server not ready")
	}
	var hosts strings.Builder
	for h := range fleetHosts {
		fmt.Fprintf(&hosts, "  - {name: h%02d, driver: sim, max_proxies: %d, sim: {dir: %q, delay: %s, boot_delay: %s}}\n",
			h+1, fleetProxies/fleetHosts, filepath.Join(dir, fmt.Sprintf("h%02d", h+1)), fleetCallDelay, fleetBootDelay)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `nats: {url: %q}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
`, s.ClientURL(), hosts.String()), 0o644); err != nil {
		return res, err
	}
	if out, err := exec.CommandContext(ctx, bin, "setup", "--config", cfg).CombinedOutput(); err != nil {
		return res, fmt.Errorf("proxyfleet setup: %w: %s", err, out)
	}
	wrk, wAddr, err := startReady(ctx, bin, filepath.Join(dir, "worker.log"), nil, "worker", "--config", cfg)
	if err != nil {
		return res, err
	}
	defer wrk.stop(b)
	health, _, err := startReady(ctx, bin, filepath.Join(dir, "health.log"), nil, "health", "--config", cfg)
	if err != nil {
		return res, err
	}
	defer health.stop(b)
	b.log.Printf("fleet run %d: worker ready, RSS %.1f MiB (anonymous %.1f, file %.1f)", run+1, rssMiB(wrk.cmd.Process.Pid, "VmRSS:"),
		rssMiB(wrk.cmd.Process.Pid, "RssAnon:"), rssMiB(wrk.cmd.Process.Pid, "RssFile:"))
	nc, _ := connect(s.ClientURL())
	defer nc.Close()
	var pubErrs atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { pubErrs.Add(1) }))
	if err != nil {
		return res, err
	}
	kv, err := js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		return res, err
	}
	// All of the bucket (empty now), not UpdatesOnly: a watcher whose
	// consumer is reset resumes after the last update it saw.
	watch, err := kv.WatchAll(ctx)
	if err != nil {
		return res, err
	}
	defer watch.Stop()
	rotStream, err := js.Stream(ctx, "KV_"+messages.BucketRotation)
	if err != nil {
		return res, err
	}
	backstop := time.NewTicker(time.Second)
	defer backstop.Stop()
	subj := messages.NewSubjects("")
	stages := newStages(fleetProxies)
	for _, sub := range []string{subj.ResultAll(), subj.StateAll()} {
		sb, err := nc.Subscribe(sub, stages.observe)
		if err != nil {
			return res, err
		}
		defer sb.Unsubscribe()
	}
	start := time.Now()
	stages.start = start
	for i := range fleetProxies {
		id := fmt.Sprintf("f%05d", i)
		m := nats.NewMsg(subj.Command(messages.OpCreate, id))
		m.Data = []byte(`{"v":1,"id":"` + id + `"}`)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("fleet%d-%d", run, i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			return res, err
		}
	}
	// Every command stored, or the run says why not.
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return res, fmt.Errorf("%d of %d commands not acknowledged by the server after a minute", js.PublishAsyncPending(), fleetProxies)
	}
	if n := pubErrs.Load(); n > 0 {
		return res, fmt.Errorf("%d of %d commands refused by the server", n, fleetProxies)
	}
	in := map[string]bool{}
	deadline := time.After(5 * time.Minute)
	for len(in) < fleetProxies {
		select {
		case e := <-watch.Updates():
			if e == nil {
				continue // the end of the initial values (none)
			}
			if e.Operation() == jetstream.KeyValuePut {
				in[e.Key()] = true
			} else {
				delete(in, e.Key())
			}
		case <-backstop.C:
			// The stream's count of keys, in case the watcher missed
			// some (history 1, no deletes here: one message a key).
			if info, err := rotStream.Info(ctx); err == nil && info.State.Msgs >= fleetProxies && len(in) < fleetProxies {
				b.log.Printf("fleet run %d: the watcher saw %d of the %d keys in PROXY_ROTATION", run+1, len(in), info.State.Msgs)
				for i := range fleetProxies {
					in[fmt.Sprintf("f%05d", i)] = true
				}
			}
		case <-wrk.done:
			return res, fmt.Errorf("the worker exited: %v", wrk.err)
		case <-health.done:
			return res, fmt.Errorf("the health process exited: %v", health.err)
		case <-deadline:
			if ci, err := js.Consumer(ctx, messages.StreamCommands, topology.IntakeConsumer); err == nil {
				if info, err := ci.Info(ctx); err == nil {
					b.log.Printf("fleet run %d: intake consumer: %d pending, %d unacked, %d pulls waiting", run+1, info.NumPending, info.NumAckPending, info.NumWaiting)
				}
			}
			b.log.Printf("fleet run %d: %s", run+1, stages)
			return res, fmt.Errorf("%d of %d proxies in the rotation after 5 minutes", len(in), fleetProxies)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	res.took = time.Since(start)
	res.fsync = fsyncTime(filepath.Join(dir, "fsync"), 200)
	res.stages = stages.String()
	res.accepted = stages.allOf(messages.OutcomeAccepted)
	b.log.Printf("fleet run %d: %s", run+1, res.stages)
	res.workerHWM, res.healthHWM = hwmMiB(wrk.cmd.Process.Pid), hwmMiB(health.cmd.Process.Pid)
	res.anonEnd, res.fileEnd = rssMiB(wrk.cmd.Process.Pid, "RssAnon:"), rssMiB(wrk.cmd.Process.Pid, "RssFile:")
	b.log.Printf("fleet run %d: worker at the end: RSS %.1f MiB (anonymous %.1f, file %.1f)", run+1, rssMiB(wrk.cmd.Process.Pid, "VmRSS:"), res.anonEnd, res.fileEnd)
	res.workerStats = scrapeStats("http://" + wAddr + "/metrics")
	return res, nil
}

// role is a proxyfleet process of the bench.
type role struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when it exited
	err  error         // what Wait returned, once done
}

// startRole starts bin with args, its output into logPath; env, if any, is
// added to the bench's own environment for the process.
func startRole(bin, logPath string, env []string, args ...string) (*role, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	r := &role{name: args[0], cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	return r, nil
}

// startReady starts a role listening on a free loopback port (--http) and
// waits until it is ready there. A port taken meanwhile by another
// process (the role exits, saying so) is tried again with another.
func startReady(ctx context.Context, bin, logPath string, env []string, args ...string) (*role, string, error) {
	for attempt := 0; ; attempt++ {
		addr := freeAddr()
		r, err := startRole(bin, logPath, env, append(args, "--http", addr)...)
		if err != nil {
			return nil, "", err
		}
		err = awaitReady(ctx, "http://"+addr+"/readyz", r.done, time.Minute)
		if err == nil {
			return r, addr, nil
		}
		select {
		case <-r.done:
			out, _ := os.ReadFile(logPath)
			if strings.Contains(string(out), "address already in use") && attempt < 3 {
				continue
			}
			return nil, "", fmt.Errorf("%s exited: %v: %s", args[0], r.err, out)
		default:
			r.stop(nil)
			return nil, "", err
		}
	}
}

// stop ends the process with SIGTERM (its graceful stop), and SIGKILL if
// it is not gone within a minute. b nil: nothing is logged.
func (r *role) stop(b *bench) {
	defer r.log.Close()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		if r.err != nil && b != nil {
			b.log.Printf("%s: %v (log %s)", r.name, r.err, r.log.Name())
		}
	case <-time.After(time.Minute):
		_ = r.cmd.Process.Kill()
		<-r.done
		if b != nil {
			b.log.Printf("%s: killed after a minute of SIGTERM", r.name)
		}
	}
}

// freeAddr is a loopback address no one listens on (just now).
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}

// awaitReady waits until url answers 200, the process exits (done), or
// limit passes.
func awaitReady(ctx context.Context, url string, done <-chan struct{}, limit time.Duration) error {
	end := time.Now().Add(limit)
	for {
		select {
		case <-done:
			return fmt.Errorf("%s: the process exited", url)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s not ready within %s", url, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// hwmMiB is a process's peak resident set (VmHWM) in MiB.
func hwmMiB(pid int) float64 { return rssMiB(pid, "VmHWM:") }

// rssMiB is a size in MiB from /proc/PID/status: VmRSS, VmHWM.
func rssMiB(pid int, key string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

// scrapeStats picks a few of the worker's metrics: its Go memory and goroutines.
func scrapeStats(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return "metrics unreadable: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var picked []string
	for _, l := range strings.Split(string(body), "\n") {
		for _, k := range []string{"go_goroutines ", "go_memstats_heap_inuse_bytes ", "go_memstats_sys_bytes ", "process_resident_memory_bytes ", "go_memstats_stack_inuse_bytes ", "go_memstats_heap_alloc_bytes ", "go_memstats_next_gc_bytes ", "go_memstats_other_sys_bytes ", "go_memstats_gc_sys_bytes ", "go_memstats_mspan_inuse_bytes "} {
			if strings.HasPrefix(l, k) {
				picked = append(picked, l)
			}
		}
	}
	return strings.Join(picked, ", ")
}

// stages times, from core subscriptions on results and states, when all
// proxies were accepted, provisioning, running and done.
type stages struct {
	mu    sync.Mutex
	n     int
	start time.Time
	seen  map[string]map[string]bool // stage -> ids
	half  map[string]time.Duration
	all   map[string]time.Duration
}

func newStages(n int) *stages {
	return &stages{n: n, seen: map[string]map[string]bool{}, half: map[string]time.Duration{}, all: map[string]time.Duration{}}
}

func (s *stages) observe(m *nats.Msg) {
	var v struct {
		ID      string `json:"id"`
		Outcome string `json:"outcome"`
		State   string `json:"state"`
	}
	if json.Unmarshal(m.Data, &v) != nil {
		return
	}
	stage := v.Outcome + v.State // a result has one, an event the other
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[stage] == nil {
		s.seen[stage] = map[string]bool{}
	}
	if s.seen[stage][v.ID] {
		return
	}
	s.seen[stage][v.ID] = true
	switch len(s.seen[stage]) {
	case s.n / 2:
		s.half[stage] = time.Since(s.start)
	case s.n:
		s.all[stage] = time.Since(s.start)
	}
}

// allOf is when every proxy had reached stage.
func (s *stages) allOf(stage string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all[stage]
}

func (s *stages) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, st := range []string{messages.OutcomeAccepted, messages.StateProvisioning, messages.StateRunning, messages.OutcomeDone} {
		out = append(out, fmt.Sprintf("%s half %.1fs all %.1fs", st, s.half[st].Seconds(), s.all[st].Seconds()))
	}
	return strings.Join(out, "; ")
}
