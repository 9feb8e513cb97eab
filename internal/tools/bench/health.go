package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Sizes of the health section.
const (
	rotationProxies = 500  // proxies whose way into the rotation is timed
	rotationWriters = 4    // goroutines publishing their running events
	rotationPace    = 8    // ms between two events of one writer: 500 events/s in all
	probeProxies    = 5000 // listeners probed for probe_ratio
	probeRounds     = 2    // rounds of probes (and of connects) counted per run
)

// runHealth measures the health process: how long a running event takes to
// reach the rotation's feed (probes passing), and how fast it
// probes 5,000 loopback proxies against plain TCP connects to them.
func runHealth(ctx context.Context, b *bench) (sectionResult, error) {
	nofile := raiseNofile()
	if path := os.Getenv("BENCH_HEALTH_CPUPROFILE"); path != "" {
		// For finding causes: a CPU profile of the whole section.
		f, err := os.Create(path)
		if err != nil {
			return sectionResult{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return sectionResult{}, err
		}
		defer pprof.StopCPUProfile()
	}
	pl, err := startProbeListeners(probeProxies)
	if err != nil {
		return sectionResult{}, err
	}
	defer pl.close()

	var p99s, p50s, maxes, ratios, ours, peers []float64
	var okShare, ack50s, ack99s, nosync50s, nosync99s, late99s []float64
	var loads []string
	var alls, cpuRatios, ourCPUs, peerCPUs, puts []float64
	for i := range b.runs {
		loads = append(loads, loadAvg())
		lat, ack, late, err := rotationRun(ctx, b, i, pl.addrs[:rotationProxies], true)
		if err != nil {
			return sectionResult{}, fmt.Errorf("rotation run %d: %w", i+1, err)
		}
		latNS, _, _, err := rotationRun(ctx, b, i, pl.addrs[:rotationProxies], false)
		if err != nil {
			return sectionResult{}, fmt.Errorf("rotation run %d without fsync: %w", i+1, err)
		}
		late99s = append(late99s, ms(percentile(late, 0.99)))
		ack50s = append(ack50s, ms(percentile(ack, 0.5)))
		ack99s = append(ack99s, ms(percentile(ack, 0.99)))
		nosync99s = append(nosync99s, ms(percentile(latNS, 0.99)))
		nosync50s = append(nosync50s, ms(percentile(latNS, 0.5)))
		p99s = append(p99s, ms(percentile(lat, 0.99)))
		p50s = append(p50s, ms(percentile(lat, 0.5)))
		maxes = append(maxes, ms(slices.Max(lat)))
		b.log.Printf("health run %d: rotation p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d proxies", i+1, p50s[i], p99s[i], maxes[i], len(lat))

		peer1, peerCPU1, err := tcpConnectRate(ctx, pl.addrs, 64, probeRounds*len(pl.addrs))
		if err != nil {
			return sectionResult{}, err
		}
		rate, ok, all, ourCPU, put, err := probeRun(ctx, b, i, pl.addrs)
		if err != nil {
			return sectionResult{}, fmt.Errorf("probe run %d: %w", i+1, err)
		}
		peer2, peerCPU2, err := tcpConnectRate(ctx, pl.addrs, 64, probeRounds*len(pl.addrs))
		if err != nil {
			return sectionResult{}, err
		}
		peer := (peer1 + peer2) / 2
		ours = append(ours, rate)
		peers = append(peers, peer)
		ratios = append(ratios, rate/peer)
		okShare = append(okShare, ok)
		alls = append(alls, all.Seconds())
		puts = append(puts, ms(put))
		cpuRatios = append(cpuRatios, (peerCPU1+peerCPU2)/2/ourCPU)
		ourCPUs = append(ourCPUs, ourCPU)
		peerCPUs = append(peerCPUs, (peerCPU1+peerCPU2)/2)
		b.log.Printf("health run %d: %.0f probes/s (%.1f%% passing), TCP connects %.0f/s before, %.0f/s after: ratio %.2f; CPU per probe %.0f µs, per connect %.0f, %.0f µs: ratio %.2f; %d proxies all in the bucket after %.1f s; a put %.2f ms",
			i+1, rate, 100*ok, peer1, peer2, rate/peer, ourCPU, peerCPU1, peerCPU2, cpuRatios[len(cpuRatios)-1], len(pl.addrs), all.Seconds(), ms(put))
	}
	rot := figure{
		Key: "rotation_p99_ms", Value: median(p99s), Unit: "ms", Target: atMost(50), Runs: p99s,
		Ours: fmt.Sprintf("p99 %.1f ms, p50 %.1f ms, max %.1f ms (medians over runs)", median(p99s), median(p50s), median(maxes)),
		Peer: "—",
		How: fmt.Sprintf("one embedded nats-server (file store, sync_always, as `serve` runs it) set up as `proxyfleet setup` does; one health process (health.Run with the defaults of `serve`: interval 2s, rise 2, fall 3, concurrency 64; probe target its own /probe on 127.0.0.1); "+
			"%d loopback proxy listeners that pass the probe (each reads the forward-proxy request for the /probe target and answers 200 with its nonce, as a proxy forwarding to /probe would); "+
			"%d writers publish a `running` state event (messages.StateEvent on <prefix>.state.<id>, JetStream publish, with the listener's address) every %d ms each; "+
			"for each proxy, the time from just before its event's publish to the first message of the rotation's feed (<prefix>.rotation.changes) that holds it. p99 over the %d proxies, median over runs.",
			rotationProxies, rotationWriters, rotationPace, rotationProxies),
		Bound: fmt.Sprintf("stored writes and the wait for a CPU. On the way into the rotation a proxy waits for three stored writes one after another (its event; the publisher's lease renewal, whose revision is the message's version and which proves it still holds the lease before it writes; its bucket put, up to 32 at a time, which the stream stores one after another), and, when it arrives during a publish, for the rest of that one first; every step also waits for a CPU. "+
			"In the same runs one stored write (an event's publish, acknowledged) took p50 %.1f ms, p99 %.1f ms, and a 1 ms sleep woke up to %.1f ms late (p99), with a load average of %s on %d cores (medians over runs; other work shared the machine). "+
			"The same measurement on a server that does not fsync each write (sync_always off): p50 %.1f ms, p99 %.1f ms.",
			median(ack50s), median(ack99s), median(late99s), strings.Join(loads, ", "), runtime.NumCPU(), median(nosync50s), median(nosync99s)),
	}
	pr := figure{
		Key: "probe_ratio", Value: median(ratios), Unit: "ratio", Target: atLeast(0.5), Runs: ratios,
		Ours: fmt.Sprintf("%.0f probes/s (median; %.1f%% passing); %.0f µs of CPU per probe against %.0f per connect (ratio %.2f)", median(ours), 100*median(okShare), median(ourCPUs), median(peerCPUs), median(cpuRatios)),
		Peer: fmt.Sprintf("plain TCP connect+close %.0f/s", median(peers)),
		How: fmt.Sprintf("%d loopback listeners (as above; RLIMIT_NOFILE %s). Ours: a health process as above with %d proxies running at those listeners, interval 500ms so rounds follow one another (a round of %d takes longer; the default concurrency of 64), "+
			"probes per second counted from its probe counters over %d rounds once every proxy has risen. Peer: 64 goroutines doing net.Dial to the same listeners and closing, %d connects in all, once before and once after ours (the mean). "+
			"The listeners' side is the same code for both: accept, read the request head (EOF for the peer), answer. "+
			"Since other work shares the machine, the bench process's CPU time (getrusage) per probe and per connect over the same windows is given too: its ratio does not move with the load.",
			probeProxies, nofile, probeProxies, probeProxies, probeRounds, probeRounds*probeProxies),
	}
	notes := fmt.Sprintf("%d running events published at once (async JetStream publishes, acknowledged in batches of 1,000) to the health process of `probe_ratio` took %s s (per run) from the first publish until all %d were in %s: folded, probed twice each through their listeners, and written to the bucket. "+
		"What bounds it is the bucket's stream, which stores (and, with sync_always, fsyncs) one put after another however many are in flight: on the same server, 1,000 puts into a scratch file bucket, 32 in flight as health writes them, took %s ms each (per run), so %d puts take at least %s s.\n",
		probeProxies, joinFloats(alls, "%.1f"), probeProxies, messages.BucketRotation, joinFloats(puts, "%.2f"), probeProxies, joinFloats(scale(puts, probeProxies/1000.0), "%.1f"))
	return sectionResult{figures: []figure{rot, pr}, notes: notes}, nil
}

func joinFloats(vs []float64, format string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(out, ", ")
}

func scale(vs []float64, k float64) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = v * k
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile p (0..1) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// raiseNofile raises the soft RLIMIT_NOFILE to the hard limit and says what
// it is.
func raiseNofile() string {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return "unknown"
	}
	l.Cur = l.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return strconv.FormatUint(l.Cur, 10)
}

// healthServer is an embedded server set up as `proxyfleet setup` does,
// with a health process running on it.
type healthServer struct {
	s    *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	h    *health.Health
	stop func()
}

func startHealth(ctx context.Context, dir string, fsync bool, cfg health.Config) (*healthServer, error) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, SyncAlways: fsync})
	if err != nil {
		return nil, err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats-server not ready")
	}
	nc, js := connect(s.ClientURL())
	if _, err := (topology.Topology{Subjects: cfg.Subjects}).Setup(ctx, js); err != nil {
		nc.Close()
		s.Shutdown()
		return nil, err
	}
	hnc, hjs := connect(s.ClientURL())
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.ProbeListen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := health.New(hjs, cfg)
	if err != nil {
		hnc.Close()
		nc.Close()
		s.Shutdown()
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- h.Run(hctx) }()
	hs := &healthServer{s: s, nc: nc, js: js, h: h}
	hs.stop = func() {
		cancel()
		<-ran
		hnc.Close()
		nc.Close()
		s.Shutdown()
	}
	select {
	case <-h.CaughtUp():
	case err := <-ran:
		cancel()
		hnc.Close()
		nc.Close()
		s.Shutdown()
		return nil, fmt.Errorf("health stopped: %v", err)
	}
	// Wait for the lease and its first message (which lists nothing: a
	// reset): only its holder publishes, each change after that one.
	deadline := time.Now().Add(30 * time.Second)
	for !h.Holder() || h.Metrics().FeedResets == 0 {
		if time.Now().After(deadline) {
			hs.stop()
			return nil, errors.New("health never took the lease")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return hs, nil
}

func runningEvent(id, addr string) (messages.StateEvent, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return messages.StateEvent{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return messages.StateEvent{}, err
	}
	return messages.StateEvent{V: messages.Version, ID: id, State: messages.StateRunning, Host: "h1", IP: host, Port: p,
		Source: "bench", CommandID: "create-" + id, Seq: 1, At: time.Now().UTC()}, nil
}

// rotationRun times, for each proxy, its running event's publish to the
// first message of the rotation's feed that holds it.
//
// With fsync (as `serve` runs its server) every stored write is fsync'd
// before it is acknowledged; without, the same run shows what the disk's
// syncs cost. It also returns the latencies of the events' publishes (one
// stored write each, acknowledged) and how late a 1 ms sleep woke meanwhile.
func rotationRun(ctx context.Context, b *bench, run int, addrs []string, fsync bool) (lat, ack, lateness []time.Duration, err error) {
	subj := messages.NewSubjects("")
	hs, err := startHealth(ctx, filepath.Join(b.dir, fmt.Sprintf("rot%d-%v", run, fsync)), fsync, health.Config{Subjects: subj})
	if err != nil {
		return nil, nil, nil, err
	}
	defer hs.stop()

	n := len(addrs)
	sent := make([]time.Time, n)
	acked := make([]time.Time, n)
	seen := make([]time.Time, n)
	var mu sync.Mutex
	left := n
	done := make(chan struct{})
	idx := func(id string) int {
		i, err := strconv.Atoi(strings.TrimPrefix(id, "r"))
		if err != nil || i < 0 || i >= n {
			return -1
		}
		return i
	}
	// The feed carries every change as it is published (the snapshot
	// subject, <prefix>.rotation, at most one a second).
	sub, err := hs.nc.Subscribe(subj.RotationChanges(), func(m *nats.Msg) {
		at := time.Now()
		var feed messages.RotationChanges
		if json.Unmarshal(m.Data, &feed) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, c := range feed.Changes {
			if i := idx(c.ID); c.Proxy != nil && i >= 0 && seen[i].IsZero() {
				seen[i] = at
				if left--; left == 0 {
					close(done)
				}
			}
		}
	})
	if err != nil {
		return nil, nil, nil, err
	}
	defer sub.Unsubscribe()
	if err := hs.nc.Flush(); err != nil {
		return nil, nil, nil, err
	}

	lateDone := make(chan []time.Duration, 1)
	stopLate := make(chan struct{})
	go func() { lateDone <- sleepLateness(stopLate) }()
	errc := make(chan error, rotationWriters)
	for w := range rotationWriters {
		go func() {
			t := time.NewTicker(rotationPace * time.Millisecond)
			defer t.Stop()
			for i := w; i < n; i += rotationWriters {
				id := fmt.Sprintf("r%04d", i)
				ev, err := runningEvent(id, addrs[i])
				if err != nil {
					errc <- err
					return
				}
				body, _ := json.Marshal(ev)
				mu.Lock()
				sent[i] = time.Now()
				mu.Unlock()
				if _, err := hs.js.Publish(ctx, subj.State(id), body); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				acked[i] = time.Now()
				mu.Unlock()
				select {
				case <-t.C:
				case <-ctx.Done():
					errc <- ctx.Err()
					return
				}
			}
			errc <- nil
		}()
	}
	var writersErr error
	for range rotationWriters {
		if err := <-errc; err != nil && writersErr == nil {
			writersErr = err
		}
	}
	if writersErr != nil {
		close(stopLate)
		<-lateDone
		return nil, nil, nil, writersErr
	}
	select {
	case <-done:
		close(stopLate)
		late := <-lateDone
		mu.Lock()
		lateness = late
		mu.Unlock()
	case <-time.After(2 * time.Minute):
		close(stopLate)
		<-lateDone
		mu.Lock()
		defer mu.Unlock()
		return nil, nil, nil, fmt.Errorf("%d of %d proxies not in a published rotation after 2 minutes", left, n)
	case <-ctx.Done():
		close(stopLate)
		<-lateDone
		return nil, nil, nil, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	lat = make([]time.Duration, n)
	ack = make([]time.Duration, n)
	for i := range n {
		lat[i] = seen[i].Sub(sent[i])
		ack[i] = acked[i].Sub(sent[i])
	}
	b.log.Printf("health run %d (fsync %v): event publish acked p50 %.1f ms p99 %.1f ms; %d versions published; a 1 ms sleep woke late by p50 %.2f ms, p99 %.1f ms",
		run+1, fsync, ms(percentile(ack, 0.5)), ms(percentile(ack, 0.99)), hs.h.Metrics().Published, ms(percentile(lateness, 0.5)), ms(percentile(lateness, 0.99)))
	return lat, ack, lateness, nil
}

// sleepLateness samples, until stop is closed, how late a 1 ms sleep
// wakes: the wait for a CPU that every step of the measured path pays.
func sleepLateness(stop <-chan struct{}) []time.Duration {
	var out []time.Duration
	for {
		select {
		case <-stop:
			return out
		default:
		}
		t := time.Now()
		time.Sleep(time.Millisecond)
		out = append(out, max(0, time.Since(t)-time.Millisecond))
	}
}
