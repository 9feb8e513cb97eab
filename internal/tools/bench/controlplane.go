package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
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

// runControlPlane measures, on one embedded nats-server, the raw
// JetStream synchronous publish rate (the peer) and the rate of create and
// delete commands through intake and execution on two sim hosts, b.runs
// times, each run on a fresh server.
func runControlPlane(ctx context.Context, b *bench) (sectionResult, error) {
	var ratios, delRatios, raws, creates []float64
	for i := range b.runs {
		raw, create, del, err := controlPlaneRun(ctx, b, i)
		if err != nil {
			return sectionResult{}, err
		}
		rawRate := float64(b.n) / raw.Seconds()
		raws = append(raws, rawRate)
		creates = append(creates, float64(b.n)/create.Seconds())
		ratios = append(ratios, float64(b.n)/create.Seconds()/rawRate)
		delRatios = append(delRatios, float64(b.n)/del.Seconds()/rawRate)
		b.log.Printf("control plane run %d: raw %.0f/s, create %.0f/s, delete %.0f/s", i+1, rawRate, float64(b.n)/create.Seconds(), float64(b.n)/del.Seconds())
	}
	f := figure{
		Key: "control_plane_ratio", Value: median(ratios), Unit: "ratio", Target: atLeast(0.4), Runs: ratios,
		Ours: fmt.Sprintf("%.0f creates/s (median; deletes %.2f of raw)", median(creates), median(delRatios)),
		Peer: fmt.Sprintf("raw JetStream sync publish %.0f/s", median(raws)),
		How:  fmt.Sprintf("one embedded nats-server (file store, sync_always true, as `serve` runs it), one worker with intake and execution of two sim hosts (no call delay), in one process; %d create commands published at once (async, with Nats-Msg-Id) until each has its `done` result, divided by the rate of %d synchronous JetStream publishes to a file stream on the same server, just before.", b.n, b.n),
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	notes := fmt.Sprintf("Memory of the bench process after the control-plane runs (server, worker, %d proxies created and deleted %d times): peak RSS %s, Go heap in use after a GC %.1f MiB.\n", b.n, b.runs, peakRSS(), float64(ms.HeapAlloc)/(1<<20))
	return sectionResult{figures: []figure{f}, notes: notes}, nil
}

// controlPlaneRun is one run on its own server and store.
func controlPlaneRun(ctx context.Context, b *bench, run int) (raw, create, del time.Duration, err error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("cp%d", run))
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true, SyncAlways: true})
	if err != nil {
		return 0, 0, 0, err
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		return 0, 0, 0, errors.New("nats-server not ready")
	}
	raw = rawPublish(ctx, s.ClientURL(), b.n)
	create, del = commands(ctx, s.ClientURL(), dir, b.n)
	return raw, create, del, nil
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
