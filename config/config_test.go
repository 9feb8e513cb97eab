package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"proxyfleet/addrplan"
	"proxyfleet/bans"
	consoledef "proxyfleet/console/defaults"
	"proxyfleet/deny"
	gwdef "proxyfleet/gateway/defaults"
	healthdef "proxyfleet/health/defaults"
	rotdef "proxyfleet/rotation/defaults"
)

const good = `
hosts:
  - {name: sim1, driver: sim, sim: {dir: /tmp/x}}
  - name: beelink
    ssh: {address: "host.example:22", user: proxyfleet, key_file: /k, known_hosts: /kh}
images:
  - {name: debian-12, url: "https://mirror.example/d.qcow2", sha256: "` + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" + `"}
proxy:
  auth: {user: fleet, password_file: /run/secrets/proxy-password}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	// The kvm keys (domain_type, budgets, ...) are left to kvm's defaults:
	// cmd/proxyfleet's TestKVMOptions_defaultsAreKVMs checks them.
	if c.DefaultImage != "debian-12" || c.Hosts[1].MaxProxies != 20 || c.Hosts[0].MaxProxies != 100 ||
		c.Proxy.Port != 3128 || c.NATS.Prefix != "proxy" || c.Health.Timeout != healthdef.Timeout(healthdef.Interval) {
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
		{strings.Replace(good, "proxy:\n", "proxy:\n  port: 70000\n", 1), "proxy.port"},
		{strings.Replace(good, "user: fleet", "user: 'fleet:x'", 1), "proxy.auth.user"},
		{strings.Replace(good, "user: fleet, ", "", 1), "proxy.auth.user"},
		{strings.Replace(good, "proxy:\n", "proxy:\n  allow: [198.18.0.0/15, nope]\n", 1), "proxy.allow[1]"},
		{strings.Replace(good, "proxy:\n", "proxy:\n  allow: ['198.18.0.0/33']\n", 1), "proxy.allow[0]"},
		{strings.Replace(good, "  auth: {user: fleet, password_file: /run/secrets/proxy-password}\n", "", 1), "proxy.auth"},
		{good + "default_image: nope\n", "default_image"},
		{good + "worker: {max_attempts: -1}\n", "worker.max_attempts"},
		{good + "health: {interval: 1s, timeout: 2s}\n", "health.timeout"},
		{good + "health: {concurrency: 5000}\n", "health.concurrency"},
		{good + "health: {lease_ttl: 2m}\n", "health.lease_ttl"},
		{good + "health: {target: 'ftp://x/'}\n", "health.target"},
		{good + "health: {probe_listen: '0.0.0.0:8081'}\n", "health.probe_listen"},
		{good + "health: {probe_listen: 'nope'}\n", "health.probe_listen"},
		{good + "worker: {observe_interval: -1s}\n", "worker.observe_interval"},
		{good + "worker: {observe_passes: -1}\n", "worker.observe_passes"},
		{"hosts:\n  - {name: a, driver: sim, max_proxies: -1, sim: {dir: /x}}\n", "hosts[0].max_proxies"},
		{good + "worker: {quarantine_cool_down: 1m, quarantine_max_cool_down: 30s}\n", "worker.quarantine_max_cool_down"},
		{good + "health: {report_rate: -1}\n", "health.report_rate"},
		{good + "health: {snapshot_interval: -1s}\n", "health.snapshot_interval"},
		{good + "health: {snapshot_interval: 2h}\n", "health.snapshot_interval"},
		{good + "health: {snapshot_max_bytes: -1}\n", "health.snapshot_max_bytes"},
		{good + "health: {snapshot_max_bytes: 100}\n", "health.snapshot_max_bytes"},
		{good + "health: {snapshot_rate: 100}\n", "health.snapshot_rate"},
		{good + "health: {snapshot_rate: -5}\n", "health.snapshot_rate"},
		{good + "gateway: {listen: '127.0.0.1:8888'}\n", "gateway.users"},
		{good + "gateway: {listen: nope, users: [{name: a, password_file: /p}]}\n", "gateway.listen"},
		{good + "gateway: {socks_listen: nope, users: [{name: a, password_file: /p}]}\n", "gateway.socks_listen"},
		{good + "gateway: {listen: ':8888', users: [{name: al-ice, password_file: /p}]}\n", "gateway.users[0].name"},
		{good + "gateway: {listen: ':8888', users: [{name: a, password_file: /p}, {name: a, password_file: /q}]}\n", "gateway.users[1].name"},
		{good + "gateway: {listen: ':8888', users: [{name: a}]}\n", "gateway.users[0].password_file"},
		{good + "console: {listen: '127.0.0.1:8080'}\n", "console.users"},
		{good + "console: {listen: '8080', users: [{name: a, password_file: /p}]}\n", "console.listen"},
		{good + "console: {http: 'x', users: [{name: a, password_file: /p}]}\n", "console.http"},
		{good + "console: {listen: ':8080', users: [{name: 'a b', password_file: /p}]}\n", "console.users[0].name"},
		{good + "console: {listen: ':8080', users: [{name: a, password_file: /p}, {name: a, password_file: /q}]}\n", "console.users[1].name"},
		{good + "console: {listen: ':8080', users: [{name: a}]}\n", "console.users[0].password_file"},
		{good + "console: {view_refresh: 500ms}\n", "console.view_refresh"},
		{good + "console: {view_refresh: -10s}\n", "console.view_refresh"},
		{good + "console: {gateways: ['http://127.0.0.1:9102', '127.0.0.1:9102']}\n", "console.gateways[1]"},
		{good + "console: {gateways: ['ftp://127.0.0.1:9102']}\n", "console.gateways[0]"},
		{good + "console: {gateways: ['http://127.0.0.1:9102/metrics']}\n", "console.gateways[0]"},
		{good + "console: {gateways: ['http://127.0.0.1:9102', 'http://127.0.0.1:9102']}\n", "console.gateways[1]"},
		{good + "gateway: {strategy: fastest}\n", "gateway.strategy"},
		{good + "gateway: {cooldown: -1s}\n", "gateway.cooldown"},
		{good + "gateway: {cooldown: 2h}\n", "gateway.cooldown"},
		{good + "gateway: {first_byte_timeout: 40s}\n", "gateway.first_byte_timeout"},
		{good + "gateway: {deny: [198.18.0.0/15, '2001:db8::/32', x]}\n", "gateway.deny[2]"},
		{good + "gateway: {deny: ['fe80::1%eth0']}\n", "gateway.deny[0]"},
		{good + "gateway: {rules: [{status: [403], retry: true}, {status: [200, 700], ban: 1m}]}\n", "gateway.rules[1].status[1]"},
		{good + "gateway: {rules: [{status: [403]}]}\n", "gateway.rules[0].ban"},
		{good + "gateway: {rules: [{body: captcha, ban: 2h}]}\n", "gateway.rules[0].sites"},
		{good + "gateway: {rules: [{sites: ['*.shop.example'], body: '(?i', ban: 2h}]}\n", "gateway.rules[0].body"},
		{good + "gateway: {rules: [{sites: ['shop.example', 'a b'], status: [403], ban: 2h}]}\n", "gateway.rules[0].sites[1]"},
		{good + "gateway: {rules: [{status: [403], ban: 1ms}]}\n", "gateway.rules[0].ban"},
		{strings.Replace(good, "proxy:\n", "proxy:\n  deny: [169.254.0.0/16, example.com]\n", 1), "proxy.deny[1]"},
		{strings.Replace(good, "proxy:\n", "proxy:\n  deny: ['198.18.0.0/33']\n", 1), "proxy.deny[0]"},
		{good + "health: {probe_listen: '127.0.0.1:8081'}\n", "health.probe_listen"},
		{good + "health: {target: 'http://169.254.169.254/probe'}\n", "health.target"},
		{good + "health: {target: 'http://[fd00::1]:8081/probe'}\n", "health.target"},
		{good + "health: {target_ipv6: 'http://[2001:db8::1]/probe'}\n", "health.target_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', target_ipv6: 'http://198.18.0.1/probe'}\n", "health.target_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', target_ipv6: 'ftp://[2001:db8::1]/'}\n", "health.target_ipv6"},
		{good + "health: {probe_listen: '[2001:db8::1]:8081', target_ipv6: 'http://[2001:db8::2]/probe'}\n", "health.target_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', probe_listen_ipv6: '198.18.0.1:8082'}\n", "health.probe_listen_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', probe_listen_ipv6: '[::]:8082'}\n", "health.probe_listen_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', probe_listen_ipv6: 'nope'}\n", "health.probe_listen_ipv6"},
		{good + "health: {probe_listen: '198.18.0.1:8081', probe_listen_ipv6: '[fd00::1]:8082'}\n", "health.probe_listen_ipv6"},
		{"hosts:\n  - {name: a, driver: sim, sim: {dir: /x}, addresses: {ipv4: [203.0.113.8/33]}}\n", "hosts[0].addresses.ipv4[0]"},
		{"hosts:\n  - {name: a, driver: sim, sim: {dir: /x}, addresses: {ipv6: ['2001:db8::/64'], ipv6_per_proxy: 300}}\n", "hosts[0].addresses.ipv6_per_proxy"},
		{"hosts:\n  - {name: a, driver: sim, sim: {dir: /x}, addresses: {}}\n", "hosts[0].addresses.ipv4"},
		{"hosts:\n  - {name: a, driver: sim, sim: {dir: /x}, addresses: {ipv4: [203.0.113.8/29]}}\n  - {name: b, driver: sim, sim: {dir: /y}, addresses: {ipv4: [203.0.113.12]}}\n", "hosts[1].addresses"},
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

// An IPv6 probe target is optional (none by default); beside an IPv4
// one, health's own /probe on an IPv6 address or a URL.
func TestIPv6ProbeTarget(t *testing.T) {
	for _, edit := range []string{
		"health: {probe_listen: '198.18.0.1:8081'}\n",
		"health: {probe_listen: '198.18.0.1:8081', probe_listen_ipv6: '[2001:db8::1]:8081'}\n",
		"health: {target: 'http://probe.example/probe', target_ipv6: 'http://probe6.example/probe', probe_listen_ipv6: '[::]:8081'}\n",
	} {
		c, err := Parse([]byte(good + edit))
		if err != nil {
			t.Fatalf("%q: %v", edit, err)
		}
		if edit == "health: {probe_listen: '198.18.0.1:8081'}\n" && (c.Health.TargetIPv6 != "" || c.Health.ProbeListenIPv6 != "") {
			t.Errorf("an IPv6 target by default: %+v", c.Health)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	c, err := Parse([]byte(`
hosts:
  - name: h1
    driver: sim
    sim: {dir: /x}
    addresses:
      ipv4: [203.0.113.8/29, 198.51.100.7]
      ipv4_gateway: 203.0.113.1
      macs: {198.51.100.7: "00:50:56:00:12:34"}
      ipv6: [2001:db8:1:2::/64]
      ipv6_gateway: fe80::1
      ipv6_per_proxy: 16
      reuse_after: 30m
  - {name: h2, driver: sim, sim: {dir: /y}}
`))
	if err != nil {
		t.Fatal(err)
	}
	plans := c.Plans()
	p := plans["h1"]
	if len(plans) != 1 || p == nil || p.Slots4() != 7 || p.PerProxy6() != 16 || p.ReuseAfter() != 30*time.Minute {
		t.Fatalf("plans = %v", plans)
	}
	if n := p.Network(addrplan.Slots{V4: 7, V6: 1}); n.MAC != "00:50:56:00:12:34" || n.IPv6Gateway.String() != "fe80::1" {
		t.Errorf("network = %+v", n)
	}
}

// A kvm host's proxies must not be open by accident: with neither a
// credential nor an allow-list, only proxy.open: true passes; sim hosts
// (no real proxy) need nothing.
func TestOpenProxiesOnlyWhenSaid(t *testing.T) {
	open := strings.Replace(good, "  auth: {user: fleet, password_file: /run/secrets/proxy-password}\n", "", 1)
	for _, tc := range []struct {
		name, yaml string
		ok         bool
	}{
		{"no auth, no allow", open, false},
		{"open: true", strings.Replace(open, "proxy:\n", "proxy:\n  open: true\n", 1), true},
		{"allow only", strings.Replace(open, "proxy:\n", "proxy:\n  allow: [198.18.0.0/15, 198.18.0.1]\n", 1), true},
		{"auth", good, true},
		{"sim hosts only", "hosts:\n  - {name: sim1, driver: sim, sim: {dir: /tmp/x}}\n", true},
	} {
		_, err := Parse([]byte(tc.yaml))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestParseAllow(t *testing.T) {
	for in, want := range map[string]string{
		"198.18.0.0/15": "198.18.0.0/15", "198.18.3.4/14": "198.16.0.0/14", "198.18.0.1": "198.18.0.1/32", "::1": "::1/128",
	} {
		p, err := ParseAllow(in)
		if err != nil || p.String() != want {
			t.Errorf("ParseAllow(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for _, in := range []string{"", "nope", "1.2.3.4/40", "fe80::1%eth0", "1.2.3"} {
		if _, err := ParseAllow(in); err == nil {
			t.Errorf("ParseAllow(%q) passed", in)
		}
	}
}

// The password comes from its file (trailing newline dropped) or else the
// environment; a missing, empty or unusable one is refused naming the
// field, and the error never carries the password.
func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	load := func(file string, env map[string]string) (*Config, error) {
		c, err := Parse([]byte(good))
		if err != nil {
			t.Fatal(err)
		}
		c.Proxy.Auth.PasswordFile = file
		return c, c.LoadSecrets(func(k string) string { return env[k] })
	}
	c, err := load(write("ok", "hunter2-long-enough\n"), map[string]string{PasswordEnv: "from-env"})
	if err != nil || c.Proxy.Auth.Password.Reveal() != "hunter2-long-enough" {
		t.Fatalf("file: %v, %q", err, c.Proxy.Auth.Password.Reveal())
	}
	c, err = load("", map[string]string{PasswordEnv: "from-env"})
	if err != nil || c.Proxy.Auth.Password.Reveal() != "from-env" {
		t.Fatalf("env: %v", err)
	}
	for name, tc := range map[string]struct {
		file string
		env  map[string]string
	}{
		"missing file": {dir + "/nope", nil},
		"empty file":   {write("empty", "\n"), nil},
		"newline":      {write("nl", "two\nlines-secret\n"), nil},
		"too long":     {write("long", strings.Repeat("x", 73)), nil},
		"neither":      {"", nil},
		"bad env":      {"", map[string]string{PasswordEnv: "tab\tsecret"}},
	} {
		_, err := load(tc.file, tc.env)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "proxy.auth.password_file" {
			t.Errorf("%s: %v, want field proxy.auth.password_file", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
	// No user, no password needed.
	c, _ = Parse([]byte("hosts:\n  - {name: sim1, driver: sim, sim: {dir: /tmp/x}}\n"))
	if err := c.LoadSecrets(func(string) string { return "" }); err != nil {
		t.Errorf("no auth: %v", err)
	}
}

func TestGatewayDefaultsAndSecrets(t *testing.T) {
	dir := t.TempDir()
	pw := dir + "/alice"
	if err := os.WriteFile(pw, []byte("alice-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(good + "gateway: {listen: '127.0.0.1:8888', users: [{name: alice, password_file: " + pw + "}, {name: bob, password_file: " + dir + "/bob}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Gateway
	if g.Strategy != rotdef.Strategy || *g.Retries != gwdef.Retries || *g.RetryBodyBytes != gwdef.RetryBodyBytes || g.ConnectTimeout != gwdef.ConnectTimeout || g.ResponseTimeout != gwdef.ResponseTimeout ||
		g.Cooldown != rotdef.Cooldown || g.AuthFailures != gwdef.AuthFailures || g.MaxHeaderBytes != gwdef.MaxHeaderBytes ||
		g.MaxHeaderFields != gwdef.MaxHeaderFields || g.HeaderTimeout != gwdef.HeaderTimeout || g.MaxUnauthenticated != gwdef.MaxUnauthenticated ||
		g.Users[0].MaxConns != gwdef.MaxConns || g.FirstByteTimeout != gwdef.FirstByteTimeout || g.IdleTimeout != gwdef.IdleTimeout ||
		g.KeepAliveTimeout != gwdef.KeepAliveTimeout || g.BodyPeek != gwdef.BodyPeek || c.Health.ReportInterval != healthdef.ReportInterval || c.Health.ReportRate != healthdef.ReportRate {
		t.Fatalf("defaults not filled: %+v %+v", g, c.Health)
	}
	err = c.LoadGatewaySecrets()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "gateway.users[1].password_file" {
		t.Fatalf("bob's missing password: %v, want field gateway.users[1].password_file", err)
	}
	c.Gateway.Users = c.Gateway.Users[:1]
	if err := c.LoadGatewaySecrets(); err != nil || c.Gateway.Users[0].Password.Reveal() != "alice-secret" {
		t.Fatalf("alice: %v", err)
	}
	if b, _ := yaml.Marshal(c.Gateway); strings.Contains(string(b), "alice-secret") {
		t.Fatalf("the gateway config shows a password: %s", b)
	}
}

// console.view_refresh defaults to the console's own constant; the
// gateways it reads are taken as given.
func TestConsoleDefaults(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.Console.ViewRefresh != consoledef.ViewRefresh || c.Console.Gateways != nil {
		t.Fatalf("defaults: view_refresh %v, gateways %v", c.Console.ViewRefresh, c.Console.Gateways)
	}
	c, err = Parse([]byte(good + "console: {view_refresh: 30s, gateways: ['http://127.0.0.1:9102', 'https://[2001:db8::1]:9102/']}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Console.ViewRefresh != 30*time.Second || len(c.Console.Gateways) != 2 {
		t.Fatalf("set: view_refresh %v, gateways %v", c.Console.ViewRefresh, c.Console.Gateways)
	}
}

func TestConsoleSecrets(t *testing.T) {
	dir := t.TempDir()
	pw := dir + "/ops"
	if err := os.WriteFile(pw, []byte("ops-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(good + "console: {listen: '127.0.0.1:8080', users: [{name: ops, password_file: " + pw + ", admin: true}, {name: viewer, password_file: " + dir + "/viewer}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.LoadConsoleSecrets()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "console.users[1].password_file" {
		t.Fatalf("viewer's missing password: %v, want field console.users[1].password_file", err)
	}
	c.Console.Users = c.Console.Users[:1]
	if err := c.LoadConsoleSecrets(); err != nil || c.Console.Users[0].Password.Reveal() != "ops-secret" || !c.Console.Users[0].Admin {
		t.Fatalf("ops: %v %+v", err, c.Console.Users[0])
	}
	if b, _ := yaml.Marshal(c.Console); strings.Contains(string(b), "ops-secret") {
		t.Fatalf("the console config shows a password: %s", b)
	}
}

// The rules of the example parse, compile and decide.
func TestGatewayRules(t *testing.T) {
	c, err := Parse([]byte(good + `gateway:
  rules:
    - {status: [403, 429], ban: 30m, retry: true}
    - {sites: ["*.shop.example"], body: "(?i)captcha", ban: 2h, retry: true}
    - {status: [503], retry: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.BodyPeek != 16<<10 || *c.Gateway.RetryBodyBytes != 64<<10 {
		t.Errorf("body_peek %d, retry_body_bytes %d: defaults not filled", c.Gateway.BodyPeek, *c.Gateway.RetryBodyBytes)
	}
	rs, err := c.Gateway.CompiledRules()
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.Match(bans.Answer{Host: "www.shop.example", Status: 200, Body: []byte("Captcha")}); got.Rule != 1 || got.Ban != 2*time.Hour || !got.Retry {
		t.Errorf("captcha under shop.example: %+v", got)
	}
}

// A Secret never shows itself through fmt, slog, JSON or YAML.
func TestSecretRedacts(t *testing.T) {
	s := Secret("hunter2")
	var buf strings.Builder
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "pw", s, "auth", ProxyAuth{User: "u", Password: s})
	j, _ := json.Marshal(ProxyAuth{User: "u", Password: s})
	y, _ := yaml.Marshal(Config{Proxy: Proxy{Auth: ProxyAuth{User: "u", Password: s}}})
	for name, out := range map[string]string{
		"%v": fmt.Sprintf("%v", s), "%q": fmt.Sprintf("%q", s), "%#v": fmt.Sprintf("%#v", ProxyAuth{Password: s}),
		"%+v": fmt.Sprintf("%+v", ProxyAuth{Password: s}), "slog": buf.String(), "json": string(j), "yaml": string(y),
	} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("%s shows the secret: %s", name, out)
		}
	}
	if s.Reveal() != "hunter2" {
		t.Errorf("Reveal = %q", s.Reveal())
	}
}

// proxy.deny and gateway.deny: absent (or null) is the default list, an
// empty list denies nothing, a list is read as written.
func TestDenyLists(t *testing.T) {
	def := deny.Default().Strings()
	for _, tc := range []struct {
		name, edit     string
		proxy, gateway []string
	}{
		{"absent", good, def, def},
		{"null", strings.Replace(good, "proxy:\n", "proxy:\n  deny: null\n", 1) + "gateway: {deny: ~}\n", def, def},
		{"empty", strings.Replace(good, "proxy:\n", "proxy:\n  deny: []\n", 1) + "gateway: {deny: []}\n", []string{}, []string{}},
		{"lists", strings.Replace(good, "proxy:\n", "proxy:\n  deny: [169.254.169.254, 'fd00::/8']\n", 1) + "gateway: {deny: ['198.19.2.3/15', '::ffff:127.0.0.1']}\n",
			[]string{"169.254.169.254/32", "fd00::/8"}, []string{"198.18.0.0/15", "127.0.0.1/32"}},
		{"one of them", good + "gateway: {deny: []}\n", def, []string{}},
	} {
		c, err := Parse([]byte(tc.edit))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		p, err := c.Proxy.DenyList()
		if err != nil || !slices.Equal(p.Strings(), tc.proxy) {
			t.Errorf("%s: proxy.deny %v, %v; want %v", tc.name, p.Strings(), err, tc.proxy)
		}
		g, err := c.Gateway.DenyList()
		if err != nil || !slices.Equal(g.Strings(), tc.gateway) {
			t.Errorf("%s: gateway.deny %v, %v; want %v", tc.name, g.Strings(), err, tc.gateway)
		}
	}
	// A list that does not parse is named by the error, entry and all.
	_, err := Parse([]byte(good + "gateway: {deny: [198.18.0.0/15, '2001:db8::/32', x]}\n"))
	if want := `invalid config: gateway.deny[2]: "x" is not a CIDR or address`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %s", err, want)
	}
	// A config written back out reads back the same: absent stays absent
	// (the default), empty stays empty.
	for _, edit := range []string{good, good + "gateway: {deny: []}\n"} {
		c, err := Parse([]byte(edit))
		if err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Parse(b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		g1, _ := c.Gateway.DenyList()
		g2, _ := c2.Gateway.DenyList()
		if !slices.Equal(g1.Strings(), g2.Strings()) {
			t.Errorf("written and read back: gateway.deny %v, was %v", g2.Strings(), g1.Strings())
		}
	}
}

// A probe target in proxy.deny is refused only where the default squid
// enforces proxy.deny: with kvm hosts and no user_data template.
func TestProbeTargetInProxyDeny(t *testing.T) {
	sim := "hosts:\n  - {name: sim1, driver: sim, sim: {dir: /tmp/x}}\n"
	for _, tc := range []struct {
		name, yaml string
		ok         bool
	}{
		{"kvm, default list", good + "health: {probe_listen: '127.0.0.1:8081'}\n", false},
		{"kvm, target by name", good + "health: {target: 'http://probe.example:8081/probe'}\n", true},
		{"kvm, outside the list", good + "health: {probe_listen: '198.18.0.1:8081'}\n", true},
		{"kvm, the list without it", strings.Replace(good, "proxy:\n", "proxy:\n  deny: ['fd00::/8']\n", 1) + "health: {probe_listen: '127.0.0.1:8081'}\n", true},
		{"kvm, nothing denied", strings.Replace(good, "proxy:\n", "proxy:\n  deny: []\n", 1) + "health: {probe_listen: '127.0.0.1:8081'}\n", true},
		{"kvm, a template", strings.Replace(good, "proxy:\n", "proxy:\n  user_data: '#cloud-config'\n", 1) + "health: {probe_listen: '127.0.0.1:8081'}\n", true},
		{"sim only", sim + "health: {target: 'http://127.0.0.1:8081/probe', probe_listen: '127.0.0.1:8081'}\n", true},
	} {
		_, err := Parse([]byte(tc.yaml))
		if tc.ok && err != nil || !tc.ok && err == nil {
			t.Errorf("%s: %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
