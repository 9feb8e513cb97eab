package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkConnectTunnels opens new CONNECT tunnels, 8 clients at once,
// each carrying an exchange shaped like a TLS handshake and one request
// (a few small bursts each way), straight to a lean upstream proxy and
// through the gateway in front of it. Besides the rate it reports the
// whole process's CPU per tunnel (cpu-µs/op, getrusage): the gateway's
// share is the difference of the two (as is that of allocs/op), much
// less sensitive to the machine's load than the rate.
func BenchmarkConnectTunnels(b *testing.B) {
	tg := newExchangeTarget(b)
	up := newLeanUpstream(b)
	pk := newPicker(Proxy{ID: "p1", Addr: up.addr()})
	g := startGateway(b, pk, func(c *Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		c.Users[0].MaxConns = 1000
	})
	b.Run("direct", func(b *testing.B) { runTunnels(b, tg, up.addr(), basic(fleetUser, fleetPass), nil) })
	b.Run("gateway", func(b *testing.B) { runTunnels(b, tg, g.Addr(), basic("alice", alicePass), nil) })
}

// BenchmarkConnectTunnelsProcess is BenchmarkConnectTunnels/gateway with
// the gateway in a process of its own (this test binary, running
// TestConnectBenchGateway), whose CPU per tunnel it reports
// (gateway-cpu-µs/op): the gateway's cost alone. With
// PROXYFLEET_BENCH_GATEWAY_PROFILE=<file> the gateway's process writes
// its CPU profile there.
func BenchmarkConnectTunnelsProcess(b *testing.B) {
	tg := newExchangeTarget(b)
	up := newLeanUpstream(b)
	addr, cpu := startGatewayProcess(b, up.addr())
	runTunnels(b, tg, addr, basic("alice", alicePass), cpu)
}

// BenchmarkTunnelBulkProcess reads b.N MiB from a source sending zeros
// through one tunnel of a gateway in a process of its own (as
// BenchmarkConnectTunnelsProcess), in reads of 64 KiB, and reports the
// gateway's CPU per MiB (gateway-cpu-µs/op).
func BenchmarkTunnelBulkProcess(b *testing.B) {
	src := serveAddr(b, func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	up := newLeanUpstream(b)
	addr, cpu := startGatewayProcess(b, up.addr())
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	if _, err := io.WriteString(c, "CONNECT "+src+" HTTP/1.1\r\nHost: "+src+"\r\nProxy-Authorization: "+basic("alice", alicePass)+"\r\n\r\n"); err != nil {
		b.Fatal(err)
	}
	if err := readHeader(c, buf); err != nil || !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
		b.Fatalf("CONNECT: %v %q", err, buf[:min(len(buf), 64)])
	}
	g0 := cpu()
	start := time.Now()
	b.SetBytes(1 << 20)
	b.ResetTimer()
	if _, err := io.CopyBuffer(io.Discard, io.LimitReader(struct{ io.Reader }{c}, int64(b.N)<<20), buf); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "MiB/s")
	b.ReportMetric(float64((cpu()-g0).Microseconds())/float64(b.N), "gateway-cpu-µs/op")
}

// startGatewayProcess starts a gateway in front of the proxy at upAddr
// in a process of its own (this test binary, running
// TestConnectBenchGateway), and returns its address and a function
// returning its process's CPU time so far.
func startGatewayProcess(b testing.TB, upAddr string) (string, func() time.Duration) {
	args := []string{"-test.run=^TestConnectBenchGateway$"}
	if p := os.Getenv(benchProfileEnv); p != "" {
		args = append(args, "-test.cpuprofile="+p)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), benchUpstreamEnv+"="+upAddr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	// next is the value of the child's next line starting with key.
	next := func(key string) string {
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), key+" "); ok {
				return v
			}
		}
		b.Fatalf("the gateway process ended before %q: %v", key, lines.Err())
		return ""
	}
	addr := next("addr")
	return addr, func() time.Duration {
		if _, err := io.WriteString(in, "cpu\n"); err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseInt(next("cpu"), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(ns)
	}
}

// benchUpstreamEnv names the upstream of TestConnectBenchGateway;
// benchProfileEnv, when set, is where it writes its CPU profile.
const (
	benchUpstreamEnv = "PROXYFLEET_BENCH_GATEWAY_UPSTREAM"
	benchProfileEnv  = "PROXYFLEET_BENCH_GATEWAY_PROFILE"
)

// TestConnectBenchGateway is, in the process startGatewayProcess starts
// (benchUpstreamEnv set), the benchmarks' gateway: it prints "addr <its
// address>", then answers each line "cpu" on stdin with "cpu <its
// process's CPU time in ns>" until stdin closes. Run as a test, it checks
// that process: it carries a tunnel to its upstream and reports CPU time
// that does not go back.
func TestConnectBenchGateway(t *testing.T) {
	upAddr := os.Getenv(benchUpstreamEnv)
	if upAddr == "" {
		checkBenchGatewayProcess(t)
		return
	}
	pk := newPicker(Proxy{ID: "p1", Addr: upAddr})
	g := startGateway(t, pk, func(c *Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		c.Users[0].MaxConns = 1000
	})
	fmt.Printf("addr %s\n", g.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Printf("cpu %d\n", processCPU().Nanoseconds())
	}
}

// checkBenchGatewayProcess starts the benchmarks' gateway process in
// front of a lean upstream and sends one tunnel through it.
func checkBenchGatewayProcess(t *testing.T) {
	// The source answers once the client spoke, so the tunnel's bytes
	// never share a read with the CONNECT's answer.
	src := serveAddr(t, func(c net.Conn) {
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
			_, _ = io.WriteString(c, "hello")
		}
	})
	up := newLeanUpstream(t)
	addr, cpu := startGatewayProcess(t, up.addr())
	c0 := cpu()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a bound for hangs only
	if _, err := io.WriteString(c, "CONNECT "+src+" HTTP/1.1\r\nHost: "+src+"\r\nProxy-Authorization: "+basic("alice", alicePass)+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if err := readHeader(c, buf); err != nil || !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
		t.Fatalf("CONNECT through the gateway process: %v %q", err, buf[:min(len(buf), 64)])
	}
	if _, err := io.WriteString(c, "x"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("through the tunnel: %q, %v; want hello", got, err)
	}
	if c1 := cpu(); c0 <= 0 || c1 < c0 {
		t.Errorf("the gateway process's CPU time went from %v to %v", c0, c1)
	}
}

// processCPU is the CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runTunnels opens b.N tunnels through the proxy at addr (auth: its
// Proxy-Authorization), 8 clients at once, and reports the rate and
// this process's CPU per tunnel; with cpu (the gateway's process's CPU
// time) also the gateway's CPU per tunnel.
func runTunnels(b *testing.B, tg *exchangeTarget, addr, auth string, cpu func() time.Duration) {
	req := []byte("CONNECT " + tg.addr() + " HTTP/1.1\r\nHost: " + tg.addr() + "\r\nProxy-Authorization: " + auth + "\r\n\r\n")
	b.SetParallelism(4) // 8 clients on 2 cores
	b.ReportAllocs()
	var g0 time.Duration
	if cpu != nil {
		g0 = cpu()
	}
	c0 := processCPU()
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		for pb.Next() {
			if err := exchangeOnce(addr, req, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tunnels/s")
	b.ReportMetric(float64((processCPU()-c0).Microseconds())/float64(b.N), "cpu-µs/op")
	if cpu != nil {
		b.ReportMetric(float64((cpu()-g0).Microseconds())/float64(b.N), "gateway-cpu-µs/op")
	}
}

// The exchange of one tunnel: what a TLS 1.3 handshake and one request
// send, roughly (the client's hello; the server's flight; the client's
// finished and request; the answer), then the target closes.
var exchange = []struct {
	up   int // bytes the client sends
	down int // bytes the target answers
}{{300, 2000}, {80, 0}, {120, 600}}

// exchangeOnce opens a tunnel through the proxy at addr with req,
// carries the exchange and waits for the target's close.
func exchangeOnce(addr string, req, buf []byte) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write(req); err != nil {
		return err
	}
	if err := readHeader(c, buf); err != nil {
		return err
	}
	if !bytes.HasPrefix(buf, []byte("HTTP/1.1 200")) {
		return io.ErrUnexpectedEOF
	}
	for _, x := range exchange {
		if _, err := c.Write(buf[:x.up]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf[:x.down]); err != nil {
			return err
		}
	}
	if n, _ := c.Read(buf[:1]); n != 0 {
		return io.ErrShortBuffer
	}
	return nil
}

// exchangeTarget answers each connection's exchange and closes it.
type exchangeTarget struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newExchangeTarget(tb testing.TB) *exchangeTarget {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	t := &exchangeTarget{ln: ln}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				defer c.Close()
				buf := make([]byte, 4096)
				for _, x := range exchange {
					if _, err := io.ReadFull(c, buf[:x.up]); err != nil {
						return
					}
					if _, err := c.Write(buf[:x.down]); err != nil {
						return
					}
				}
			}()
		}
	}()
	tb.Cleanup(func() { ln.Close(); t.wg.Wait() })
	return t
}

func (t *exchangeTarget) addr() string { return t.ln.Addr().String() }

// leanUpstream is a CONNECT-only forward proxy doing as little as it
// can (the same for both sides of the benchmark): it reads the head,
// dials the target, answers 200 and copies both ways with a buffer.
type leanUpstream struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newLeanUpstream(tb testing.TB) *leanUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	u := &leanUpstream{ln: ln}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				u.serve(c)
			}()
		}
	}()
	tb.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *leanUpstream) addr() string { return u.ln.Addr().String() }

func (u *leanUpstream) serve(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 4096)
	if readHeader(c, buf) != nil {
		return
	}
	line, _, _ := bytes.Cut(buf, []byte("\r\n"))
	f := bytes.Fields(line)
	if len(f) != 3 || string(f[0]) != "CONNECT" {
		return
	}
	t, err := net.Dial("tcp", string(f[1]))
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer t.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.CopyBuffer(struct{ io.Writer }{t}, struct{ io.Reader }{c}, make([]byte, 4096))
		_ = t.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{t}, buf)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
}
