package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
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
	var secs, rss, healthRSS []float64
	var last fleetResult
	for i := range b.runs {
		r, err := fleetRun(ctx, b, bin, i)
		if err != nil {
			return sectionResult{}, fmt.Errorf("run %d: %w", i+1, err)
		}
		secs = append(secs, r.took.Seconds())
		rss = append(rss, r.workerHWM)
		healthRSS = append(healthRSS, r.healthHWM)
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
	rssF := figure{
		Key: "worker_peak_rss_mib", Value: median(rss), Unit: "MiB", Target: atMost(48), Runs: rss,
		Ours: fmt.Sprintf("%.1f MiB (health process %.1f MiB)", median(rss), median(healthRSS)),
		How:  how + " the worker process's VmHWM (/proc/PID/status) once all are in the rotation.",
	}
	notes := fmt.Sprintf("Last fleet run, worker at the end: %s.\n", last.workerStats)
	return sectionResult{figures: []figure{secF, rssF}, notes: notes}, nil
}

type fleetResult struct {
	took                 time.Duration
	workerHWM, healthHWM float64 // MiB
	workerStats          string
}

// fleetRun is one run on its own server, store and sim directories.
func fleetRun(ctx context.Context, b *bench, bin string, run int) (res fleetResult, err error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("fleet%d", run))
	defer os.RemoveAll(dir)
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
	wAddr, hAddr := freeAddr(), freeAddr()
	worker, err := startRole(bin, filepath.Join(dir, "worker.log"), "worker", "--config", cfg, "--http", wAddr)
	if err != nil {
		return res, err
	}
	defer worker.stop(b)
	health, err := startRole(bin, filepath.Join(dir, "health.log"), "health", "--config", cfg, "--http", hAddr)
	if err != nil {
		return res, err
	}
	defer health.stop(b)
	for _, a := range []string{wAddr, hAddr} {
		if err := awaitReady(ctx, "http://"+a+"/readyz", time.Minute); err != nil {
			return res, err
		}
	}

	nc, js := connect(s.ClientURL())
	defer nc.Close()
	kv, err := js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		return res, err
	}
	watch, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return res, err
	}
	defer watch.Stop()
	subj := messages.NewSubjects("")
	start := time.Now()
	for i := range fleetProxies {
		id := fmt.Sprintf("f%05d", i)
		m := nats.NewMsg(subj.Command(messages.OpCreate, id))
		m.Data = []byte(`{"v":1,"id":"` + id + `"}`)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("fleet%d-%d", run, i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			return res, err
		}
	}
	in := map[string]bool{}
	deadline := time.After(10 * time.Minute)
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
		case <-deadline:
			return res, fmt.Errorf("%d of %d proxies in the rotation after 10 minutes", len(in), fleetProxies)
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	res.took = time.Since(start)
	res.workerHWM, res.healthHWM = hwmMiB(worker.cmd.Process.Pid), hwmMiB(health.cmd.Process.Pid)
	res.workerStats = scrapeStats("http://" + wAddr + "/metrics")
	return res, nil
}

// role is a proxyfleet process of the bench.
type role struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
}

func startRole(bin, logPath string, args ...string) (*role, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	return &role{name: args[0], cmd: cmd, log: f}, nil
}

// stop ends the process with SIGTERM (its graceful stop), and SIGKILL if
// it is not gone within a minute.
func (r *role) stop(b *bench) {
	defer r.log.Close()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			b.log.Printf("%s: %v (log %s)", r.name, err, r.log.Name())
		}
	case <-time.After(time.Minute):
		_ = r.cmd.Process.Kill()
		<-done
		b.log.Printf("%s: killed after a minute of SIGTERM", r.name)
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

func awaitReady(ctx context.Context, url string, limit time.Duration) error {
	end := time.Now().Add(limit)
	for {
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
func hwmMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

// scrapeStats picks a few of the worker's metrics: Go heap and goroutines.
func scrapeStats(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return "metrics unreadable: " + err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 1<<20)
	n, _ := readFull(resp.Body, buf)
	var picked []string
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		for _, k := range []string{"go_goroutines ", "go_memstats_heap_inuse_bytes ", "go_memstats_sys_bytes ", "process_resident_memory_bytes "} {
			if strings.HasPrefix(l, k) {
				picked = append(picked, l)
			}
		}
	}
	b.WriteString(strings.Join(picked, ", "))
	return b.String()
}

func readFull(r interface{ Read([]byte) (int, error) }, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
