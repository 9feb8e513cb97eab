package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// probeRun puts a proxy at every address in the rotation of a health
// process probing in back-to-back rounds, and returns its probes per second
// once all have risen, and the share of them that passed.
//
// It also returns how long the proxies took, from the first event's
// publish, to be all in PROXY_ROTATION.
func probeRun(ctx context.Context, b *bench, run int, addrs []string) (rate, ok float64, all time.Duration, cpuPerOp float64, put time.Duration, err error) {
	subj := messages.NewSubjects("")
	hs, err := startHealth(ctx, filepath.Join(b.dir, fmt.Sprintf("probe%d", run)), true, health.Config{Subjects: subj, Interval: 500 * time.Millisecond})
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer hs.stop()
	start := time.Now()
	for i, a := range addrs {
		id := fmt.Sprintf("q%05d", i)
		ev, err := runningEvent(id, a)
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		body, _ := json.Marshal(ev)
		if _, err := hs.js.PublishAsync(subj.State(id), body); err != nil {
			return 0, 0, 0, 0, 0, err
		}
		if (i+1)%1000 == 0 || i == len(addrs)-1 {
			select {
			case <-hs.js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				return 0, 0, 0, 0, 0, errors.New("events not acknowledged after a minute")
			}
		}
	}
	bucket, err := hs.js.Stream(ctx, "KV_"+messages.BucketRotation)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		info, err := bucket.Info(ctx)
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		if info.State.Msgs >= uint64(len(addrs)) {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, 0, 0, 0, fmt.Errorf("%d of %d proxies in %s after 3 minutes", info.State.Msgs, len(addrs), messages.BucketRotation)
		}
		time.Sleep(20 * time.Millisecond)
	}
	all = time.Since(start)
	count := func() (all, passed uint64) {
		for r, n := range hs.h.Metrics().Probes {
			all += n
			if r == health.ResultOK {
				passed += n
			}
		}
		return all, passed
	}
	c0, p0 := count()
	t0, cpu0 := time.Now(), cpuTime()
	want := uint64(probeRounds * len(addrs))
	for {
		c, p := count()
		if c-c0 >= want {
			d := time.Since(t0)
			cpu := float64((cpuTime() - cpu0).Microseconds()) / float64(c-c0)
			put, err := putCost(ctx, hs.js)
			if err != nil {
				return 0, 0, 0, 0, 0, err
			}
			return float64(c-c0) / d.Seconds(), float64(p-p0) / float64(c-c0), all, cpu, put, nil
		}
		if time.Since(t0) > 3*time.Minute {
			return 0, 0, 0, 0, 0, fmt.Errorf("%d probes in 3 minutes", c-c0)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// putCost is the wall time per put of 1,000 puts, 32 in flight as health
// writes the bucket, into a scratch file bucket on the same server.
func putCost(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BENCH_SCRATCH", Storage: jetstream.FileStorage})
	if err != nil {
		return 0, err
	}
	defer func() { _ = js.DeleteKeyValue(ctx, "BENCH_SCRATCH") }()
	const n = 1000
	var next atomic.Int64
	var g errgroup.Group
	start := time.Now()
	for range 32 {
		g.Go(func() error {
			for i := next.Add(1); i <= n; i = next.Add(1) {
				if _, err := kv.PutString(ctx, fmt.Sprintf("p%05d", i), "127.0.0.1:3128"); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return time.Since(start) / n, nil
}

// tcpConnectRate is the peer of probe_ratio: conc goroutines each connect
// to the next address and close, total times; it returns connects per
// second and the bench process's CPU time per connect (µs).
func tcpConnectRate(ctx context.Context, addrs []string, conc, total int) (rate, cpuPerOp float64, err error) {
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: -1}
	start, cpu0 := time.Now(), cpuTime()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= total || ctx.Err() != nil {
					return
				}
				c, err := d.DialContext(ctx, "tcp", addrs[i%len(addrs)])
				if err != nil {
					failed.Add(1)
					continue
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	el, cpu := time.Since(start), cpuTime()-cpu0
	if f := failed.Load(); f > 0 {
		return 0, 0, fmt.Errorf("tcp connect loop: %d of %d connects failed", f, total)
	}
	return float64(total) / el.Seconds(), float64(cpu.Microseconds()) / float64(total), ctx.Err()
}

// probeListeners are loopback listeners that pass a health probe: each
// reads a forward-proxy request (GET with an absolute URI to the /probe
// target) and answers 200 with its nonce, as a proxy forwarding it to the
// target would. A connection that sends nothing (the TCP peer) is closed
// at EOF.
type probeListeners struct {
	lns   []net.Listener
	addrs []string
	wg    sync.WaitGroup
}

func startProbeListeners(n int) (*probeListeners, error) {
	pl := &probeListeners{}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			pl.close()
			return nil, fmt.Errorf("listener %d of %d: %w", len(pl.lns)+1, n, err)
		}
		pl.lns = append(pl.lns, ln)
		pl.addrs = append(pl.addrs, ln.Addr().String())
		pl.wg.Add(1)
		go func() {
			defer pl.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				pl.wg.Add(1)
				go func() {
					defer pl.wg.Done()
					serveProbe(c)
				}()
			}
		}()
	}
	return pl, nil
}

func (pl *probeListeners) close() {
	for _, ln := range pl.lns {
		ln.Close()
	}
	pl.wg.Wait()
}

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

func serveProbe(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := readers.Get().(*bufio.Reader)
	r.Reset(c)
	defer func() { r.Reset(nil); readers.Put(r) }()
	line, err := r.ReadString('\n')
	if err != nil {
		return // the TCP peer: connected and closed
	}
	for {
		h, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		if len(h) <= 2 {
			break
		}
	}
	status, body := "400 Bad Request", "want GET http://host/probe?nonce=N\n"
	if f := strings.Fields(line); len(f) == 3 && f[0] == "GET" {
		if u, err := url.Parse(f[1]); err == nil && u.IsAbs() && u.Path == health.ProbePath {
			if nonce := u.Query().Get(health.NonceParam); nonce != "" {
				status, body = "200 OK", nonce+"\n"
			}
		}
	}
	fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
}
