package main

import (
	"testing"

	"proxyfleet/config"
	"proxyfleet/health"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// The defaults of the worker's, the topology's and the health process's
// settings are theirs (Config.WithDefaults, Topology.WithDefaults);
// config, which may import none of them, fills a file's gaps with copies of
// them. A role run from a file that leaves a setting out must run as one
// made in code that leaves it out.
func TestConfigDefaultsAreTheRoles(t *testing.T) {
	c, err := config.Parse([]byte("hosts:\n  - {name: h1, driver: sim, sim: {dir: /nonexistent}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, want := workerConfig(c, nil, nil).WithDefaults(), worker.Config{}.WithDefaults()
	if got.Topology != want.Topology {
		t.Errorf("topology from the file %+v, the worker's own %+v", got.Topology, want.Topology)
	}
	// Set-up makes the topology without a worker's config.
	if st, wt := topologyOf(c).WithDefaults(), (topology.Topology{}).WithDefaults(); st != wt {
		t.Errorf("set-up's topology from the file %+v, the topology's own %+v", st, wt)
	}
	gb, wb := got.Backoff.(worker.ExpBackoff), want.Backoff.(worker.ExpBackoff)
	hg, hw := healthConfig(c, nil).WithDefaults(), health.Config{}.WithDefaults()
	for _, d := range []struct {
		field      string
		file, role any
	}{
		{"worker.ack_wait", got.AckWait, want.AckWait},
		{"worker.max_attempts", got.MaxAttempts, want.MaxAttempts},
		{"worker.backoff_initial", gb.Initial, wb.Initial},
		{"worker.backoff_max", gb.Max, wb.Max},
		{"worker.ready_timeout", got.ReadyTimeout, want.ReadyTimeout},
		{"worker.poll_interval", got.PollInterval, want.PollInterval},
		{"worker.pinned_ttl", got.PinnedTTL, want.PinnedTTL},
		{"worker.concurrency", got.Concurrency, want.Concurrency},
		{"worker.drain_timeout", got.DrainTimeout, want.DrainTimeout},
		{"worker.check_interval", got.CheckInterval, want.CheckInterval},
		{"worker.observe_interval", got.ObserveInterval, want.ObserveInterval},
		{"worker.quarantine_failures", got.QuarantineFailures, want.QuarantineFailures},
		{"worker.quarantine_window", got.QuarantineWindow, want.QuarantineWindow},
		{"worker.quarantine_cool_down", got.QuarantineCoolDown, want.QuarantineCoolDown},
		{"worker.quarantine_max_cool_down", got.QuarantineMaxCoolDown, want.QuarantineMaxCoolDown},
		{"worker.heartbeat", got.Heartbeat, want.Heartbeat},
		{"worker.liveness", got.Liveness, want.Liveness},
		{"worker.sweep_grace", got.SweepGrace, want.SweepGrace},
		{"nats.deleted_max_age", got.DeletedTTL, want.DeletedTTL},
		{"proxy.port", got.ProxyPort, want.ProxyPort},
		{"nats.repair_interval", c.NATS.RepairInterval, topology.RepairerConfig{}.WithDefaults().Interval},
		{"health.http", hg.HTTPAddr, hw.HTTPAddr},
		{"health.interval", hg.Interval, hw.Interval},
		{"health.timeout", hg.Timeout, hw.Timeout},
		{"health.rise", hg.Rise, hw.Rise},
		{"health.fall", hg.Fall, hw.Fall},
		{"health.concurrency", hg.Concurrency, hw.Concurrency},
		{"health.lease_ttl", hg.LeaseTTL, hw.LeaseTTL},
		{"health.open_check_interval", hg.OpenCheckInterval, hw.OpenCheckInterval},
		{"health.report_interval", hg.ReportInterval, hw.ReportInterval},
		{"health.report_rate", hg.ReportRate, hw.ReportRate},
		{"health.snapshot_interval", hg.SnapshotInterval, hw.SnapshotInterval},
		{"health.snapshot_max_bytes", hg.SnapshotMaxBytes, hw.SnapshotMaxBytes},
	} {
		if d.file != d.role {
			t.Errorf("%s defaults to %v in the file, %v in the role", d.field, d.file, d.role)
		}
	}
}
