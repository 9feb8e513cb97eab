// Package natstest runs a real nats-server with JetStream inside a test
// process, on a loopback port, with its store in the test's temp dir; or,
// with StartCluster, several routed into one JetStream cluster, any node of
// which can be stopped and started again on its ports and store.
package natstest

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is an embedded nats-server.
type Server struct {
	*server.Server
	Dir  string
	opts *server.Options
}

// Start runs a server until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartDir(t, t.TempDir())
}

// StartOpts runs a server until the test ends, with edit applied to its
// options (users and permissions, say) before it starts.
func StartOpts(t testing.TB, edit func(*server.Options)) *Server {
	t.Helper()
	return start(t, t.TempDir(), edit)
}

// StartDir runs a server whose JetStream store is dir, so a restart on the
// same dir finds its streams again.
func StartDir(t testing.TB, dir string) *Server {
	t.Helper()
	return start(t, dir, nil)
}

func start(t testing.TB, dir string, edit func(*server.Options)) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	if edit != nil {
		edit(opts)
	}
	s := &Server{Dir: dir, opts: opts}
	s.Start(t)
	// A restart must come back on the same port, where clients reconnect.
	s.opts.Port = s.Addr().(*net.TCPAddr).Port
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server (again, after Stop: same port, same store).
func (s *Server) Start(t testing.TB) {
	t.Helper()
	srv, err := server.NewServer(s.opts.Clone())
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats-server: not ready within 10s")
	}
	s.Server = srv
}

// Reload applies edit to the server's options (its users and permissions,
// say) and reloads them into the running server, as a SIGHUP after a config
// change would. A restart keeps them. It may be called from any goroutine.
func (s *Server) Reload(edit func(*server.Options)) error {
	edit(s.opts)
	if err := s.ReloadOptions(s.opts.Clone()); err != nil {
		return fmt.Errorf("nats-server reload: %w", err)
	}
	return nil
}

// Stop shuts the server down and waits until it is down. Clients see it
// gone and reconnect once Start runs it again.
func (s *Server) Stop() {
	if s.Server == nil {
		return
	}
	s.Shutdown()
	s.WaitForShutdown()
}

// Connect returns a connection and its JetStream context, closed when the
// test ends.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, s.ClientURL(), opts...)
}

// connect dials url, reconnecting forever, and closes the connection when
// the test ends.
func connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
