package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/poll"
)

// Cluster is n embedded nats-servers routed into one JetStream cluster on
// loopback, each with its own store, so streams and buckets can have
// replicas. A node stopped with Stop comes back with Start on the same
// client and route ports and the same store.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs a cluster of n nodes until the test ends and waits
// until its JetStream has a meta leader that every node follows.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	// The route ports are chosen up front: every node's routes name all
	// the others from its first start, so the JetStream meta group forms
	// with all n peers known.
	routes := make([]int, n)
	for i := range routes {
		routes[i] = freePort(t)
	}
	c := &Cluster{}
	for i := range n {
		c.Nodes = append(c.Nodes, start(t, t.TempDir(), func(o *server.Options) {
			o.ServerName = fmt.Sprintf("n%d", i+1)
			o.Cluster = server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: routes[i]}
			for j, p := range routes {
				if j != i {
					o.Routes = append(o.Routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
				}
			}
		}))
	}
	c.WaitReady(t)
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// URLs is the client URL of every node, comma-separated, as nats.Connect
// and proxyfleet's --nats-url take them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port)
	}
	return strings.Join(urls, ",")
}

// Node returns the node named name (n1, n2, ...), or nil.
func (c *Cluster) Node(name string) *Server {
	for _, s := range c.Nodes {
		if s.opts.ServerName == name {
			return s
		}
	}
	return nil
}

// Name is the node's server name.
func (s *Server) Name() string { return s.opts.ServerName }

// Running reports whether the node is up (it was not stopped, or was
// started again).
func (s *Server) Running() bool { return s.Server != nil && s.Server.Running() }

// WaitReady waits until the running nodes agree on a JetStream meta leader
// and each is current with it.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	poll.Until(t, "the JetStream cluster to have a leader every node follows", 30*time.Second, func() bool {
		leader := false
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return false
			}
			leader = leader || s.JetStreamIsLeader()
		}
		return leader
	})
}

// Connect returns a connection to every node (it reconnects to another
// when one stops) and its JetStream context, closed when the test ends.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, c.URLs(), opts...)
}
