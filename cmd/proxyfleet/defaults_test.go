package main

import (
	"testing"

	"proxyfleet/config"
	"proxyfleet/health"
)

// The defaults of the health process's settings are health's
// (Config.WithDefaults); config, which may import nothing that leans on
// NATS, fills a file's gaps with copies of them. A health process run from
// a file that leaves a setting out must run as one made in code that
// leaves it out. (The worker's and the topology's defaults are constants
// that config and the roles share: nothing to hold equal.)
func TestConfigDefaultsAreHealths(t *testing.T) {
	c, err := config.Parse([]byte("hosts:\n  - {name: h1, driver: sim, sim: {dir: /nonexistent}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	hg, hw := healthConfig(c, nil).WithDefaults(), health.Config{}.WithDefaults()
	for _, d := range []struct {
		field      string
		file, role any
	}{
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
