package health_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// With no probe target, health probes a TCP connect to each proxy: a VM
// with nothing listening on its proxy port never enters the rotation, one
// with a listener does, and a sim proxy (no address to probe) enters on its
// event as before.
func TestNoTargetProbesByTCPConnect(t *testing.T) {
	r := newRig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	logger, logs := captureLog(t)
	h := r.start(health.Config{Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, LeaseTTL: time.Second, Logger: logger,
		ProxyUser: fleetUser, ProxyPassword: fleetPassword})
	lip, lport := splitAddr(t, ln.Addr().String())
	dip, dport := splitAddr(t, deadAddr)
	listening := leaseEvent("up", 1, messages.StateRunning, lip)
	listening.Port = lport
	nothing := leaseEvent("down", 1, messages.StateRunning, dip)
	nothing.Port = dport
	r.publish(listening, nothing, event("sim1", 1, messages.StateRunning, "198.18.100.1"))
	want := map[string]string{"up": ln.Addr().String(), "sim1": "198.18.100.1:3128"}
	r.waitSnapshot(want)
	// Several rounds later the VM with nothing listening is still out.
	n := h.Metrics().Probes[health.ResultError]
	waitFor(t, "three failed probes of the silent VM", func() bool { return h.Metrics().Probes[health.ResultError] >= n+3 })
	r.waitBucket(want)
	if m := h.Metrics(); m.Probing || m.ProbeKinds[health.KindTCP] < 4 || m.ProbeKinds[health.KindHTTP] != 0 || m.Targets != 2 || m.Checks != 0 {
		t.Fatalf("metrics %+v: want TCP probes of the two VMs, none of the sim proxy, and no check records", m)
	}
	const warn = "probing by TCP connect only: configure health.probe_listen or health.target to probe through the proxies"
	if n := strings.Count(logs.String(), warn); n != 1 || !strings.Contains(logs.String(), "level=WARN msg=\""+warn) {
		t.Fatalf("the warning was logged %d times, want once at warn level", n)
	}
	noSecret(t, "the log", logs.String())
}
