package console_test

import (
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"proxyfleet/gateway"
	"proxyfleet/internal/runtest"
	"proxyfleet/rotation"
)

// The gateway's user in the rigs that run one.
const (
	gatewayUser = "gw"
	gatewayPW   = "gw-secret-1"
)

// testGateway is a real gateway following the rig's rotation, with its
// metrics served on an ops listener as `proxyfleet gateway --http` does.
type testGateway struct {
	addr   string // the proxy's address
	reg    *prometheus.Registry
	opsURL string // http://127.0.0.1:PORT, its /metrics
	opsLn  net.Listener
}

// reserveGateway takes the gateway's ops listener before the console
// starts, so that the console is configured with its URL; start runs
// the gateway behind it.
func reserveGateway(t *testing.T) *testGateway {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &testGateway{opsLn: ln, opsURL: "http://" + ln.Addr().String(), reg: prometheus.NewRegistry()}
}

// start runs the gateway on the rig's NATS (a health process must
// answer the rotation's pages) and serves its metrics.
func (g *testGateway) start(r *rig) {
	t := r.t
	t.Helper()
	rot, err := rotation.New(r.connect(), rotation.Config{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, rot.Run, rot.Ready(), time.Minute)
	gw, err := gateway.New(rot, gateway.Config{
		Listen: "127.0.0.1:0", Users: []gateway.User{{Name: gatewayUser, Password: gatewayPW}},
		Bans: rot, Logger: quietLog(), Registry: g.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, gw.Run, gw.Started(), 10*time.Second)
	g.addr = gw.Addr()
	srv := &http.Server{Handler: promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(g.opsLn)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// send sends a plain HTTP request to target through the gateway as user
// with password and returns the gateway's status.
func (g *testGateway) send(t *testing.T, password, target string) int {
	t.Helper()
	proxy := &url.URL{Scheme: "http", Host: g.addr, User: url.UserPassword(gatewayUser, password)}
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := hc.Get(target)
	if err != nil {
		t.Fatalf("through the gateway to %s: %v", target, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// requests is what the gateway's own metrics count of outcome, every
// kind.
func (g *testGateway) requests(t *testing.T, outcome string) int {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "proxyfleet_gateway_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}
