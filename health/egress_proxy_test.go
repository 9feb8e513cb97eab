package health_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"

	"proxyfleet/messages"
)

// egressProxy is an HTTP forward proxy (absolute-URI GET) on 127.0.0.1
// that leaves from the address a request names, as the guests' squid
// does (kvm's squidEgress): a named address of its plan, of the target's
// family, is the source of its connection to the target; any other
// request leaves from its plan's first address of that family. Loopback
// stands in for the plan: every 127.0.0.0/8 address, and ::1, is this
// machine's. It removes messages.HeaderEgress before the target.
type egressProxy struct {
	srv  *http.Server
	port int
	plan []netip.Addr

	mu    sync.Mutex
	named map[string]int        // requests by the address they named ("" for none)
	wrong map[netip.Addr]string // a named address it leaves from another address for
}

func startEgressProxy(t *testing.T, plan ...string) *egressProxy {
	t.Helper()
	p := &egressProxy{named: map[string]int{}, wrong: map[netip.Addr]string{}}
	for _, s := range plan {
		p.plan = append(p.plan, netip.MustParseAddr(s))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve)}
	go p.srv.Serve(ln)
	t.Cleanup(func() { p.srv.Close() })
	return p
}

// leaveWrongly has a request naming named leave from from instead ("":
// from named again).
func (p *egressProxy) leaveWrongly(named, from string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if from == "" {
		delete(p.wrong, netip.MustParseAddr(named))
		return
	}
	p.wrong[netip.MustParseAddr(named)] = from
}

// namedCount is how many requests named a.
func (p *egressProxy) namedCount(a string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.named[a]
}

// running is the proxy's running event, its plan as its egress.
func (p *egressProxy) running(id string, seq uint64) messages.StateEvent {
	e := runningAt(id, seq, "127.0.0.1", p.port)
	e.Egress = messages.CompactEgress(p.plan)
	return e
}

func (p *egressProxy) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !r.URL.IsAbs() {
		http.Error(w, "a forward proxy of absolute-URI GETs", http.StatusBadRequest)
		return
	}
	named := r.Header.Get(messages.HeaderEgress)
	target, err := netip.ParseAddr(r.URL.Hostname())
	if err != nil {
		http.Error(w, "a target by address", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.named[named]++
	var src netip.Addr
	if a, err := netip.ParseAddr(named); err == nil && a.Is4() == target.Is4() {
		for _, b := range p.plan {
			if a == b {
				src = a
			}
		}
		if s, ok := p.wrong[a]; ok && src.IsValid() {
			src = netip.MustParseAddr(s)
		}
	}
	for _, b := range p.plan {
		if !src.IsValid() && b.Is4() == target.Is4() {
			src = b
		}
	}
	p.mu.Unlock()
	d := &net.Dialer{}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	forward(w, r, tr, messages.HeaderEgress)
}

// forward sends r on through rt as a forward proxy does, without the
// header drop, and copies the answer's status and body back.
func forward(w http.ResponseWriter, r *http.Request, rt http.RoundTripper, drop string) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del(drop)
	resp, err := rt.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}
