package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hopHeaders are removed when a request or response is forwarded (RFC 9110 7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, k := range strings.Split(f, ",") {
			if k = strings.TrimSpace(k); k != "" {
				h.Del(k)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// ProxyHandler is an HTTP forward proxy: CONNECT tunnels and absolute-URI
// requests, under a ProxyPolicy (SetPolicy); without one it serves nothing.
type ProxyHandler struct {
	Dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	Transport http.RoundTripper
	Log       *log.Logger

	policy atomic.Pointer[ProxyPolicy]

	mu      sync.Mutex
	tunnels map[net.Conn]struct{}
	// byEgress are the transports of requests whose connections
	// tcp_outgoing_address binds: one per choice, so that, as in squid,
	// an idle connection serves only a request that chose its address.
	byEgress map[egress]*http.Transport
}

// egress is the local addresses tcp_outgoing_address gives one request's
// connections: v4 to IPv4 destinations, v6 to IPv6 ones; an invalid one
// leaves that family's choice to the kernel.
type egress struct{ v4, v6 netip.Addr }

func (e egress) forDst(dst netip.Addr) netip.Addr {
	if dst.Unmap().Is4() {
		return e.v4
	}
	return e.v6
}

// egressOf is the request's egress, and false when the policy has no
// tcp_outgoing_address (then Dial and Transport serve it).
func egressOf(pol *ProxyPolicy, areq *AccessRequest) (egress, bool) {
	if pol.Squid == nil || !pol.Squid.HasOutgoing() {
		return egress{}, false
	}
	return egress{
		v4: pol.Squid.OutgoingAddress(areq, netip.IPv4Unspecified()),
		v6: pol.Squid.OutgoingAddress(areq, netip.IPv6Unspecified()),
	}, true
}

// dialFrom connects to addr (host:port) from the local address e gives
// each of its destination addresses: a literal one, or those the host
// name resolves to, tried in order.
func dialFrom(ctx context.Context, addr string, e egress) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var dsts []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		dsts = []netip.Addr{ip}
	} else if dsts, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, err
	}
	var first error
	for _, dst := range dsts {
		d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		if local := e.forDst(dst); local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
		}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(dst.Unmap().String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("%s: no address", host)
	}
	return nil, first
}

// transportFor is the transport of requests with egress e.
func (p *ProxyHandler) transportFor(e egress) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.byEgress[e]; ok {
		return t
	}
	if p.byEgress == nil {
		p.byEgress = map[egress]*http.Transport{}
	}
	t := newTransport(func(ctx context.Context, _, addr string) (net.Conn, error) {
		return dialFrom(ctx, addr, e)
	})
	p.byEgress[e] = t
	return t
}

// SetPolicy sets what the handler enforces; nil: answer 503 to everything.
func (p *ProxyHandler) SetPolicy(pol *ProxyPolicy) { p.policy.Store(pol) }

func (p *ProxyHandler) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tunnels == nil {
		p.tunnels = map[net.Conn]struct{}{}
	}
	for _, c := range cs {
		p.tunnels[c] = struct{}{}
	}
}

func (p *ProxyHandler) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.tunnels, c)
	}
}

// CloseTunnels closes every open CONNECT tunnel (http.Server.Close does not
// close hijacked connections).
func (p *ProxyHandler) CloseTunnels() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.tunnels {
		c.Close()
	}
	p.tunnels = nil
	if t, ok := p.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	for _, t := range p.byEgress {
		t.CloseIdleConnections()
	}
}

// NewProxyHandler returns a handler with a plain dialer and its own transport.
func NewProxyHandler(logger *log.Logger) *ProxyHandler {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &ProxyHandler{Dial: d.DialContext, Transport: newTransport(d.DialContext), Log: logger}
}

func newTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           dial,
		MaxIdleConns:          16,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		// A proxy passes Accept-Encoding as the client sent it (the
		// transport would add gzip and unpack the reply itself).
		DisableCompression: true,
	}
}

func (p *ProxyHandler) logf(format string, args ...any) {
	if p.Log != nil {
		p.Log.Printf(format, args...)
	}
}

func (p *ProxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pol := p.policy.Load()
	if pol == nil {
		// Fail closed: nothing is served before the configuration is known.
		http.Error(w, "proxy not configured", http.StatusServiceUnavailable)
		return
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r, pol)
		return
	}
	if r.URL == nil || !r.URL.IsAbs() || r.URL.Host == "" {
		http.Error(w, "this is a forward proxy: use an absolute URI or CONNECT", http.StatusBadRequest)
		return
	}
	if r.URL.Scheme != "http" {
		http.Error(w, "unsupported scheme "+r.URL.Scheme, http.StatusBadRequest)
		return
	}
	port := 80
	if ps := r.URL.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil {
			http.Error(w, "bad port "+ps, http.StatusBadRequest)
			return
		}
		port = n
	}
	areq := newAccessRequest(r, pol, r.URL.Hostname(), port)
	if !p.allowed(w, r, pol, areq) {
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header = r.Header.Clone()
	removeHopHeaders(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		// Do not let the transport add its own.
		out.Header["User-Agent"] = nil
	}
	if pol.Squid != nil {
		pol.Squid.MangleRequest(out.Header, areq, httpVersion(r.ProtoMajor, r.ProtoMinor), pol.Hostname)
	}
	if r.ContentLength == 0 {
		out.Body = nil
	}
	rt := p.Transport
	if e, ok := egressOf(pol, areq); ok {
		rt = p.transportFor(e)
	}
	resp, err := rt.RoundTrip(out)
	if err != nil {
		p.logf("proxy: %s %s: %v", r.Method, r.URL, err)
		p.writeError(w, pol, areq, "proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	if pol.Squid != nil {
		pol.Squid.MangleReply(resp.Header, areq, httpVersion(resp.ProtoMajor, resp.ProtoMinor), pol.Hostname)
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if _, ok := resp.Header["Content-Type"]; !ok {
		// Pass the reply as it is: no Content-Type sniffed by net/http.
		w.Header()["Content-Type"] = nil
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		p.logf("proxy: %s %s: copying body: %v", r.Method, r.URL, err)
	}
}

func httpVersion(major, minor int) string {
	if major == 0 {
		major, minor = 1, 1
	}
	return strconv.Itoa(major) + "." + strconv.Itoa(minor)
}

// newAccessRequest describes r for http_access. Its Auth checks the
// Proxy-Authorization header once, however many acls ask.
func newAccessRequest(r *http.Request, pol *ProxyPolicy, host string, port int) *AccessRequest {
	var src netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		src = ap.Addr().Unmap()
	}
	auth := sync.OnceValues(func() (string, bool) {
		if pol.Auth == nil {
			return "", false
		}
		return pol.Auth.Check(r.Header.Get("Proxy-Authorization"))
	})
	return &AccessRequest{Src: src, Host: host, Port: port, Method: r.Method, Header: r.Header.Clone(), Auth: auth}
}

// allowed applies http_access (a policy without squid.conf allows all) and
// answers a denied request as squid would: 403, or 407 with a challenge.
func (p *ProxyHandler) allowed(w http.ResponseWriter, r *http.Request, pol *ProxyPolicy, areq *AccessRequest) bool {
	if pol.Squid == nil {
		return true
	}
	v := pol.Squid.Access(areq)
	if v.Allow {
		return true
	}
	if v.Status == http.StatusProxyAuthRequired {
		w.Header().Set("Proxy-Authenticate", `Basic realm="`+pol.Squid.Realm+`"`)
		w.Header().Set("X-Squid-Error", "ERR_CACHE_ACCESS_DENIED 0")
		p.writeError(w, pol, areq, "proxy: authentication required", v.Status)
		return false
	}
	w.Header().Set("X-Squid-Error", "ERR_ACCESS_DENIED 0")
	p.writeError(w, pol, areq, "proxy: access denied", v.Status)
	return false
}

// writeError answers with the proxy's own reply, with the headers squid
// adds to its error pages under a squid.conf.
func (p *ProxyHandler) writeError(w http.ResponseWriter, pol *ProxyPolicy, areq *AccessRequest, msg string, status int) {
	if pol.Squid != nil {
		w.Header().Set("Server", "squid")
		pol.Squid.MangleReply(w.Header(), areq, "1.1", pol.Hostname)
	}
	http.Error(w, msg, status)
}

func (p *ProxyHandler) connect(w http.ResponseWriter, r *http.Request, pol *ProxyPolicy) {
	target := r.Host
	if target == "" && r.URL != nil {
		target = r.URL.Host
	}
	host, ps, err := net.SplitHostPort(target)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil {
		http.Error(w, "CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	areq := newAccessRequest(r, pol, host, port)
	if !p.allowed(w, r, pol, areq) {
		return
	}
	var up net.Conn
	if e, ok := egressOf(pol, areq); ok {
		up, err = dialFrom(r.Context(), target, e)
	} else {
		up, err = p.Dial(r.Context(), "tcp", target)
	}
	if err != nil {
		p.logf("proxy: CONNECT %s: %v", target, err)
		p.writeError(w, pol, areq, "proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "hijacking not supported", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		up.Close()
		return
	}
	// Bytes the client sent after its request head are already buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			conn.Close()
			up.Close()
			return
		}
	}
	p.track(conn, up)
	defer p.untrack(conn, up)
	pipe(conn, up)
}

// pipe copies both ways and closes both connections when either side is done.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// Server is an HTTP server on a fixed address that can be stopped and started again.
type Server struct {
	Name    string
	Addr    string
	Handler http.Handler
	Log     *log.Logger
	// OnStop runs after the server is closed (e.g. to close hijacked tunnels).
	OnStop func()

	mu  sync.Mutex
	srv *http.Server
}

// Start listens and serves in the background. Starting a running server is a no-op.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.Handler, ReadHeaderTimeout: 30 * time.Second}
	s.srv = srv
	go func() {
		err := srv.Serve(ln)
		if err != nil && !errors.Is(err, http.ErrServerClosed) && s.Log != nil {
			s.Log.Printf("%s: %v", s.Name, err)
		}
	}()
	if s.Log != nil {
		s.Log.Printf("%s: listening on %s", s.Name, ln.Addr())
	}
	return nil
}

// Stop closes the listener and every open connection, then runs OnStop.
func (s *Server) Stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
		if s.OnStop != nil {
			s.OnStop()
		}
		if s.Log != nil {
			s.Log.Printf("%s: stopped", s.Name)
		}
	}
}

// Running reports whether the server is started.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv != nil
}
