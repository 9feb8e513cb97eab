package topology_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// TestSetupMovesR1ToR3 is docs/OPERATIONS.md's move from one replica to
// three, on a three-node cluster: set-up with replicas 1, a durable
// consumer made as a worker makes its own (no replica count of its own),
// then set-up again with replicas 3 updates every stream and bucket in
// place, and the consumer follows its stream to three replicas.
func TestSetupMovesR1ToR3(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	_, js := cl.Connect(t)
	topo := topology.Topology{Subjects: messages.NewSubjects(""), Replicas: 1}
	if _, err := topo.Setup(ctxFor(t, 30*time.Second), js); err != nil {
		t.Fatalf("set-up R1: %v", err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctxFor(t, 10*time.Second), messages.StreamCommands, jetstream.ConsumerConfig{
		Durable: "intake", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	topo.Replicas = 3
	changes, err := topo.Setup(ctxFor(t, 30*time.Second), js)
	if err != nil {
		t.Fatalf("set-up R3: %v", err)
	}
	want := len(topo.Streams()) + len(topo.Buckets())
	if len(changes) != want {
		t.Errorf("set-up R3 changed %d streams and buckets, want all %d: %v", len(changes), want, changes)
	}
	for _, c := range changes {
		if c.Created || len(c.Updated) != 1 || c.Updated[0].Field != "replicas" || c.Updated[0].Want != "3" {
			t.Errorf("set-up R3: %s, want replicas 1 → 3 in place", c)
		}
	}
	names := []string{}
	for _, s := range topo.Streams() {
		names = append(names, s.Name)
	}
	for _, b := range topo.Buckets() {
		names = append(names, topology.BucketStream(b.Bucket))
	}
	poll.Until(t, "every stream and the consumer at three current replicas", 60*time.Second, func() bool {
		for _, n := range names {
			st, err := js.Stream(ctxFor(t, 5*time.Second), n)
			if err != nil || st.CachedInfo().Config.Replicas != 3 || !current(st.CachedInfo().Cluster) {
				return false
			}
		}
		c, err := js.Consumer(ctxFor(t, 5*time.Second), messages.StreamCommands, "intake")
		return err == nil && current(c.CachedInfo().Cluster)
	})
	if changes, err := topo.Setup(ctxFor(t, 30*time.Second), js); err != nil || len(changes) != 0 {
		t.Errorf("set-up R3 again: %v, %v; want nothing to do", changes, err)
	}
}

// current: a leader and two replicas, both current.
func current(ci *jetstream.ClusterInfo) bool {
	if ci == nil || ci.Leader == "" || len(ci.Replicas) != 2 {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current {
			return false
		}
	}
	return true
}
