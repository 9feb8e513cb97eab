package worker_test

import (
	"context"
	"testing"
	"time"

	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker"
	"proxyfleet/worker/hostshare"
)

// A host whose work consumer is pinned to a pull request nobody answers
// any more (left by a consume that stopped; here a client's request that
// was given a message, and the client gone) does not wait out pinned_ttl:
// its assigned worker, pulling it without a pin, finds that no worker's
// record holds the pin, unpins it, and the host's work runs. After ten
// workers started together, the proxies of a few hosts waited the whole
// pinned_ttl (15s).
func TestStrayPinIsReleased(t *testing.T) {
	r := newRig(t, "h1")
	long := func(c *worker.Config) { c.PinnedTTL = 5 * time.Minute }
	// A first worker makes the host's consumer, works, and goes: it
	// unpins the host.
	w := r.startWorker(long)
	r.create("p0", "c0", `,"host":"h1"`)
	r.waitOutcome("c0", messages.OutcomeDone)
	if err := r.stopWorker(w); err != nil {
		t.Fatal(err)
	}

	// A pull request of the owners' group from a client that is no
	// worker: the server pins it as it delivers a message to it.
	nc, _ := r.srv.Connect(t)
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + messages.StreamWork + "." + topology.WorkConsumer("h1")
	if err := nc.PublishRequest(next, inbox, []byte(`{"batch":1,"expires":60000000000,"group":"`+topology.PriorityGroup+`"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.js.Publish(ctx, subj.Work("h1", "_claim"), nil); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pin := m.Header.Get("Nats-Pin-Id")
	if pin == "" {
		t.Fatalf("the client's request was not pinned: %v", m.Header)
	}
	_ = sub.Unsubscribe()
	owners, err := hostshare.Owners(ctx, r.js, []string{"h1"})
	if err != nil {
		t.Fatal(err)
	}
	if owners["h1"].Pin != pin {
		t.Fatalf("h1 pinned to %q, want the client's %q", owners["h1"].Pin, pin)
	}

	start := time.Now()
	r.startWorker(long)
	r.create("p1", "c1", `,"host":"h1"`)
	r.waitOutcome("c1", messages.OutcomeDone) // well within pinned_ttl
	t.Logf("p1 done %s after the worker started (pinned_ttl 5m)", time.Since(start).Round(time.Millisecond))
}
