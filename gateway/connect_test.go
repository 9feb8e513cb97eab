package gateway

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"proxyfleet/internal/poll"
)

// TestConnectClientLeaves: a client that leaves while its CONNECT waits
// for a proxy that does not answer ends the wait (long before
// ConnectTimeout): it is counted as gone, the proxy's connection is
// closed, and the proxy is not reported. Whether it leaves at once or
// after the watch began.
func TestConnectClientLeaves(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration // from the proxy having the CONNECT to the client's close
	}{{"at once", 0}, {"later", 4 * watchAfter}} {
		t.Run(tc.name, func(t *testing.T) {
			var got, closed atomic.Int32
			up := serveAddr(t, func(c net.Conn) {
				buf := make([]byte, 4096)
				if readHeader(c, buf) != nil {
					return
				}
				got.Add(1)
				// Never answers; reads until the gateway closes.
				if _, err := io.Copy(io.Discard, c); err == nil {
					closed.Add(1)
				}
			})
			pk := newPicker(Proxy{ID: "p1", Addr: up})
			// A long ConnectTimeout: only the client's leaving ends the wait.
			g := startGateway(t, pk, func(c *Config) { c.ConnectTimeout = time.Minute })
			rc := dialGateway(t, g)
			rc.send("CONNECT 198.18.0.7:443 HTTP/1.1\r\nHost: 198.18.0.7:443\r\n" + aliceAuth + "\r\n")
			poll.Until(t, "the proxy has the CONNECT", 10*time.Second, func() bool { return got.Load() == 1 })
			time.Sleep(tc.after)
			rc.c.Close()
			poll.Until(t, "the gone client is counted and the proxy's connection closed", 10*time.Second, func() bool {
				return requests(g, kindConnect, outcomeClientGone) == 1 && closed.Load() == 1
			})
			if r := pk.gotReports(); len(r) != 0 {
				t.Fatalf("reports %v", r)
			}
			if n := testutil.ToFloat64(g.m.inFlight.WithLabelValues(kindConnect)); n != 0 {
				t.Fatalf("in flight %v", n)
			}
		})
	}
}
