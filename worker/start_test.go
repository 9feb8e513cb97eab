package worker_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/worker"
)

// A worker whose consumers cannot be made yet (a request the server does
// not answer in time: in a cluster, replicated consumers that take longer
// than one request to form) tries again instead of failing to start. Here
// the worker's user may not create the work consumer at first, so the
// server never answers it, as a slow cluster would not; once permitted, the
// worker starts. Before, Run returned "create consumer ...: context
// deadline exceeded" and a `proxyfleet worker` process exited.
func TestWorkerStartsOnceItsConsumerCanBeMade(t *testing.T) {
	noCreate := &server.Permissions{Publish: &server.SubjectPermission{
		Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.CREATE.PROXY_WORK.>"},
	}}
	srv := natstest.StartOpts(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "all", Password: "all"},
			{Username: "w", Password: "w", Permissions: noCreate},
		}
	})
	r := newRigOn(t, srv, nats.UserInfo("all", "all"), "h1")
	retried, reloaded := make(chan struct{}), make(chan struct{})
	var once sync.Once
	log := slog.New(onMessage{"consumer work-h1 on PROXY_WORK: not ready, trying again", func() { once.Do(func() { close(retried) }) }})
	go func() {
		defer close(reloaded)
		select {
		case <-retried:
		case <-time.After(30 * time.Second):
			return // the worker never tried again: the test fails below
		}
		if err := srv.Reload(func(o *server.Options) {
			o.Users = []*server.User{{Username: "all", Password: "all"}, {Username: "w", Password: "w"}}
		}); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { <-reloaded })
	r.startWorkerAs(nats.UserInfo("w", "w"), func(c *worker.Config) {
		c.CheckInterval = 100 * time.Millisecond
		c.Logger = log
	})
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
}

// onMessage is a log handler that calls do for every record whose message
// is msg.
type onMessage struct {
	msg string
	do  func()
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.do()
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }
