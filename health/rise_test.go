package health_test

import (
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// A new proxy is probed as soon as its running event is folded, and again
// at once after each pass until it has risen: it enters the rotation
// without waiting for a round (here an hour away). One that fails is not
// probed again until the next round: a dead proxy is never probed in a
// loop.
func TestNewProxyRisesWithoutWaitingForARound(t *testing.T) {
	r := newRig(t)
	p := newFakeProber()
	h := r.start(health.Config{Prober: p, Interval: time.Hour, Timeout: time.Second, Rise: 2, Fall: 3, LeaseTTL: time.Second})
	waitFor(t, "the lease", h.Holder)
	p.set("198.18.100.1:3128", true)
	r.publish(leaseEvent("p1", 1, messages.StateRunning, "198.18.100.1"), leaseEvent("p2", 1, messages.StateRunning, "198.18.100.2"))
	r.waitSnapshot(map[string]string{"p2": "198.18.100.2:3128"})
	if n := p.count("198.18.100.2:3128"); n != 2 {
		t.Fatalf("p2 was probed %d times to rise, want 2 (rise)", n)
	}
	waitFor(t, "p1 probed", func() bool { return p.count("198.18.100.1:3128") >= 1 })
	r.publish(leaseEvent("p3", 1, messages.StateRunning, "198.18.100.3"))
	r.waitSnapshot(map[string]string{"p2": "198.18.100.2:3128", "p3": "198.18.100.3:3128"})
	if n := p.count("198.18.100.1:3128"); n != 1 {
		t.Fatalf("the failing p1 was probed %d times before a round, want 1", n)
	}
}
