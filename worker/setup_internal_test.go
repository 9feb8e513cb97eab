package worker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// setUpTopology starts a server with the streams and buckets set up as
// `proxyfleet setup` makes them, and returns it, a connection to it, and
// a context that ends with the test (30s at most).
func setUpTopology(t *testing.T) (*natstest.Server, *nats.Conn, jetstream.JetStream, context.Context) {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := (topology.Topology{Subjects: messages.NewSubjects("")}).Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	return srv, nc, js, ctx
}
