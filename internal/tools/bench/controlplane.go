package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// cpuProfile, if set, is where the control-plane section writes a CPU
// profile of its command phases (create and delete, every run).
var cpuProfile = flag.String("cpuprofile", "", "write a CPU profile of the control-plane command phases to this file")

// runControlPlane measures, on one embedded nats-server, the raw
// JetStream synchronous publish rate (the peer) and the rate of create and
// delete commands through intake and execution on two sim hosts, b.runs
// times, each run on a fresh server. It counts the stored writes each
// command makes (the growth of every stream's last sequence), to say what
// bounds the rate when the target is missed.
func runControlPlane(ctx context.Context, b *bench) (sectionResult, error) {
	var ratios, delRatios, raws, creates []float64
	var last cpRun
	for i := range b.runs {
		r, err := controlPlaneRun(ctx, b, i)
		if err != nil {
			return sectionResult{}, err
		}
		rawRate := float64(b.n) / r.raw.Seconds()
		raws = append(raws, rawRate)
		creates = append(creates, float64(b.n)/r.create.Seconds())
		ratios = append(ratios, float64(b.n)/r.create.Seconds()/rawRate)
		delRatios = append(delRatios, float64(b.n)/r.del.Seconds()/rawRate)
		b.log.Printf("control plane run %d: raw %.0f/s, create %.0f/s (%.2f stored writes each: %s), delete %.0f/s (%.2f writes each: %s)",
			i+1, rawRate, float64(b.n)/r.create.Seconds(), r.createWrites.perCommand(b.n), r.createWrites.by(b.n),
			float64(b.n)/r.del.Seconds(), r.delWrites.perCommand(b.n), r.delWrites.by(b.n))
		last = r
	}
	f := figure{
		Key: "control_plane_ratio", Value: median(ratios), Unit: "ratio", Target: atLeast(0.4), Runs: ratios,
		Ours: fmt.Sprintf("%.0f creates/s (median; deletes %.2f of raw)", median(creates), median(delRatios)),
		Peer: fmt.Sprintf("raw JetStream sync publish %.0f/s", median(raws)),
		How: fmt.Sprintf("one embedded nats-server (file store, sync_always true, as `serve` runs it). Peer: %d synchronous JetStream publishes "+
			"(one at a time, each waiting for its ack) of a 21-byte body to a file stream on that server, one stored write each. "+
			"Ours, just after on the same server: one worker with intake (64 commands at once) and execution of two sim hosts (no call delay, 32 work items at once each), in one process; "+
			"%d create commands published at once (async, with Nats-Msg-Id) until each has its `done` result; each command is validated, "+
			"placed (room reserved), recorded as desired state, dispatched, accepted, converged (provisioning and running events) and answered done. "+
			"Ratio: creates/s over raw publishes/s.", b.n, b.n),
	}
	if f.check(); !f.Met {
		n := float64(b.n)
		w := last.createWrites.perCommand(b.n)
		rawMS, rawCPU, createCPU := last.raw.Seconds()*1e3/n, last.rawCPU.Seconds()*1e3/n, last.createCPU.Seconds()*1e3/n
		f.Bound = fmt.Sprintf("CPU and stored writes, measured in the last run: each create made %.1f stored writes (%s), the command itself included, "+
			"each fsync'd (sync_always) as the peer's one write per publish is; the peer's publish took %.2f ms, waiting for its one write, "+
			"and %.2f ms of the process's CPU. A create took %.2f ms of CPU in the same process (the server's writes and acks, "+
			"the worker, the sim hosts' file calls), %.0f times as much: with both cores to itself the process could do at most %.0f creates/s, "+
			"%.2f of the peer's rate, and the cores are shared with the rest of the machine (load average %s at the end). "+
			"The writes: PROXY_CMDS (the command), KV_PROXY_DESIRED (the desired state, compare-and-set), KV_PROXY_CMDIDS (effect-once past "+
			"the dedupe window), PROXY_WORK (the work item), PROXY_RESULTS (accepted, done), PROXY_EVENTS (provisioning, running), "+
			"KV_PROXY_HOSTS (room, batched); the work queues' acks add a removal each for the command and the work item.",
			w, last.createWrites.by(b.n), rawMS, rawCPU, createCPU, createCPU/rawCPU, 2e3/createCPU, 2e3/createCPU/(1e3/rawMS), loadAvg())
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	notes := fmt.Sprintf("Memory of the bench process after the control-plane runs (server, worker, %d proxies created and deleted %d times): peak RSS %s, Go heap in use after a GC %.1f MiB.\n", b.n, b.runs, peakRSS(), float64(ms.HeapAlloc)/(1<<20))
	return sectionResult{figures: []figure{f}, notes: notes}, nil
}

// cpRun is what one control-plane run measured.
type cpRun struct {
	raw, create, del        time.Duration
	createWrites, delWrites writes
	// The process's CPU time (server, worker and sim hosts together) in
	// the raw publishes and the creates.
	rawCPU, createCPU time.Duration
}

// writes are the stored writes of a phase, by stream.
type writes map[string]uint64

func (w writes) perCommand(n int) float64 {
	var sum uint64
	for _, v := range w {
		sum += v
	}
	return float64(sum) / float64(n)
}

// by says the writes per command of each stream that had any.
func (w writes) by(n int) string {
	names := make([]string, 0, len(w))
	for k, v := range w {
		if v > 0 {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %.2f", k, float64(w[k])/float64(n))
	}
	return strings.Join(parts, ", ")
}

// lastSeqs reads every stream's last sequence: it grows by one per stored
// write, whatever the stream keeps (a work queue drops what is acked, a
// bucket keeps one revision per key).
func lastSeqs(ctx context.Context, js jetstream.JetStream) map[string]uint64 {
	out := map[string]uint64{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = info.State.LastSeq
	}
	if err := l.Err(); err != nil {
		log.Fatal(err)
	}
	return out
}

func diffSeqs(before, after map[string]uint64) writes {
	w := writes{}
	for k, v := range after {
		w[k] = v - before[k]
	}
	return w
}

// controlPlaneRun is one run on its own server and store.
func controlPlaneRun(ctx context.Context, b *bench, run int) (cpRun, error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("cp%d", run))
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true, SyncAlways: true})
	if err != nil {
		return cpRun{}, err
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		return cpRun{}, errors.New("nats-server not ready")
	}
	var r cpRun
	cpu0 := cpuTime()
	r.raw = rawPublish(ctx, s.ClientURL(), b.n)
	r.rawCPU = cpuTime() - cpu0
	if *cpuProfile != "" && run == 0 {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return cpRun{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return cpRun{}, err
		}
		defer pprof.StopCPUProfile()
	}
	commands(ctx, s.ClientURL(), dir, b.n, &r)
	return r, nil
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// peakRSS is the process's high-water resident set (VmHWM).
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func connect(url string) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	return nc, js
}

func rawPublish(ctx context.Context, url string, n int) time.Duration {
	nc, js := connect(url)
	defer nc.Close()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage}); err != nil {
		log.Fatal(err)
	}
	body := []byte(`{"v":1,"id":"p00001"}`)
	start := time.Now()
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("bench.%d", i%100), body); err != nil {
			log.Fatal(err)
		}
	}
	return time.Since(start)
}

func commands(ctx context.Context, url, dir string, n int, r *cpRun) {
	subj := messages.NewSubjects("")
	hosts := []string{"h1", "h2"}
	provs := map[string]worker.Provider{}
	for _, h := range hosts {
		d, err := sim.New(sim.Config{Host: h, Dir: dir + "/" + h})
		if err != nil {
			log.Fatal(err)
		}
		provs[h] = d
	}
	wnc, wjs := connect(url)
	defer wnc.Close()
	// As `proxyfleet setup` does: workers create no streams.
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, wjs); err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(wjs, worker.Config{
		Subjects: subj,
		Catalog: worker.Catalog{Hosts: hosts, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128,
			MaxProxies: map[string]int{"h1": n, "h2": n}}, // room for every proxy on either host
		Providers: provs, Concurrency: 32, PollInterval: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(wctx) }()
	defer func() {
		stopWorker()
		if err := <-ran; err != nil {
			log.Print(err)
		}
	}()
	select {
	case <-w.Started():
	case err := <-ran:
		log.Fatal(err)
	}

	nc, js := connect(url)
	defer nc.Close()
	run := func(op string) (time.Duration, writes, time.Duration) {
		var mu sync.Mutex
		pending := map[string]bool{}
		accepted, lastAccepted := 0, time.Time{}
		done := make(chan struct{})
		sub, err := nc.Subscribe(subj.ResultAll(), func(m *nats.Msg) {
			var r messages.Result
			if json.Unmarshal(m.Data, &r) != nil || r.Op != op {
				return
			}
			mu.Lock()
			if r.Outcome == messages.OutcomeAccepted {
				accepted++
				lastAccepted = time.Now()
			}
			if r.Outcome != messages.OutcomeDone {
				mu.Unlock()
				return
			}
			if pending[r.CommandID] {
				delete(pending, r.CommandID)
				if len(pending) == 0 {
					close(done)
				}
			}
			mu.Unlock()
		})
		if err != nil {
			log.Fatal(err)
		}
		defer sub.Unsubscribe()
		for i := range n {
			pending[fmt.Sprintf("%s-%d", op, i)] = true
		}
		before := lastSeqs(ctx, js)
		cpu0 := cpuTime()
		start := time.Now()
		for i := range n {
			id := fmt.Sprintf("p%05d", i)
			m := nats.NewMsg(subj.Command(op, id))
			m.Data = []byte(`{"v":1,"id":"` + id + `"}`)
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%d", op, i))
			if _, err := js.PublishMsgAsync(m); err != nil {
				log.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(10 * time.Minute):
			log.Fatalf("%s: %d commands not done after 10 minutes", op, len(pending))
		}
		took := time.Since(start)
		cpu := cpuTime() - cpu0
		mu.Lock()
		log.Printf("%s: %d accepted, the last after %s; the last done after %s; CPU of the process %.2f ms per command",
			op, accepted, lastAccepted.Sub(start).Round(time.Millisecond), took.Round(time.Millisecond), cpu.Seconds()*1e3/float64(n))
		mu.Unlock()
		return took, diffSeqs(before, lastSeqs(ctx, js)), cpu
	}
	r.create, r.createWrites, r.createCPU = run(messages.OpCreate)
	r.del, r.delWrites, _ = run(messages.OpDelete)
}
