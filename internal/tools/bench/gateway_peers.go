package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The gateway's peers: squid with round-robin cache_peers and haproxy in
// TCP round robin, each in front of the same loopback upstream proxies as
// the gateway, run by the bench as child processes with their own config,
// pid and log files in a scratch directory (the Debian packages, installed
// with apt-get when missing; their system services are stopped and
// disabled). Each workload is a ratio against the client straight to the
// upstream, measured in the same run.

// gwProfileDir, when set, receives a CPU profile of the gateway process
// during each run of a tunnel workload through it.
var gwProfileDir = flag.String("gateway-profile", "", "gateway: write CPU profiles of the gateway process (run with --pprof) during the tunnel workloads' runs through it to this directory")

// gatewayArgs are the gateway process's arguments (--http is added by
// startReady).
func gatewayArgs(cfgPath string) []string {
	args := []string{"gateway", "--config", cfgPath}
	if *gwProfileDir != "" {
		args = append(args, "--pprof")
	}
	return args
}

// gwParty is one way to the upstream: its name, its proxy URL (with the
// credential it needs) and its process (0: none of its own).
type gwParty struct {
	name  string
	proxy *url.URL
	pid   int
}

// gwPeers are the squid and haproxy processes of the section.
type gwPeers struct {
	squid, haproxy gwParty
	procs          []*peerProc
	// kaSquid and kaHaproxy are the peers' keep-alive ratios, one per run.
	kaSquid, kaHaproxy []float64
}

// peerProc is a peer's process, its log and when it exited.
type peerProc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// installPeers installs the Debian packages squid and haproxy when their
// binaries are missing, and stops and disables the system services the
// packages start, so that only the bench's own instances run.
func installPeers(ctx context.Context, b *bench) error {
	var missing []string
	for bin, pkg := range map[string]string{"squid": "squid", "haproxy": "haproxy"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + bin); err != nil {
				missing = append(missing, pkg)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	b.log.Printf("gateway: installing %s with apt-get", strings.Join(missing, ", "))
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, missing...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %s: %w: %s", strings.Join(missing, " "), err, out)
	}
	for _, svc := range missing {
		// Whichever init the machine has; a missing one fails harmlessly.
		_ = exec.CommandContext(ctx, "systemctl", "disable", "--now", svc).Run()
		_ = exec.CommandContext(ctx, "service", svc, "stop").Run()
		_ = exec.CommandContext(ctx, "update-rc.d", svc, "disable").Run()
	}
	return nil
}

func peerBin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

// startGatewayPeers starts squid and haproxy in dir, each in front of
// upstreams (loopback forward proxies requiring user:pass).
func startGatewayPeers(ctx context.Context, b *bench, dir string, upstreams []string, user, pass string) (*gwPeers, error) {
	if err := installPeers(ctx, b); err != nil {
		return nil, err
	}
	// squid drops root for its cache_effective_user, which must be able
	// to write its log and pid files.
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, err
	}
	p := &gwPeers{}
	squidAddr, haAddr := freeAddr(), freeAddr()
	sqText, err := squidConfig(dir, squidAddr, upstreams, user, pass)
	if err != nil {
		return nil, err
	}
	haText := haproxyConfig(dir, haAddr, upstreams)
	sqCfg, haCfg := filepath.Join(dir, "squid.conf"), filepath.Join(dir, "haproxy.cfg")
	for path, text := range map[string]string{sqCfg: sqText, haCfg: haText} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	sqp, err := startPeer(ctx, "squid", filepath.Join(dir, "squid.out"), squidAddr, peerBin("squid"), "-N", "-f", sqCfg)
	if err != nil {
		return nil, err
	}
	p.procs = append(p.procs, sqp)
	hap, err := startPeer(ctx, "haproxy", filepath.Join(dir, "haproxy.out"), haAddr, peerBin("haproxy"), "-db", "-f", haCfg)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.procs = append(p.procs, hap)
	// squid needs no credential of its client (it adds the fleet's
	// towards its peers); haproxy relays bytes, so its client sends the
	// fleet's.
	p.squid = gwParty{name: "squid", proxy: &url.URL{Scheme: "http", Host: squidAddr}, pid: sqp.cmd.Process.Pid}
	p.haproxy = gwParty{name: "haproxy", proxy: &url.URL{Scheme: "http", Host: haAddr, User: url.UserPassword(user, pass)}, pid: hap.cmd.Process.Pid}
	return p, nil
}

// profileGateway writes a CPU profile of the gateway (its ops listener
// at addr) over gwRateFor to path; a failure is logged.
func profileGateway(b *bench, addr, path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.log.Printf("gateway: CPU profile: %v", err)
		return
	}
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(gwRateFor.Seconds()))
	if err := fetchTo(url, path, gwRateFor+time.Minute); err != nil {
		b.log.Printf("gateway: CPU profile: %v", err)
		return
	}
	b.log.Printf("gateway: CPU profile of the gateway: %s", path)
}

// squidConfig is squid's config in dir: listening on addr, each of
// upstreams a parent cache_peer in round robin with the credential
// user:pass, nothing direct, nothing cached, no access log.
func squidConfig(dir, addr string, upstreams []string, user, pass string) (string, error) {
	var sq strings.Builder
	fmt.Fprintf(&sq, "http_port %s\n", addr)
	for i, u := range upstreams {
		host, port, err := net.SplitHostPort(u)
		if err != nil {
			return "", fmt.Errorf("upstream %q: %w", u, err)
		}
		fmt.Fprintf(&sq, "cache_peer %s parent %s 0 no-query no-digest no-netdb-exchange round-robin login=%s:%s name=up%d\n", host, port, user, pass, i+1)
	}
	fmt.Fprintf(&sq, `never_direct allow all
http_access allow all
cache deny all
cache_mem 0 MB
memory_cache_shared off
access_log none
cache_store_log none
cache_log %s
pid_filename %s
coredump_dir %s
shutdown_lifetime 1 seconds
max_filedescriptors 16384
via off
forwarded_for delete
`, filepath.Join(dir, "squid-cache.log"), filepath.Join(dir, "squid.pid"), dir)
	return sq.String(), nil
}

// haproxyConfig is haproxy's config in dir: TCP on addr, upstreams in
// round robin.
func haproxyConfig(dir, addr string, upstreams []string) string {
	var ha strings.Builder
	fmt.Fprintf(&ha, `global
  maxconn 4096
  pidfile %s
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind %s
  default_backend be
backend be
  balance roundrobin
`, filepath.Join(dir, "haproxy.pid"), addr)
	for i, u := range upstreams {
		fmt.Fprintf(&ha, "  server up%d %s\n", i+1, u)
	}
	return ha.String()
}

// startPeer runs bin with args, its output to logPath, and waits until
// addr accepts connections.
func startPeer(ctx context.Context, name, logPath, addr, bin string, args ...string) (*peerProc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers are stopped with it
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	pp := &peerProc{name: name, cmd: cmd, log: lf, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(pp.done) }()
	end := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return pp, nil
		}
		select {
		case <-pp.done:
			out, _ := os.ReadFile(logPath)
			pp.stop()
			return nil, fmt.Errorf("%s exited: %s", name, out)
		case <-ctx.Done():
			pp.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(end) {
			pp.stop()
			return nil, fmt.Errorf("%s: %s not listening within 30s", name, addr)
		}
	}
}

// stop ends the process group with SIGTERM, and SIGKILL if it is not
// gone within 5 s.
func (pp *peerProc) stop() {
	defer pp.log.Close()
	pid := pp.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-pp.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-pp.done
	}
}

func (p *gwPeers) stop() {
	for _, pp := range p.procs {
		pp.stop()
	}
}

// keepAlive measures squid's and haproxy's keep-alive request rates (as
// requestRate) and keeps them as ratios against direct, the rate straight
// to the upstream of the same run.
func (p *gwPeers) keepAlive(ctx context.Context, direct float64, target string) error {
	s, _, err := requestRate(ctx, p.squid.proxy, target)
	if err != nil {
		return fmt.Errorf("through squid: %w", err)
	}
	h, _, err := requestRate(ctx, p.haproxy.proxy, target)
	if err != nil {
		return fmt.Errorf("through haproxy: %w", err)
	}
	p.kaSquid, p.kaHaproxy = append(p.kaSquid, s/direct), append(p.kaHaproxy, h/direct)
	return nil
}

// keepAliveNote is the peers' keep-alive ratios for the figure's peer
// column.
func (p *gwPeers) keepAliveNote() string {
	return fmt.Sprintf("the peers' ratios, same client and runs, right after the gateway: squid %.3f, haproxy %.3f (medians; runs %s and %s)",
		median(p.kaSquid), median(p.kaHaproxy), runList(p.kaSquid), runList(p.kaHaproxy))
}

// behindSquid says in f's bound when the gateway's ratio is not ahead of
// squid's of the same run.
func (p *gwPeers) behindSquid(f *figure, ours float64, squid []float64) {
	if ours > median(squid) {
		return
	}
	if f.Bound != "" {
		f.Bound += " "
	}
	f.Bound += fmt.Sprintf("The gateway (%.3f) is not ahead of squid (%.3f) here.", ours, median(squid))
}

// last is the last of vs (0: none).
func last(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	return vs[len(vs)-1]
}

func runList(vs []float64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%.3g", v)
	}
	return strings.Join(s, ", ")
}

// tunnelWorkload is one tunnel workload: its figure's key, target, unit
// of rate, what its CPU figures are per and how one party's rate is
// measured.
type tunnelWorkload struct {
	key, unit string
	per       string // what the CPU figures are per
	target    float64
	rate      func(ctx context.Context, proxy *url.URL) (float64, int64, error)
}

// tunnelFigures measures the CONNECT workloads (a new tunnel with a TLS
// handshake and one request each; bulk bytes through one tunnel) for the
// client straight to the upstream (before and after the proxies), the
// gateway (process gwPid), squid and haproxy, b.runs times, and returns
// gateway_connect_ratio and gateway_bulk_ratio with the peers' ratios.
func (p *gwPeers) tunnelFigures(ctx context.Context, b *bench, direct, via *url.URL, gwPid int, gwHTTP string) ([]figure, error) {
	tt := newTLSTarget()
	defer tt.close()
	src, err := newBulkSource()
	if err != nil {
		return nil, err
	}
	defer src.close()
	works := []tunnelWorkload{
		{key: "gateway_connect_ratio", unit: "tunnels/s", per: "tunnel", target: 0.9,
			rate: func(ctx context.Context, proxy *url.URL) (float64, int64, error) { return connectRate(ctx, proxy, tt) }},
		{key: "gateway_bulk_ratio", unit: "MiB/s", per: "MiB", target: 0.95,
			rate: func(ctx context.Context, proxy *url.URL) (float64, int64, error) {
				r, err := bulkRate(ctx, proxy, src.addr())
				return r, int64(r * gwRateFor.Seconds()), err
			}},
	}
	parties := []gwParty{{name: "gateway", proxy: via, pid: gwPid}, p.squid, p.haproxy}
	var figs []figure
	for _, w := range works {
		// ratios and cpu (µs of the party's process per unit) by party.
		ratios := map[string][]float64{}
		cpu := map[string][]float64{} // "bench": this process, straight
		var straight, ours []float64
		for i := range b.runs {
			c0 := cpuTime()
			d0, n0, err := w.rate(ctx, direct)
			if err != nil {
				return nil, fmt.Errorf("%s straight: %w", w.key, err)
			}
			straightCPU := cpuTime() - c0
			rates := map[string]float64{}
			for _, pt := range parties {
				var profiled sync.WaitGroup
				if pt.name == "gateway" && *gwProfileDir != "" {
					profiled.Add(1)
					go func() {
						defer profiled.Done()
						profileGateway(b, gwHTTP, filepath.Join(*gwProfileDir, fmt.Sprintf("%s-run%d.cpu.pprof", w.key, i+1)))
					}()
				}
				t0, _ := procTicks(pt.pid)
				r, n, err := w.rate(ctx, pt.proxy)
				profiled.Wait()
				if err != nil {
					return nil, fmt.Errorf("%s through %s: %w", w.key, pt.name, err)
				}
				t1, _ := procTicks(pt.pid)
				rates[pt.name] = r
				if n > 0 {
					cpu[pt.name] = append(cpu[pt.name], float64(t1-t0)*1e6/clockTicks/float64(n))
				}
			}
			c1 := cpuTime()
			d1, n1, err := w.rate(ctx, direct)
			if err != nil {
				return nil, fmt.Errorf("%s straight: %w", w.key, err)
			}
			c2 := cpuTime()
			if n0+n1 > 0 {
				straightCPU += c2 - c1
				cpu["bench"] = append(cpu["bench"], float64(straightCPU.Microseconds())/float64(n0+n1))
			}
			d := (d0 + d1) / 2
			straight, ours = append(straight, d), append(ours, rates["gateway"])
			for _, pt := range parties {
				ratios[pt.name] = append(ratios[pt.name], rates[pt.name]/d)
			}
			b.log.Printf("gateway run %d: %s: straight %.0f and %.0f %s; gateway %.3f, squid %.3f, haproxy %.3f; CPU per %s: gateway %.0f µs, squid %.0f µs, haproxy %.0f µs",
				i+1, w.key, d0, d1, w.unit, rates["gateway"]/d, rates["squid"]/d, rates["haproxy"]/d,
				w.per, last(cpu["gateway"]), last(cpu["squid"]), last(cpu["haproxy"]))
		}
		f := figure{Key: w.key, Section: "gateway", Value: median(ratios["gateway"]), Unit: "ratio", Target: atLeast(w.target), Runs: ratios["gateway"],
			Ours: fmt.Sprintf("%.0f %s through the gateway (median)", median(ours), w.unit),
			Peer: fmt.Sprintf("the same client straight to the proxy: %.0f %s (mean of before and after the proxies); squid %.3f, haproxy %.3f of it (medians; runs %s and %s)",
				median(straight), w.unit, median(ratios["squid"]), median(ratios["haproxy"]), runList(ratios["squid"]), runList(ratios["haproxy"])),
		}
		per := w.per
		switch w.key {
		case "gateway_connect_ratio":
			f.How = fmt.Sprintf("the gateway's setup of gateway_ratio, beside squid 5 (cache_peer parent to the same proxy, round-robin, its credential by login=, never_direct, no cache) and haproxy 2.6 (mode tcp, balance roundrobin, the client sends the proxy's credential), each a child process of the bench on loopback; %d clients at once for %s each, each request a new CONNECT to a loopback HTTPS target (Go's httptest, a self-signed certificate the client trusts), a full TLS handshake (no session resumption) and one GET; straight to the proxy, then the gateway, squid, haproxy, then straight again, per run; each a ratio against the mean of the two straight runs.", gwClients, gwRateFor)
		case "gateway_bulk_ratio":
			f.How = fmt.Sprintf("the setup of gateway_connect_ratio; one client opens a CONNECT tunnel to a loopback TCP source sending zeros and reads for %s (64 KiB reads); straight to the proxy, then the gateway, squid, haproxy, then straight again, per run; each a ratio against the mean of the two straight runs.", gwRateFor)
		}
		f.check()
		if !f.Met {
			f.Bound = fmt.Sprintf("the extra hop's CPU on 2 cores shared with the client, the upstream proxy and the target (all in the bench process, which used %.0f µs per %s straight). "+
				"Each proxy's process per %s (medians; /proc): the gateway %.0f µs, squid %.0f µs, haproxy %.0f µs; where the cores limit the rate, a proxy costing what the straight path costs halves it.",
				median(cpu["bench"]), per, per, median(cpu["gateway"]), median(cpu["squid"]), median(cpu["haproxy"]))
		}
		p.behindSquid(&f, f.Value, ratios["squid"])
		figs = append(figs, f)
	}
	return figs, nil
}

// tlsTarget is a loopback HTTPS server answering "ok" with a self-signed
// certificate, and the pool its clients trust.
type tlsTarget struct {
	srv   *httptest.Server
	roots *x509.CertPool
}

func newTLSTarget() *tlsTarget {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // clients that close at once are no news
	srv.StartTLS()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	return &tlsTarget{srv: srv, roots: roots}
}

func (t *tlsTarget) close() { t.srv.Close() }

// connectRate is the new tunnels per second of gwClients clients through
// proxy for gwRateFor: each request a new CONNECT, a full TLS handshake
// (no session resumption) and one GET; and how many they made.
func connectRate(ctx context.Context, proxy *url.URL, t *tlsTarget) (float64, int64, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: t.roots}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return runClients(ctx, func() error { return fetch(c, t.srv.URL) })
}

// runClients runs one for gwClients goroutines for gwRateFor, and
// returns the rate of its successes and their number.
func runClients(ctx context.Context, one func() error) (float64, int64, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	end := time.Now().Add(gwRateFor)
	var wg sync.WaitGroup
	start := time.Now()
	for range gwClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				if err := one(); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	return float64(n.Load()) / time.Since(start).Seconds(), n.Load(), nil
}

// bulkSource is a loopback TCP server sending zeros to each connection
// until it closes.
type bulkSource struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func newBulkSource() (*bulkSource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &bulkSource{ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { s.mu.Lock(); delete(s.conns, c); s.mu.Unlock(); c.Close() }()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s, nil
}

func (s *bulkSource) addr() string { return s.ln.Addr().String() }

func (s *bulkSource) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// bulkRate is the MiB per second one client reads from target through a
// CONNECT tunnel of proxy for gwRateFor.
func bulkRate(ctx context.Context, proxy *url.URL, target string) (float64, error) {
	c, err := net.DialTimeout("tcp", proxy.Host, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if proxy.User != nil {
		pw, _ := proxy.User.Password()
		req += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(proxy.User.Username()+":"+pw)) + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, fmt.Errorf("CONNECT %s: %w", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("CONNECT %s: %s", target, resp.Status)
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(gwRateFor))
	n, err := io.CopyBuffer(io.Discard, br, make([]byte, 64<<10))
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		return 0, fmt.Errorf("tunnel to %s: %w", target, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("tunnel to %s: no bytes", target)
	}
	return float64(n) / (1 << 20) / time.Since(start).Seconds(), nil
}
