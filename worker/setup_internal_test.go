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
func setUpTopology(t testing.TB) (*natstest.Server, *nats.Conn, jetstream.JetStream, context.Context) {
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

// countOf counts the messages published on subject (requests to the
// JetStream API, say) from now on. A synchronous subscription holds every
// message the server sent before a flush returns, so a count taken after
// a flush is exact; an asynchronous handler may not have run yet (under
// load, a count taken "before" a step took in reads of the step before).
func countOf(t testing.TB, nc *nats.Conn, subject string) func() int {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() int {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n, _, err := sub.Pending()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}
