// Package natstest runs a real nats-server with JetStream inside a test
// process, on a loopback port, with its store in the test's temp dir.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is an embedded nats-server.
type Server struct {
	*server.Server
	Dir string
}

// Start runs a server until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartDir(t, t.TempDir())
}

// StartDir runs a server whose JetStream store is dir, so a restart on the
// same dir finds its streams again.
func StartDir(t testing.TB, dir string) *Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server: not ready within 10s")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Server{Server: s, Dir: dir}
}

// Connect returns a connection and its JetStream context, closed when the
// test ends.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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
