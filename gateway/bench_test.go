package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// BenchmarkGateway: plain requests per second through the gateway over a
// loopback upstream proxy, against the same client straight to that
// proxy; and new CONNECT tunnels per second (one request each).
func BenchmarkGateway(b *testing.B) {
	up := newUpstream(b, "p1", "")
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(b, pk, func(c *Config) { c.Logger = slog.New(slog.DiscardHandler) })
	tg := newTarget(b, false)

	run := func(b *testing.B, proxyURL *url.URL, keepAlive bool) {
		tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 16}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			resp, err := c.Get(tg.srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatal(resp.StatusCode)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	}
	direct := &url.URL{Scheme: "http", Host: up.addr(), User: url.UserPassword(fleetUser, fleetPass)}
	via := &url.URL{Scheme: "http", Host: g.Addr(), User: url.UserPassword("alice", alicePass)}
	b.Run("plain/direct", func(b *testing.B) { run(b, direct, true) })
	b.Run("plain/gateway", func(b *testing.B) { run(b, via, true) })

	tunnel := func(b *testing.B, addr, auth string) {
		target := tg.srv.Listener.Addr().String()
		req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nProxy-Authorization: " + auth + "\r\n\r\n" +
			"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.WriteString(c, req)
			out, _ := io.ReadAll(c)
			c.Close()
			if !bytes.Contains(out, []byte("hello from target")) {
				b.Fatalf("%q", out)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tunnels/s")
	}
	b.Run("connect/direct", func(b *testing.B) { tunnel(b, up.addr(), basic(fleetUser, fleetPass)) })
	b.Run("connect/gateway", func(b *testing.B) { tunnel(b, g.Addr(), basic("alice", alicePass)) })
}

// bareUpstream answers every CONNECT 200 and then holds the connection
// with no goroutine of its own, so what a test measures is the gateway.
type bareUpstream struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newBareUpstream(tb testing.TB) *bareUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	u := &bareUpstream{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(u.done)
		buf := make([]byte, 4096)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if readHeader(c, buf) != nil {
				c.Close()
				continue
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		<-u.done
		u.mu.Lock()
		for _, c := range u.conns {
			c.Close()
		}
		u.mu.Unlock()
	})
	return u
}

// readHeader reads up to the end of an HTTP header (no further: the
// peers here send nothing after it).
func readHeader(c net.Conn, buf []byte) error {
	n := 0
	for !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		if n == len(buf) {
			return fmt.Errorf("header too long")
		}
		k, err := c.Read(buf[n:])
		if err != nil {
			return err
		}
		n += k
	}
	return nil
}

// raiseFiles lifts the descriptor limit for n tunnels (4 descriptors
// each in this process: the gateway's two sockets, the client's and the
// upstream's), if it can.
func raiseFiles(tb testing.TB, n int) {
	want := uint64(4*n + 1000)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		tb.Fatal(err)
	}
	if rl.Cur >= want {
		return
	}
	old := rl
	rl.Cur = want
	rl.Max = max(rl.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		tb.Fatalf("raise the descriptor limit to %d (from %d/%d) for %d tunnels: %v", want, old.Cur, old.Max, n, err)
	}
	tb.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

// state reads the tracker: how many things run (handlers, handshakes,
// each tunnel's two pumps) and how many client connections are still
// with a handler (tracked until their handler returns).
func (t *tracker) state() (running, handled int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		if _, ok := c.(*clientConn); ok {
			handled++
		}
	}
	return t.n, handled
}

// idleCost is what n idle tunnels cost, per tunnel.
type idleCost struct {
	heapStack  float64 // HeapInuse + StackInuse, bytes per tunnel
	sys        float64 // what the Go runtime took from the OS
	rss        float64
	goroutines float64
	fds        float64 // descriptors of this process per tunnel
}

func (c idleCost) String() string {
	return fmt.Sprintf("heap+stack %.0f B, runtime sys %.0f B, RSS %.0f B, %.2f goroutines, %.2f descriptors (the gateway's 2, the client's and upstream's 1 each) per idle tunnel", c.heapStack, c.sys, c.rss, c.goroutines, c.fds)
}

// measureIdleTunnels opens n CONNECT tunnels through a gateway to a
// bare upstream, leaves them idle, and measures the process before and
// after. The figure includes the client's and the upstream's socket
// objects (no goroutine, no buffer), a few hundred bytes a tunnel.
func measureIdleTunnels(tb testing.TB, n int) idleCost {
	raiseFiles(tb, n)
	up := newBareUpstream(tb)
	pk := newPicker(Proxy{ID: "p1", Addr: up.ln.Addr().String()})
	g := startGateway(tb, pk, func(c *Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		c.Users[0].MaxConns = n + 100
	})
	req := []byte("CONNECT 192.0.2.1:443 HTTP/1.1\r\nHost: 192.0.2.1:443\r\nProxy-Authorization: " + basic("alice", alicePass) + "\r\n\r\n")
	buf := make([]byte, 512)
	clients := make([]net.Conn, 0, n)
	tb.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	open := func() {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			tb.Fatal(err)
		}
		clients = append(clients, c)
		if _, err := c.Write(req); err != nil {
			tb.Fatal(err)
		}
		if err := readHeader(c, buf); err != nil {
			tb.Fatal(err)
		}
		if !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
			tb.Fatalf("%q", bytes.TrimRight(buf, "\x00"))
		}
	}
	// Warm up (pools, the server's first allocations).
	for range 50 {
		open()
	}
	// settle waits until the k tunnels opened so far are idle, then
	// measures. A client has its 200 before the upstream has recorded its
	// connection and before the gateway's handler has handed the tunnel
	// to its pumps and returned: idle is the upstream holding k, no
	// client connection left with a handler, and two pumps running for
	// each tunnel (what the tracker counts: tunnel.run and its copy).
	settle := func(k int) (runtime.MemStats, uint64, int, int) {
		poll.Until(tb, fmt.Sprintf("%d idle tunnels", k), 30*time.Second, func() bool {
			up.mu.Lock()
			held := len(up.conns)
			up.mu.Unlock()
			running, handled := g.track.state()
			return held == k && handled == 0 && running == 2*k
		})
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fds, _ := os.ReadDir("/proc/self/fd")
		return ms, rssBytes(), runtime.NumGoroutine(), len(fds)
	}
	before, rss0, gr0, fd0 := settle(50)
	for range n {
		open()
	}
	after, rss1, gr1, fd1 := settle(n + 50)
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	cost := idleCost{
		heapStack:  per(after.HeapInuse+after.StackInuse, before.HeapInuse+before.StackInuse),
		sys:        per(after.Sys, before.Sys),
		rss:        per(rss1, rss0),
		goroutines: float64(gr1-gr0) / float64(n),
		fds:        float64(fd1-fd0) / float64(n),
	}
	// The tunnels work: a byte through the last one reaches the upstream.
	if _, err := clients[len(clients)-1].Write([]byte("x")); err != nil {
		tb.Fatal(err)
	}
	up.mu.Lock()
	last := up.conns[len(up.conns)-1]
	up.mu.Unlock()
	_ = last.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(last, buf[:1]); err != nil || buf[0] != 'x' {
		tb.Fatalf("a byte through an idle tunnel: %v", err)
	}
	if len(up.conns) != n+50 {
		tb.Fatalf("upstream holds %d tunnels, want %d", len(up.conns), n+50)
	}
	return cost
}

// TestIdleTunnelMemory: an idle tunnel costs the gateway under 20 KiB
// (two small goroutines and two sockets; no buffer of ours, the HTTP
// server's dropped). Under the race detector, whose shadow memory
// multiplies it, the figure is only logged.
func TestIdleTunnelMemory(t *testing.T) {
	cost := measureIdleTunnels(t, 1000)
	t.Logf("1000 idle tunnels: %s", cost)
	// No pipe is held while idle (pump): 4 descriptors.
	if cost.fds > 4.05 {
		t.Errorf("an idle tunnel holds %.2f descriptors; want 4", cost.fds)
	}
	if raceEnabled {
		return
	}
	if cost.heapStack > 20<<10 || cost.goroutines > 2.05 {
		t.Fatalf("an idle tunnel costs %s; want under 20 KiB and 2 goroutines", cost)
	}
}

// BenchmarkIdleTunnels holds IDLE_TUNNELS (default 10,000) idle CONNECT
// tunnels and reports their cost per tunnel (run with -benchtime=1x).
// In one process they need 4 descriptors each: 10,000 needs a limit
// above 41,000.
func BenchmarkIdleTunnels(b *testing.B) {
	n := 10000
	if s := os.Getenv("IDLE_TUNNELS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		cost := measureIdleTunnels(b, n)
		b.Logf("%d idle tunnels: %s", n, cost)
		b.ReportMetric(cost.heapStack, "heap+stack-B/tunnel")
		b.ReportMetric(cost.rss, "rss-B/tunnel")
		b.ReportMetric(cost.sys, "sys-B/tunnel")
		b.ReportMetric(cost.goroutines, "goroutines/tunnel")
		b.ReportMetric(cost.fds, "fds/tunnel")
	}
}
