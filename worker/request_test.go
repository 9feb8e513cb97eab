package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/worker"
)

// A reply that never comes is given up after one request's timeout, not
// after the handler's own budget. In a cluster that is a publish that
// reached a node which then stopped: the client reconnects to another node
// at once (so the fence never cuts), and the reply is lost. Here the
// answers' stream is deleted while a client listens on their subject, so
// the publish of the result of a create, made while waiting under the ready
// budget (ten minutes), is never answered. The executor must fail it after
// the request timeout (a second on the rig's connection) and retry, rather
// than hold the work item in progress, and the host's pool slot, for ten
// minutes.
func TestLostReplyIsGivenUpAfterTheRequestTimeout(t *testing.T) {
	r := newRig(t, "h1")
	l := &retryLog{}
	r.startWorker(func(c *worker.Config) {
		c.ReadyTimeout = 10 * time.Minute
		c.OnRetry = l.add
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.js.DeleteStream(ctx, messages.StreamResults); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c1", "")
	r.waitFor("the create to run on h1", 10*time.Second, func() bool { return r.domainExists("h1", "p1") })
	r.waitFor("the lost answer to be given up and retried", 20*time.Second, func() bool {
		for _, ri := range l.list() {
			if ri.ID == "p1" && strings.Contains(ri.Err.Error(), "publish result") {
				return true
			}
		}
		return false
	})
}
