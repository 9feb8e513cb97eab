package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
)

// fleetProcs are the section's worker and health processes.
type fleetProcs struct {
	workers, healths []*role
	workerAddrs      []string
	names            map[*role]string // w01, h1...
}

// startFleetProcs starts o.workers workers (ids w01...) and o.healths health
// processes at once, each with its own log and --http listener, and waits
// until every one is ready.
func startFleetProcs(ctx context.Context, b *bench, bin, dir, cfg string, o fleet50kOpts) (*fleetProcs, error) {
	p := &fleetProcs{names: map[*role]string{}}
	type started struct {
		r    *role
		addr string
		err  error
	}
	n := o.workers + o.healths
	out := make([]started, n)
	var env []string
	if mp := procsMaxProcs(o, runtime.NumCPU()); mp > 0 {
		env = []string{"GOMAXPROCS=" + strconv.Itoa(mp)}
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("w%02d", i+1)
			args := []string{"worker", "--config", cfg, "--id", name}
			if o.profileDir != "" {
				args = append(args, "--pprof")
			}
			if i >= o.workers {
				name = fmt.Sprintf("h%d", i-o.workers+1)
				args = []string{"health", "--config", cfg}
			}
			r, addr, err := startReady(ctx, bin, filepath.Join(dir, name+".log"), env, args...)
			out[i] = started{r, addr, err}
		}()
	}
	wg.Wait()
	var errs []error
	for i, s := range out {
		if s.err != nil {
			errs = append(errs, s.err)
			continue
		}
		if i < o.workers {
			p.workers = append(p.workers, s.r)
			p.workerAddrs = append(p.workerAddrs, s.addr)
			p.names[s.r] = fmt.Sprintf("w%02d", i+1)
		} else {
			p.healths = append(p.healths, s.r)
			p.names[s.r] = fmt.Sprintf("h%d", i-o.workers+1)
		}
	}
	if len(errs) > 0 {
		p.stop(b)
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func (p *fleetProcs) all() []*role { return append(append([]*role{}, p.workers...), p.healths...) }

// stop stops every process at once (SIGTERM: each drains).
func (p *fleetProcs) stop(b *bench) {
	var wg sync.WaitGroup
	for _, r := range p.all() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stop(b)
		}()
	}
	wg.Wait()
}

// exited says which process has exited, if any.
func (p *fleetProcs) exited() error {
	for _, r := range p.all() {
		select {
		case <-r.done:
			return fmt.Errorf("%s exited: %v", p.names[r], r.err)
		default:
		}
	}
	return nil
}

// cpu is the CPU seconds (user and system) each process has used, by
// name, and the bench process's own (the nats-server, the bench's
// readers) under "server".
func (p *fleetProcs) cpu() map[string]float64 {
	out := map[string]float64{"server": procCPU(os.Getpid())}
	for _, r := range p.all() {
		out[p.names[r]] = procCPU(r.cmd.Process.Pid)
	}
	return out
}

// procCPU is the CPU seconds pid has used (/proc/PID/stat, utime and
// stime), 0 if unreadable.
func procCPU(pid int) float64 {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(st, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(st[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return float64(u+s) / clockTicks
}

// cpuSummary says where the CPU went between two samples of cpu.
func cpuSummary(before, after map[string]float64, wall time.Duration) (string, float64) {
	var workers, total float64
	var parts []string
	for name, a := range after {
		d := a - before[name]
		total += d
		if strings.HasPrefix(name, "w") {
			workers += d
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f s", name, d))
	}
	slices.Sort(parts)
	return fmt.Sprintf("CPU over the %.0f s of the burst: the workers %.1f s in all, %s (the nats-server with the bench's own readers is \"server\")",
		wall.Seconds(), workers, strings.Join(parts, ", ")), total
}

// warningsSince reads every process's log (JSON lines) for records at
// level WARN or ERROR from since on.
func (p *fleetProcs) warningsSince(since time.Time) []string {
	var out []string
	for _, r := range p.all() {
		f, err := os.Open(r.log.Name())
		if err != nil {
			out = append(out, fmt.Sprintf("%s: log unreadable: %v", p.names[r], err))
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec struct {
				Time  time.Time `json:"time"`
				Level string    `json:"level"`
				Msg   string    `json:"msg"`
				Err   string    `json:"err"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Time.Before(since) {
				continue
			}
			if rec.Level == "WARN" || rec.Level == "ERROR" {
				out = append(out, fmt.Sprintf("%s %s %s %q %s", p.names[r], rec.Time.Format("15:04:05.000"), rec.Level, rec.Msg, rec.Err))
			}
		}
		f.Close()
	}
	return out
}

// profileCPU takes a CPU profile of the first worker for o.profileFor,
// from the start of the burst.
func (p *fleetProcs) profileCPU(b *bench, o fleet50kOpts, n int) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.workerAddrs[0], int(o.profileFor.Seconds()))
	path := filepath.Join(o.profileDir, fmt.Sprintf("fleet50k-%s-w01.cpu.pprof", sizeName(n)))
	if err := fetchTo(url, path, o.profileFor+time.Minute); err != nil {
		b.log.Printf("fleet50k %d: CPU profile of w01: %v", n, err)
		return
	}
	b.log.Printf("fleet50k %d: CPU profile of w01 over the first %s of the burst: %s", n, o.profileFor, path)
}

// profileSelf takes a CPU profile of the bench process (the nats-server
// above all) for o.profileFor, from the start of the burst.
func profileSelf(ctx context.Context, b *bench, o fleet50kOpts, n int) {
	path := filepath.Join(o.profileDir, fmt.Sprintf("fleet50k-%s-server.cpu.pprof", sizeName(n)))
	if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
		b.log.Printf("fleet50k %d: %v", n, err)
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.log.Printf("fleet50k %d: %v", n, err)
		return
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		b.log.Printf("fleet50k %d: CPU profile of the bench process: %v", n, err)
		return
	}
	_ = sleepCtx(ctx, o.profileFor)
	pprof.StopCPUProfile()
	b.log.Printf("fleet50k %d: CPU profile of the bench process (the nats-server) over the first %s of the burst: %s", n, o.profileFor, path)
}

// profileHeaps saves every worker's heap profile.
func (p *fleetProcs) profileHeaps(b *bench, o fleet50kOpts, n int) {
	for i, addr := range p.workerAddrs {
		path := filepath.Join(o.profileDir, fmt.Sprintf("fleet50k-%s-w%02d.heap.pprof", sizeName(n), i+1))
		if err := fetchTo("http://"+addr+"/debug/pprof/heap", path, time.Minute); err != nil {
			b.log.Printf("fleet50k %d: heap profile of w%02d: %v", n, i+1, err)
		}
	}
	b.log.Printf("fleet50k %d: heap profiles of the workers in %s", n, o.profileDir)
}

func fetchTo(url, path string, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rotationMeter counts what is published on the rotation subjects
// (<prefix>.rotation and <prefix>.rotation.>), on a connection of its own
// so that a flood there cannot cut the bench's other readers off.
type rotationMeter struct {
	nc                  *nats.Conn
	subs                []*nats.Subscription
	maxMsg, bytes, msgs atomic.Int64 // maxMsg: on the feed's subjects, <prefix>.rotation.>
	maxSnap             atomic.Int64 // the largest on the v1 snapshot subject, <prefix>.rotation
	snapBytes           atomic.Int64 // the bytes on it (in bytes too)
	trouble             atomic.Int64 // slow consumer errors, disconnects
}

func newRotationMeter(url string, subj messages.Subjects) (*rotationMeter, error) {
	m := &rotationMeter{}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) { m.trouble.Add(1) }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { m.trouble.Add(1) }))
	if err != nil {
		return nil, err
	}
	m.nc = nc
	for _, s := range []string{subj.Rotation(), subj.Rotation() + ".>"} {
		largest, on := &m.maxMsg, (*atomic.Int64)(nil)
		if s == subj.Rotation() {
			largest, on = &m.maxSnap, &m.snapBytes
		}
		sub, err := nc.Subscribe(s, func(msg *nats.Msg) { m.count(msg, largest, on) })
		if err != nil {
			nc.Close()
			return nil, err
		}
		_ = sub.SetPendingLimits(-1, -1)
		m.subs = append(m.subs, sub)
	}
	return m, nc.Flush()
}

// count adds one message: its payload and headers as the wire carries
// them.
func (m *rotationMeter) count(msg *nats.Msg, largest, on *atomic.Int64) {
	n := int64(len(msg.Data))
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	m.msgs.Add(1)
	m.bytes.Add(n)
	if on != nil {
		on.Add(n)
	}
	for {
		cur := largest.Load()
		if n <= cur || largest.CompareAndSwap(cur, n) {
			break
		}
	}
}

// read returns the largest message on the feed's subjects and on the
// snapshot's, the bytes and the messages counted, and what may have been
// missed.
func (m *rotationMeter) read() (maxMsg, maxSnap, bytes, snapBytes, msgs int64, lost string) {
	var dropped int
	for _, s := range m.subs {
		if d, err := s.Dropped(); err == nil {
			dropped += d
		}
	}
	if dropped > 0 || m.trouble.Load() > 0 {
		lost = fmt.Sprintf("the meter dropped %d messages and saw %d slow-consumer errors or disconnects", dropped, m.trouble.Load())
	}
	return m.maxMsg.Load(), m.maxSnap.Load(), m.bytes.Load(), m.snapBytes.Load(), m.msgs.Load(), lost
}

func (m *rotationMeter) close() { m.nc.Close() }

// runCmd runs bin with args, bounded by limit, and returns its output.
func runCmd(ctx context.Context, limit time.Duration, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return exec.CommandContext(ctx, bin, args...).CombinedOutput()
}

func goBuild(ctx context.Context, bin string) error {
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "proxyfleet/cmd/proxyfleet").CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w: %s", err, out)
	}
	return nil
}

// verbTimeout bounds each client verb of the section (and is its
// --timeout): far above the bound, so that a slow verb is timed, not cut.
const verbTimeout = 2 * time.Minute

// timeVerbs times the client verbs as processes at this size: list, get,
// hosts, rotation (each until it exits; list and rotation checked to
// show every proxy) and watch (until its first output).
func timeVerbs(ctx context.Context, bin, cfg string, n int) (map[string]float64, []string) {
	out := map[string]float64{}
	var errs []string
	timeout := "--timeout=" + verbTimeout.String()
	for _, v := range []struct {
		name  string
		args  []string
		lines int // at least this many lines of output
	}{
		{"list", []string{"list", "--config", cfg, timeout}, n},
		{"get", []string{"get", fmt.Sprintf("f%05d", n/2), "--config", cfg, timeout}, 1},
		{"hosts", []string{"hosts", "--config", cfg, timeout}, 1},
		{"rotation", []string{"rotation", "--config", cfg, timeout}, n},
	} {
		var runs []float64
		for range verbRuns {
			start := time.Now()
			o, err := runCmd(ctx, verbTimeout, bin, v.args...)
			runs = append(runs, time.Since(start).Seconds())
			if lines := bytes.Count(o, []byte("\n")); err != nil || lines < v.lines {
				errs = append(errs, fmt.Sprintf("%s: %v, %d lines of output (want %d): %.200s", v.name, err, lines, v.lines, o))
				break
			}
		}
		out[v.name] = median(runs)
	}
	var runs []float64
	for range verbRuns {
		secs, err := firstOutput(ctx, bin, "watch", "--config", cfg)
		runs = append(runs, secs)
		if err != nil {
			errs = append(errs, "watch: "+err.Error())
			break
		}
	}
	out["watch"] = median(runs)
	return out, errs
}

// verbRuns is how many times each verb is timed: the median counts (the
// fleet's own observation passes share the cores with it).
const verbRuns = 3

// firstOutput starts bin with args and returns how long it took to print
// its first byte; then it stops it.
func firstOutput(ctx context.Context, bin string, args ...string) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second // then killed
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	got := make(chan error, 1)
	go func() {
		_, err := stdout.Read(make([]byte, 1))
		got <- err
	}()
	var secs float64
	select {
	case err = <-got:
		secs = time.Since(start).Seconds()
	case <-time.After(verbTimeout):
		err = fmt.Errorf("no output within %s", verbTimeout)
		secs = verbTimeout.Seconds()
	}
	cancel()
	_ = cmd.Wait() // closes stdout: the reader, if still waiting, returns
	if err != nil {
		return secs, fmt.Errorf("%w: %s", err, stderr.String())
	}
	return secs, nil
}
