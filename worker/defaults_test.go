package worker_test

import (
	"testing"
	"time"

	"proxyfleet/topology"
	"proxyfleet/worker"
)

// AckWait, MaxAttempts and PinnedTTL are the worker's and its consumers':
// set on one side only, both sides take it (a worker that kept the default
// AckWait while its consumers had a shorter one would tick InProgress too
// rarely and see its work redelivered while it runs).
func TestDefaultsShareWhatTheConsumersUse(t *testing.T) {
	c := worker.Config{Topology: topology.Topology{AckWait: 7 * time.Second, MaxAttempts: 3}, PinnedTTL: 4 * time.Second}.WithDefaults()
	if c.AckWait != 7*time.Second || c.MaxAttempts != 3 || c.PinnedTTL != 4*time.Second {
		t.Errorf("worker: ack wait %s, max attempts %d, pinned ttl %s; want 7s, 3, 4s", c.AckWait, c.MaxAttempts, c.PinnedTTL)
	}
	if tp := c.Topology; tp.AckWait != 7*time.Second || tp.MaxAttempts != 3 || tp.PinnedTTL != 4*time.Second {
		t.Errorf("consumers: ack wait %s, max attempts %d, pinned ttl %s; want 7s, 3, 4s", tp.AckWait, tp.MaxAttempts, tp.PinnedTTL)
	}
	d := worker.Config{}.WithDefaults()
	if d.AckWait != 30*time.Second || d.Topology.AckWait != d.AckWait || d.Topology.Subjects != d.Subjects {
		t.Errorf("defaults: ack wait %s (consumers %s), subjects %v (topology %v)", d.AckWait, d.Topology.AckWait, d.Subjects, d.Topology.Subjects)
	}
}
