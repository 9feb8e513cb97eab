package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// The gateway section: a `proxyfleet gateway` process in front of one
// loopback upstream forward proxy (in this process, requiring the fleet's
// credential as the guests' squid does), against the same client straight
// to that proxy.

const (
	gwFleetUser, gwFleetPass = "fleet", "bench-fleet-password"
	gwUser, gwPass           = "bench", "bench-gateway-password"
	gwClients                = 8               // concurrent clients of the rate runs
	gwRateFor                = 3 * time.Second // each side's time per rate run
	gwLatencyN               = 2000            // sequential requests per latency run
	gwTunnelsWanted          = 10000
)

// gwRig is what the gateway sections share: the binary built from this
// tree, a loopback target, the upstream proxy, an embedded nats-server
// set up as `proxyfleet setup` does, whose rotation (its pages answered
// here, as health answers them) holds that one proxy, and the passwords.
// gateway starts gateway processes on it; close stops what it started.
type gwRig struct {
	bin, dir      string
	target        *benchTarget
	up            *benchUpstream
	srv           *server.Server
	nc            *nats.Conn
	pages         *nats.Subscription
	fleetPW, gwPW string
}

func newGWRig(ctx context.Context, b *bench, name string) (*gwRig, error) {
	r := &gwRig{bin: filepath.Join(b.dir, "proxyfleet"), dir: filepath.Join(b.dir, name)}
	ok := false
	defer func() {
		if !ok {
			r.close()
		}
	}()
	if _, err := os.Stat(r.bin); err != nil {
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", r.bin, "proxyfleet/cmd/proxyfleet").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build: %w: %s", err, out)
		}
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if r.target, err = newBenchTarget(); err != nil {
		return nil, err
	}
	if r.up, err = newBenchUpstream(); err != nil {
		return nil, err
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(r.dir, "nats"), NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go s.Start()
	r.srv = s
	if !s.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("nats-server not ready")
	}
	nc, js := connect(s.ClientURL())
	r.nc = nc
	if _, err := (topology.Topology{Subjects: messages.NewSubjects("")}).Setup(ctx, js); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	// The rotation, as health publishes it (the gateway follows the feed
	// and reads the pages): one proxy, its pages answered here.
	page, err := json.Marshal(messages.RotationPage{V: messages.Version, Version: 1, Size: 1,
		Proxies: []messages.RotationEntry{{ID: "up1", Addr: r.up.addr(), Host: "h1", Since: time.Now().UTC()}}})
	if err != nil {
		return nil, err
	}
	if r.pages, err = nc.Subscribe(messages.NewSubjects("").RotationGet(), func(m *nats.Msg) { _ = m.Respond(page) }); err != nil {
		return nil, err
	}
	r.fleetPW, r.gwPW = filepath.Join(r.dir, "fleet-password"), filepath.Join(r.dir, "gateway-password")
	for p, v := range map[string]string{r.fleetPW: gwFleetPass, r.gwPW: gwPass} {
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	ok = true
	return r, nil
}

// gateway starts a `proxyfleet gateway` process named name (its config
// and log in the rig's directory under that name), ready, with extra (YAML
// lines indented by two spaces) added to its gateway settings, and
// returns it, its listen address and its ops (--http) address.
func (r *gwRig) gateway(ctx context.Context, name, extra string) (*role, string, string, error) {
	addr := freeAddr()
	cfg := fmt.Sprintf(`nats: {url: %q}
hosts: [{name: h1, driver: sim, sim: {dir: %q}}]
proxy: {auth: {user: %s, password_file: %q}}
gateway:
  listen: %q
  users: [{name: %s, password_file: %q, max_conns: 20000}]
  deny: []            # the target is on loopback, which the default list refuses
%s`, r.srv.ClientURL(), filepath.Join(r.dir, "sim"), gwFleetUser, r.fleetPW, addr, gwUser, r.gwPW, extra)
	path := filepath.Join(r.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, "", "", err
	}
	gw, ops, err := startReady(ctx, r.bin, filepath.Join(r.dir, name+".log"), nil, gatewayArgs(path)...)
	if err != nil {
		return nil, "", "", err
	}
	return gw, addr, ops, nil
}

func (r *gwRig) close() {
	if r.pages != nil {
		_ = r.pages.Unsubscribe()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.srv != nil {
		r.srv.Shutdown()
	}
	if r.up != nil {
		r.up.close()
	}
	if r.target != nil {
		r.target.close()
	}
}

// gwVia is the URL of the gateway at addr, with the bench's user.
func gwVia(addr string) *url.URL {
	return &url.URL{Scheme: "http", Host: addr, User: url.UserPassword(gwUser, gwPass)}
}

// gwSetup says how the gateway sections are set up, for the figures.
const gwSetup = "one `proxyfleet gateway` process (the binary built from this tree, defaults but max_conns) following the rotation's feed on an embedded nats-server, its pages answered by the bench as health answers them, with one proxy: a loopback forward proxy in the bench process (Go: plain requests through an http.Transport, CONNECT by hijack and io.Copy; Basic credential required, as the guests' squid), and a loopback HTTP target answering 2 bytes. Client: Go's http.Client with keep-alive"

func runGateway(ctx context.Context, b *bench) (sectionResult, error) {
	nofile := raiseNofile()
	rig, err := newGWRig(ctx, b, "gateway")
	if err != nil {
		return sectionResult{}, err
	}
	defer rig.close()
	target, up, dir := rig.target, rig.up, rig.dir
	gw, gwAddr, gwHTTP, err := rig.gateway(ctx, "gateway", "")
	if err != nil {
		return sectionResult{}, err
	}
	defer gw.stop(b)
	peers, err := startGatewayPeers(ctx, b, filepath.Join(dir, "peers"), []string{up.addr()}, gwFleetUser, gwFleetPass)
	if err != nil {
		return sectionResult{}, fmt.Errorf("peers: %w", err)
	}
	defer peers.stop()

	direct := &url.URL{Scheme: "http", Host: up.addr(), User: url.UserPassword(gwFleetUser, gwFleetPass)}
	via := gwVia(gwAddr)
	var ratios, added, rateDirect, rateVia, p99Direct, p99Via []float64
	// CPU per request of each party in the rate runs (µs): this process
	// (client, proxy, target) straight and through the gateway, and the
	// gateway's process. They say what bounds the ratio.
	var cpuDirect, cpuVia, cpuGateway []float64
	pid := gw.cmd.Process.Pid
	for i := range b.runs {
		c0 := cpuTime()
		d, nd, err := requestRate(ctx, direct, target.url)
		if err != nil {
			return sectionResult{}, fmt.Errorf("direct: %w", err)
		}
		c1 := cpuTime()
		g1, _ := procTicks(pid)
		v, nv, err := requestRate(ctx, via, target.url)
		if err != nil {
			return sectionResult{}, fmt.Errorf("through the gateway: %w", err)
		}
		c2 := cpuTime()
		g2, _ := procTicks(pid)
		if err := peers.keepAlive(ctx, d, target.url); err != nil {
			return sectionResult{}, err
		}
		cpuDirect = append(cpuDirect, float64((c1-c0).Microseconds())/float64(nd))
		cpuVia = append(cpuVia, float64((c2-c1).Microseconds())/float64(nv))
		cpuGateway = append(cpuGateway, float64(g2-g1)*1e6/clockTicks/float64(nv))
		ld, err := latencies(direct, target.url)
		if err != nil {
			return sectionResult{}, fmt.Errorf("direct: %w", err)
		}
		lv, err := latencies(via, target.url)
		if err != nil {
			return sectionResult{}, fmt.Errorf("through the gateway: %w", err)
		}
		pd, pv := ms(percentile(ld, 0.99)), ms(percentile(lv, 0.99))
		rateDirect, rateVia = append(rateDirect, d), append(rateVia, v)
		p99Direct, p99Via = append(p99Direct, pd), append(p99Via, pv)
		ratios, added = append(ratios, v/d), append(added, pv-pd)
		b.log.Printf("gateway run %d: %.0f req/s through the gateway, %.0f straight (ratio %.3f); p99 %.3f ms against %.3f ms (added %.3f ms); CPU per request: gateway %.1f µs, bench process %.1f µs through it, %.1f µs straight",
			i+1, v, d, v/d, pv, pd, pv-pd, cpuGateway[i], cpuVia[i], cpuDirect[i])
	}

	// Idle tunnels: as many as the descriptors of this process allow (a
	// tunnel holds 4 here: the client's, the upstream's two, the
	// target's), up to 10,000; the gateway process's RSS before and
	// after, once all are open and idle.
	var lim int
	fmt.Sscan(nofile, &lim)
	n := min(gwTunnelsWanted, (lim-1000)/4)
	kib, tunnels, err := tunnelMemory(ctx, gwAddr, target.addr, gw.cmd.Process.Pid, n)
	if err != nil {
		return sectionResult{}, fmt.Errorf("idle tunnels: %w", err)
	}
	b.log.Printf("gateway: %d idle tunnels: %.1f KiB of the gateway's RSS each", tunnels, kib)

	setup := gwSetup
	rate := figure{Key: "gateway_ratio", Section: "gateway", Value: median(ratios), Unit: "ratio", Target: atLeast(0.8), Runs: ratios,
		Ours: fmt.Sprintf("%.0f requests/s through the gateway (median)", median(rateVia)),
		Peer: fmt.Sprintf("the same client straight to the proxy: %.0f requests/s", median(rateDirect)),
		How:  setup + fmt.Sprintf("; %d clients at once for %s each way, straight to the proxy first, then through the gateway, per run.", gwClients, gwRateFor)}
	gwCPU, viaCPU, directCPU := median(cpuGateway), median(cpuVia), median(cpuDirect)
	hop := gwCPU + viaCPU - directCPU
	rate.Bound = fmt.Sprintf("the extra hop's CPU, on 2 cores shared by all four parties. Per request (medians of the runs; getrusage and /proc): "+
		"the gateway process used %.0f µs, and this process (client, proxy, target) %.0f µs through the gateway against %.0f µs straight (each request wakes it twice more); "+
		"so the hop costs %.0f µs on top of the straight path's %.0f: a ratio of %.2f where the cores are what limits the rate (0.8 allows the hop %.0f µs). "+
		"Of the gateway's share its own work (parsing, the credential check, the pick, relaying; nothing allocated a request) is about a tenth (its CPU profile); "+
		"the rest is the hop's two socket writes and two reads and, above all, Go's poller and scheduler: each wait for the client or the proxy parks a goroutine (a read that finds nothing, an epoll wait, a thread woken). "+
		"A bare TCP relay on goroutines in the gateway's place costs as much (`go run ./internal/tools/hopcost -hop io`: 23-32 µs a request on this machine, 2026-12); "+
		"one on an epoll loop of its own, without Go's poller and scheduler (-hop epoll), 13-18 µs, and it adds little to this process's share: what a gateway on such a loop, its HTTP work on top, might come to.",
		gwCPU, viaCPU, directCPU, hop, directCPU, directCPU/(directCPU+hop), directCPU/4)
	lat := figure{Key: "gateway_added_p99_ms", Section: "gateway", Value: median(added), Unit: "ms", Target: atMost(1), Runs: added,
		Ours: fmt.Sprintf("p99 %.3f ms through the gateway (median)", median(p99Via)),
		Peer: fmt.Sprintf("p99 %.3f ms straight to the proxy (median)", median(p99Direct)),
		How:  setup + fmt.Sprintf("; one client, %d requests one after another each way per run; the figure is the difference of the p99s.", gwLatencyN)}
	tun := figure{Key: "gateway_tunnel_kib", Section: "gateway", Value: kib, Unit: "KiB", Target: atMost(20),
		Ours: fmt.Sprintf("%.1f KiB of the gateway process's RSS per idle CONNECT tunnel, %d held", kib, tunnels),
		Peer: "limit 20 KiB",
		How:  setup + fmt.Sprintf("; %d CONNECT tunnels opened through the gateway to the target and left idle; the gateway's VmRSS once all were open (and 1 s after), minus before, over their number.", tunnels)}
	if tunnels < gwTunnelsWanted {
		tun.Bound = fmt.Sprintf("%d tunnels, not 10,000: this machine's hard RLIMIT_NOFILE is %s, and the bench process holds 4 descriptors per tunnel (client, the proxy's two, target)", tunnels, nofile)
	}
	rate.Peer += "; " + peers.keepAliveNote()
	tunFigs, err := peers.tunnelFigures(ctx, b, direct, via, pid, gwHTTP)
	if err != nil {
		return sectionResult{}, err
	}
	for _, f := range []*figure{&rate, &lat, &tun} {
		f.check()
	}
	if rate.Met {
		rate.Bound = "" // only a missed target needs its bound
	}
	peers.behindSquid(&rate, median(ratios), peers.kaSquid)
	return sectionResult{figures: append([]figure{rate, lat, tun}, tunFigs...)}, nil
}

// requestRate is the requests per second of gwClients clients through
// proxy for gwRateFor, and how many they made.
func requestRate(ctx context.Context, proxy *url.URL, target string) (float64, int64, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), MaxIdleConnsPerHost: gwClients}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return runClients(ctx, func() error { return fetch(c, target) })
}

// latencies are gwLatencyN requests' times, one after another.
func latencies(proxy *url.URL, target string) ([]time.Duration, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy)}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	if err := fetch(c, target); err != nil { // the connection, made
		return nil, err
	}
	out := make([]time.Duration, 0, gwLatencyN)
	for range gwLatencyN {
		t0 := time.Now()
		if err := fetch(c, target); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
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

// tunnelMemory opens n CONNECT tunnels through the gateway at gw to
// target, and returns the growth of the gateway's (pid) RSS per tunnel.
func tunnelMemory(ctx context.Context, gw, target string, pid, n int) (float64, int, error) {
	before := rssMiB(pid, "VmRSS:")
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(gwUser+":"+gwPass))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nProxy-Authorization: " + auth + "\r\n\r\n"
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		c, err := net.DialTimeout("tcp", gw, 5*time.Second)
		if err != nil {
			return 0, 0, fmt.Errorf("tunnel %d: %w", i, err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			return 0, 0, fmt.Errorf("tunnel %d: %w", i, err)
		}
		resp, err := http.ReadResponse(bufio.NewReaderSize(c, 512), nil)
		if err != nil {
			return 0, 0, fmt.Errorf("tunnel %d: %w", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("tunnel %d: %s", i, resp.Status)
		}
		_ = c.SetDeadline(time.Time{})
	}
	time.Sleep(time.Second)
	after := rssMiB(pid, "VmRSS:")
	return (after - before) * 1024 / float64(n), n, nil
}

// benchTarget is a loopback HTTP server answering "ok"; a CONNECT tunnel
// to it stays open and idle (the HTTP server waits for a request).
type benchTarget struct {
	srv  *http.Server
	addr string
	url  string
}

func newBenchTarget() (*benchTarget, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &benchTarget{addr: ln.Addr().String(), url: "http://" + ln.Addr().String() + "/"}
	t.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go t.srv.Serve(ln)
	return t, nil
}

func (t *benchTarget) close() { t.srv.Close() }

// benchUpstream is a loopback forward proxy requiring the fleet's
// credential: plain requests through an http.Transport, CONNECT by
// hijack and io.Copy.
type benchUpstream struct {
	srv *http.Server
	ln  net.Listener
	tr  *http.Transport

	mu    sync.Mutex
	conns []net.Conn
}

func newBenchUpstream() (*benchUpstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &benchUpstream{ln: ln, tr: &http.Transport{MaxIdleConnsPerHost: 64}}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(gwFleetUser+":"+gwFleetPass))
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != want {
			w.Header().Set("Proxy-Authenticate", `Basic realm="bench"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		if r.Method == http.MethodConnect {
			u.connect(w, r)
			return
		}
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Header.Del("Proxy-Authorization")
		out.Header.Del("Proxy-Connection")
		resp, err := u.tr.RoundTrip(out)
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
	})}
	go u.srv.Serve(ln)
	return u, nil
}

func (u *benchUpstream) connect(w http.ResponseWriter, r *http.Request) {
	t, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Close()
		return
	}
	u.mu.Lock()
	u.conns = append(u.conns, c, t)
	u.mu.Unlock()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		c.Close()
		t.Close()
		return
	}
	// Plain reads and writes, not io.Copy: between two TCP conns it
	// splices through a pipe per direction held for the tunnel's life
	// (4 more descriptors a tunnel, which the descriptor limit here
	// cannot spare for the idle tunnels).
	pump := func(dst, src net.Conn) {
		_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 4096))
		dst.Close()
	}
	go pump(t, c)
	go pump(c, t)
}

func (u *benchUpstream) addr() string { return u.ln.Addr().String() }

func (u *benchUpstream) close() {
	u.srv.Close()
	u.mu.Lock()
	for _, c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.tr.CloseIdleConnections()
}
