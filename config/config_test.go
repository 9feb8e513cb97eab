package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const good = `
hosts:
  - {name: sim1, driver: sim, sim: {dir: /tmp/x}}
  - name: beelink
    ssh: {address: "host.example:22", user: proxyfleet, key_file: /k, known_hosts: /kh}
images:
  - {name: debian-12, url: "https://mirror.example/d.qcow2", sha256: "` + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" + `"}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	// The kvm keys (domain_type, budgets, ...) are left to kvm's defaults:
	// cmd/proxyfleet's TestKVMOptions_defaultsAreKVMs checks them.
	if c.DefaultImage != "debian-12" || c.Hosts[1].MaxProxies != 20 || c.Hosts[0].MaxProxies != 100 ||
		c.Proxy.Port != 3128 || c.NATS.Prefix != "proxy" || c.Health.Timeout != 1600*time.Millisecond {
		t.Fatalf("defaults not filled: %+v", c)
	}
}

func TestInvalidConfigNamesTheField(t *testing.T) {
	for _, tc := range []struct{ edit, field string }{
		{"hosts:\n  - {name: Bad_Name, driver: sim, sim: {dir: /x}}\n", "hosts[0].name"},
		{"hosts:\n  - {name: a, driver: xen}\n", "hosts[0].driver"},
		{"hosts:\n  - {name: a, ssh: {address: nope, user: u, key_file: k, known_hosts: kh}}\n", "hosts[0].ssh.address"},
		{"hosts:\n  - {name: a, ssh: {address: 'h:22', user: u, key_file: k}}\n", "hosts[0].ssh.known_hosts"},
		{"hosts:\n  - {name: a, driver: sim}\n", "hosts[0].sim.dir"},
		{"hosts:\n  - {name: a, domain_type: xen, ssh: {address: 'h:22', user: u, key_file: k, known_hosts: kh}}\n", "hosts[0].domain_type"},
		{"hosts:\n  - {name: a, budgets: {connect: -1s}, ssh: {address: 'h:22', user: u, key_file: k, known_hosts: kh}}\n", "hosts[0].budgets.connect"},
		{"hosts: []\n", "hosts"},
		{good + "proxy: {port: 70000}\n", "proxy.port"},
		{good + "default_image: nope\n", "default_image"},
		{good + "worker: {max_attempts: -1}\n", "worker.max_attempts"},
		{good + "health: {interval: 1s, timeout: 2s}\n", "health.timeout"},
		{good + "health: {concurrency: 5000}\n", "health.concurrency"},
		{good + "health: {lease_ttl: 2m}\n", "health.lease_ttl"},
		{good + "health: {target: 'ftp://x/'}\n", "health.target"},
		{good + "health: {probe_listen: '0.0.0.0:8081'}\n", "health.probe_listen"},
		{good + "health: {probe_listen: 'nope'}\n", "health.probe_listen"},
		{good + "worker: {observe_interval: -1s}\n", "worker.observe_interval"},
		{"hosts:\n  - {name: a, driver: sim, max_proxies: -1, sim: {dir: /x}}\n", "hosts[0].max_proxies"},
		{good + "worker: {quarantine_cool_down: 1m, quarantine_max_cool_down: 30s}\n", "worker.quarantine_max_cool_down"},
	} {
		_, err := Parse([]byte(tc.edit))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%q: %v, want field %s", tc.edit, err, tc.field)
		}
	}
	if _, err := Parse([]byte(good + "colour: red\n")); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("unknown key: %v", err)
	}
}
