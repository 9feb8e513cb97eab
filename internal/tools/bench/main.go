// Command bench measures, on one embedded nats-server in one run, the raw
// JetStream synchronous publish rate and the rate of commands through
// intake and execution on sim hosts, and prints both with their ratio. With
// -out it rewrites that file (BENCHMARKS.md) with the figures and the
// machine they came from.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

func main() {
	n := flag.Int("n", 2000, "commands (and raw publishes) per measurement")
	out := flag.String("out", "", "write the figures to this markdown file")
	syncAlways := flag.Bool("sync-always", true, "fsync every write, as `serve` and nats.conf do")
	flag.Parse()
	dir, err := os.MkdirTemp("", "proxyfleet-bench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true, SyncAlways: *syncAlways})
	if err != nil {
		log.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server not ready")
	}
	defer s.Shutdown()
	ctx := context.Background()

	raw := rawPublish(ctx, s.ClientURL(), *n)
	create, del := commands(ctx, s.ClientURL(), dir, *n)

	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` (internal/tools/bench) on %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s, %s/%s. One embedded nats-server (file store in a temp dir, sync_always %v), one worker with intake and execution of two sim hosts (no call delay), all in one process.\n\n", cpuModel(), runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH, *syncAlways)
	fmt.Fprintf(&b, "| measurement | count | seconds | per second | vs raw publish |\n|---|---|---|---|---|\n")
	row := func(name string, count int, d time.Duration) {
		rate := float64(count) / d.Seconds()
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.0f | %.3f |\n", name, count, d.Seconds(), rate, rate/(float64(*n)/raw.Seconds()))
	}
	row("raw JetStream synchronous publish (peer figure)", *n, raw)
	row("create commands, published to `done` result", *n, create)
	row("delete commands, published to `done` result", *n, del)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(&b, "\nMemory of the whole process (server, worker, %d proxies created and deleted): peak RSS %s, Go heap in use after a GC %.1f MiB, Go runtime total %.1f MiB.\n",
		*n, peakRSS(), float64(ms.HeapAlloc)/(1<<20), float64(ms.Sys)/(1<<20))
	fmt.Fprintf(&b, "\nA command costs intake (a KV read of the command id, a KV read and a compare-and-set of the desired state, a KV put of the command id, a work publish, a result publish, an ack) and execution (a KV read, provider calls, two or three state events each after a last-message read, a result publish, an ack): about ten JetStream writes and reads, of which six are stored writes. Commands run concurrently (intake 64 at a time, execution 32 per host), so their writes overlap and the ratio is better than one in ten.\n")
	fmt.Print(b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			log.Fatal(err)
		}
	}
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

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
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

func commands(ctx context.Context, url, dir string, n int) (create, del time.Duration) {
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
	if _, err := (worker.Topology{Subjects: subj}).Setup(ctx, wjs); err != nil {
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
	run := func(op string) time.Duration {
		var mu sync.Mutex
		pending := map[string]bool{}
		done := make(chan struct{})
		sub, err := nc.Subscribe(subj.ResultAll(), func(m *nats.Msg) {
			var r messages.Result
			if json.Unmarshal(m.Data, &r) != nil || r.Outcome != messages.OutcomeDone || r.Op != op {
				return
			}
			mu.Lock()
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
		return time.Since(start)
	}
	return run(messages.OpCreate), run(messages.OpDelete)
}
