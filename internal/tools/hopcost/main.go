// Command hopcost measures what one more process on a request's way
// costs: the bench's client, forward proxy and target (as the gateway
// section of internal/tools/bench sets them up) run in this process, and
// a child process carries the requests to the proxy. The child is one of
//
//	-hop gateway  package gateway over a fixed picker (the lean path)
//	-hop nethttp  a net/http forward proxy (server and Transport)
//	-hop io       a bare TCP relay, two goroutines and io.Copy a connection
//	-hop epoll    a bare TCP relay on an epoll loop of its own (one locked
//	              thread, raw non-blocking sockets, no Go poller)
//
// Each run prints the request rates straight to the proxy and through the
// child, and the CPU time per request of this process and of the child
// (getrusage, /proc): what bounds the bench's gateway_ratio. -prof writes
// the child's CPU profile (gateway and nethttp).
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"proxyfleet/deny"
	"proxyfleet/gateway"
)

const (
	fleetUser, fleetPass = "fleet", "hopcost-fleet-password"
	gwUser, gwPass       = "hop", "hopcost-gateway-password"
	clockTicks           = 100 // USER_HZ on Linux
)

func main() {
	hop := flag.String("hop", "gateway", "the child: gateway, nethttp, io or epoll")
	runs := flag.Int("runs", 3, "runs")
	dur := flag.Duration("d", 3*time.Second, "each side's time per run")
	clients := flag.Int("c", 8, "clients at once (the bench's 8)")
	prof := flag.String("prof", "", "write the child's CPU profile here")
	child := flag.String("child", "", "(internal) run as the child: listen address")
	up := flag.String("up", "", "(internal) the proxy's address")
	flag.Parse()
	log.SetFlags(0)
	if *child != "" {
		if err := runChild(*hop, *child, *up, *prof); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(*hop, *runs, *dur, *clients, *prof); err != nil {
		log.Fatal(err)
	}
}

func run(hop string, runs int, dur time.Duration, clients int, prof string) error {
	target, err := serveTarget()
	if err != nil {
		return err
	}
	proxy, err := serveProxy()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hopAddr := ln.Addr().String()
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-hop", hop, "-child", hopAddr, "-up", proxy, "-prof", prof)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", hopAddr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the child does not listen: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	direct := &url.URL{Scheme: "http", Host: proxy, User: url.UserPassword(fleetUser, fleetPass)}
	via := &url.URL{Scheme: "http", Host: hopAddr, User: url.UserPassword(gwUser, gwPass)}
	if hop == "io" || hop == "epoll" {
		via.User = direct.User // a bare relay passes the credential on
	}
	pid := cmd.Process.Pid
	for i := range runs {
		c0 := selfCPU()
		d, nd, err := rate(direct, target, clients, dur)
		if err != nil {
			return fmt.Errorf("straight: %w", err)
		}
		c1, h1 := selfCPU(), childCPU(pid)
		v, nv, err := rate(via, target, clients, dur)
		if err != nil {
			return fmt.Errorf("through %s: %w", hop, err)
		}
		c2, h2 := selfCPU(), childCPU(pid)
		perReq := func(d time.Duration, n int64) float64 { return float64(d.Microseconds()) / float64(n) }
		fmt.Printf("run %d, %s: %.0f req/s straight, %.0f through (ratio %.3f); CPU per request: this process %.1f µs straight, %.1f through; the %s process %.1f µs\n",
			i+1, hop, d, v, v/d, perReq(c1-c0, nd), perReq(c2-c1, nv), hop, perReq(h2-h1, nv))
	}
	return nil
}

// rate is the requests per second of clients clients through proxy for
// d, and how many they made.
func rate(proxy *url.URL, target string, clients int, d time.Duration) (float64, int64, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var n atomic.Int64
	var mu sync.Mutex
	var firstErr error
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := fetch(c, target); err != nil {
					mu.Lock()
					firstErr = cmp(firstErr, err)
					mu.Unlock()
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), n.Load(), firstErr
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func fetch(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childCPU is the CPU time (user and system) process pid has used.
func childCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// serveTarget is the bench's target: "ok" to every request.
func serveTarget() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = s.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/", nil
}

// serveProxy is the bench's forward proxy: the fleet's credential
// required, plain requests through an http.Transport.
func serveProxy() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s := &http.Server{Handler: forwarder(basic(fleetUser, fleetPass), &http.Transport{MaxIdleConnsPerHost: 64})}
	go func() { _ = s.Serve(ln) }()
	return ln.Addr().String(), nil
}

func basic(u, p string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p)) }

// forwarder forwards absolute-URI requests with credential want through
// tr, as the bench's proxy does.
func forwarder(want string, tr *http.Transport) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != want {
			w.Header().Set("Proxy-Authenticate", `Basic realm="hopcost"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Header.Del("Proxy-Authorization")
		out.Header.Del("Proxy-Connection")
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
}

// runChild serves as the hop until SIGTERM.
func runChild(hop, listen, up, prof string) error {
	if hop == "epoll" {
		return relayEpoll(listen, up) // SIGTERM ends it (no handler)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if prof != "" && (hop == "gateway" || hop == "nethttp") {
		f, err := os.Create(prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	switch hop {
	case "gateway":
		g, err := gateway.New(fixedPicker{gateway.Proxy{ID: "p1", Addr: up}}, gateway.Config{
			Listen: listen, Users: []gateway.User{{Name: gwUser, Password: gwPass, MaxConns: 20000}},
			UpstreamUser: fleetUser, UpstreamPassword: fleetPass,
			Logger: slog.New(slog.DiscardHandler),
			Deny:   &deny.List{}, // the target is on loopback, which the default list refuses
		})
		if err != nil {
			return err
		}
		return g.Run(ctx)
	case "nethttp":
		pu := &url.URL{Scheme: "http", Host: up, User: url.UserPassword(fleetUser, fleetPass)}
		s := &http.Server{Addr: listen, Handler: forwarder(basic(gwUser, gwPass), &http.Transport{Proxy: http.ProxyURL(pu), MaxIdleConnsPerHost: 64})}
		go func() {
			<-ctx.Done()
			s.Close()
		}()
		if err := s.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	case "io":
		return relayIO(ctx, listen, up)
	}
	return fmt.Errorf("-hop %q: want gateway, nethttp, io or epoll", hop)
}

// fixedPicker is a Picker over one proxy.
type fixedPicker struct{ p gateway.Proxy }

func (f fixedPicker) Pick(gateway.Selector) (gateway.Proxy, error) { return f.p, nil }
func (f fixedPicker) PickSession(string, gateway.Selector) (gateway.Proxy, error) {
	return f.p, nil
}
func (f fixedPicker) Acquire(gateway.Proxy) func()        { return func() {} }
func (f fixedPicker) Report(gateway.Proxy, string) error  { return nil }
func (f fixedPicker) Len() int                            { return 1 }
func (f fixedPicker) Get(id string) (gateway.Proxy, bool) { return f.p, id == f.p.ID }

// Changed never closes: the one proxy never leaves.
func (f fixedPicker) Changed() <-chan struct{} { return nil }

// relayIO relays each connection to up with two goroutines and io.Copy.
func relayIO(ctx context.Context, listen, up string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", up)
			if err != nil {
				return
			}
			defer u.Close()
			// Plain reads and writes (no splice: a request is small).
			go func() {
				_, _ = io.CopyBuffer(struct{ io.Writer }{u}, struct{ io.Reader }{c}, make([]byte, 32<<10))
				u.Close()
			}()
			_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{u}, make([]byte, 32<<10))
		}()
	}
}

// relayEpoll relays each connection to up from one level-triggered
// epoll loop on a locked thread, with raw non-blocking sockets: what a
// hop costs without the Go poller and scheduler in the way. (A test
// relay: writes that would block are dropped; requests are small.)
func relayEpoll(listen, up string) error {
	runtime.LockOSThread()
	sa := func(addr string) (*unix.SockaddrInet4, error) {
		a, err := net.ResolveTCPAddr("tcp4", addr)
		if err != nil {
			return nil, err
		}
		s := &unix.SockaddrInet4{Port: a.Port}
		copy(s.Addr[:], a.IP.To4())
		return s, nil
	}
	la, err := sa(listen)
	if err != nil {
		return err
	}
	ua, err := sa(up)
	if err != nil {
		return err
	}
	ls, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return err
	}
	_ = unix.SetsockoptInt(ls, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(ls, la); err != nil {
		return err
	}
	if err := unix.Listen(ls, 512); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(0)
	if err != nil {
		return err
	}
	watch := func(fd int) error {
		return unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
	if err := watch(ls); err != nil {
		return err
	}
	peer := map[int]int{}
	buf := make([]byte, 64<<10)
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(ep, evs, -1)
		if err != nil {
			continue // EINTR
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == ls {
				c, _, err := unix.Accept4(ls, unix.SOCK_NONBLOCK)
				if err != nil {
					continue
				}
				s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
				if err != nil || unix.Connect(s, ua) != nil || unix.SetNonblock(s, true) != nil || watch(c) != nil || watch(s) != nil {
					unix.Close(c)
					unix.Close(s)
					continue
				}
				peer[c], peer[s] = s, c
				continue
			}
			r, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if r <= 0 || err != nil {
				p := peer[fd]
				unix.Close(fd)
				unix.Close(p)
				delete(peer, fd)
				delete(peer, p)
				continue
			}
			for off := 0; off < r; {
				w, err := unix.Write(peer[fd], buf[off:r])
				if err != nil {
					break
				}
				off += w
			}
		}
	}
}
