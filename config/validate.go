package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"proxyfleet/addrplan"
	consoledef "proxyfleet/console/defaults"
	"proxyfleet/deny"
	healthdef "proxyfleet/health/defaults"
	"proxyfleet/messages"
	rotdef "proxyfleet/rotation/defaults"
)

// FieldError names the bad field by its YAML path.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "invalid config: " + e.Field + ": " + e.Reason }

func bad(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate returns the first bad field.
func (c *Config) Validate() error {
	if !messages.ValidPrefix(c.NATS.Prefix) {
		return bad("nats.prefix", "%q is not a valid subject prefix", c.NATS.Prefix)
	}
	if c.NATS.Replicas < 1 || c.NATS.Replicas > 5 {
		return bad("nats.replicas", "%d is out of range [1, 5]", c.NATS.Replicas)
	}
	if (c.NATS.TLS.Cert == "") != (c.NATS.TLS.Key == "") {
		return bad("nats.tls", "cert and key go together")
	}
	for _, d := range []struct {
		f string
		v time.Duration
	}{
		{"nats.duplicate_window", c.NATS.DuplicateWindow},
		{"nats.results_max_age", c.NATS.ResultsMaxAge},
		{"nats.deleted_max_age", c.NATS.DeletedMaxAge},
		{"nats.command_id_max_age", c.NATS.CommandIDMaxAge},
		{"nats.repair_interval", c.NATS.RepairInterval},
		{"worker.ack_wait", c.Worker.AckWait},
		{"worker.backoff_initial", c.Worker.BackoffInitial},
		{"worker.backoff_max", c.Worker.BackoffMax},
		{"worker.ready_timeout", c.Worker.ReadyTimeout},
		{"worker.poll_interval", c.Worker.PollInterval},
		{"worker.pinned_ttl", c.Worker.PinnedTTL},
		{"worker.drain_timeout", c.Worker.DrainTimeout},
		{"worker.check_interval", c.Worker.CheckInterval},
		{"worker.observe_interval", c.Worker.ObserveInterval},
		{"worker.quarantine_window", c.Worker.QuarantineWindow},
		{"worker.quarantine_cool_down", c.Worker.QuarantineCoolDown},
		{"worker.quarantine_max_cool_down", c.Worker.QuarantineMaxCoolDown},
		{"worker.heartbeat", c.Worker.Heartbeat},
		{"worker.liveness", c.Worker.Liveness},
		{"worker.sweep_grace", c.Worker.SweepGrace},
		{"health.interval", c.Health.Interval},
		{"health.timeout", c.Health.Timeout},
		{"health.grace", c.Health.Grace},
		{"health.lease_ttl", c.Health.LeaseTTL},
		{"health.open_check_interval", c.Health.OpenCheckInterval},
		{"health.report_interval", c.Health.ReportInterval},
		{"health.snapshot_interval", c.Health.SnapshotInterval},
		{"gateway.cooldown", c.Gateway.Cooldown},
	} {
		if d.v < 0 {
			return bad(d.f, "negative duration %s", d.v)
		}
	}
	if c.NATS.CommandIDMaxAge < c.NATS.DuplicateWindow {
		return bad("nats.command_id_max_age", "%s is shorter than nats.duplicate_window %s", c.NATS.CommandIDMaxAge, c.NATS.DuplicateWindow)
	}
	if c.Gateway.Cooldown > rotdef.MaxCooldown {
		return bad("gateway.cooldown", "%s is longer than %s", c.Gateway.Cooldown, rotdef.MaxCooldown)
	}
	if c.Worker.BackoffMax < c.Worker.BackoffInitial {
		return bad("worker.backoff_max", "%s is less than worker.backoff_initial %s", c.Worker.BackoffMax, c.Worker.BackoffInitial)
	}
	if c.Worker.QuarantineMaxCoolDown < c.Worker.QuarantineCoolDown {
		return bad("worker.quarantine_max_cool_down", "%s is less than worker.quarantine_cool_down %s", c.Worker.QuarantineMaxCoolDown, c.Worker.QuarantineCoolDown)
	}
	if c.Worker.Liveness <= c.Worker.Heartbeat {
		return bad("worker.liveness", "%s is not longer than worker.heartbeat %s", c.Worker.Liveness, c.Worker.Heartbeat)
	}
	if c.Worker.Liveness > time.Minute {
		return bad("worker.liveness", "%s is longer than 1m, the TTL of PROXY_WORKERS", c.Worker.Liveness)
	}
	if c.Worker.AckWait < time.Second {
		return bad("worker.ack_wait", "%s is less than 1s", c.Worker.AckWait)
	}
	if c.Worker.MaxAttempts < 1 || c.Worker.MaxAttempts > 1000 {
		return bad("worker.max_attempts", "%d is out of range [1, 1000]", c.Worker.MaxAttempts)
	}
	if c.Worker.Concurrency < 1 || c.Worker.Concurrency > 1024 {
		return bad("worker.concurrency", "%d is out of range [1, 1024]", c.Worker.Concurrency)
	}
	if c.Worker.ObservePasses < 1 || c.Worker.ObservePasses > 1024 {
		return bad("worker.observe_passes", "%d is out of range [1, 1024]", c.Worker.ObservePasses)
	}
	if len(c.Hosts) == 0 {
		return bad("hosts", "at least one host is needed")
	}
	seen := map[string]bool{}
	for i, h := range c.Hosts {
		f := fmt.Sprintf("hosts[%d]", i)
		if !messages.ValidID(h.Name) {
			return bad(f+".name", "%q is not a valid host name (lowercase letters, digits and '-')", h.Name)
		}
		if seen[h.Name] {
			return bad(f+".name", "%q is named twice", h.Name)
		}
		seen[h.Name] = true
		switch h.Driver {
		case "sim":
			if h.Sim.Dir == "" {
				return bad(f+".sim.dir", "required for driver sim")
			}
		case "kvm":
			if err := h.validateKVM(f); err != nil {
				return err
			}
		default:
			return bad(f+".driver", "%q is not a driver (kvm or sim)", h.Driver)
		}
		if h.MaxProxies < 1 {
			return bad(f+".max_proxies", "%d is less than 1", h.MaxProxies)
		}
	}
	if err := c.validatePlans(); err != nil {
		return err
	}
	images := map[string]bool{}
	for i, im := range c.Images {
		f := fmt.Sprintf("images[%d]", i)
		if !messages.ValidID(im.Name) {
			return bad(f+".name", "%q is not a valid image name", im.Name)
		}
		if images[im.Name] {
			return bad(f+".name", "%q is named twice", im.Name)
		}
		images[im.Name] = true
		if err := checkArtifact(f, Artifact{URL: im.URL, SHA256: im.SHA256}); err != nil {
			return err
		}
		if im.Format != "" && im.Format != "qcow2" && im.Format != "raw" {
			return bad(f+".format", "%q is not qcow2 or raw", im.Format)
		}
		if im.Kernel != nil {
			if err := checkArtifact(f+".kernel", *im.Kernel); err != nil {
				return err
			}
		}
		if im.Initrd != nil {
			if im.Kernel == nil {
				return bad(f+".initrd", "needs a kernel")
			}
			if err := checkArtifact(f+".initrd", *im.Initrd); err != nil {
				return err
			}
		}
	}
	if c.DefaultImage != "" && !images[c.DefaultImage] {
		return bad("default_image", "%q is not one of images", c.DefaultImage)
	}
	if c.Proxy.Port < 1 || c.Proxy.Port > 65535 {
		return bad("proxy.port", "%d is not a port", c.Proxy.Port)
	}
	if c.Proxy.CPUs < messages.MinCPUs || c.Proxy.CPUs > messages.MaxCPUs {
		return bad("proxy.cpus", "%d is out of range", c.Proxy.CPUs)
	}
	if c.Proxy.MemoryMiB < messages.MinMemoryMiB || c.Proxy.MemoryMiB > messages.MaxMemoryMiB {
		return bad("proxy.memory_mib", "%d is out of range", c.Proxy.MemoryMiB)
	}
	if err := c.Proxy.validateAccess(c.Hosts); err != nil {
		return err
	}
	if c.Health.Rise < 1 {
		return bad("health.rise", "%d is less than 1", c.Health.Rise)
	}
	if c.Health.Fall < 1 {
		return bad("health.fall", "%d is less than 1", c.Health.Fall)
	}
	if c.Health.Timeout > c.Health.Interval {
		return bad("health.timeout", "%s is longer than health.interval %s", c.Health.Timeout, c.Health.Interval)
	}
	if _, _, err := net.SplitHostPort(c.Health.HTTP); err != nil {
		return bad("health.http", "%v", err)
	}
	if c.Worker.HTTP != "" {
		if _, _, err := net.SplitHostPort(c.Worker.HTTP); err != nil {
			return bad("worker.http", "%v", err)
		}
	}
	if c.Health.Concurrency < 1 || c.Health.Concurrency > 4096 {
		return bad("health.concurrency", "%d is out of range [1, 4096]", c.Health.Concurrency)
	}
	if c.Health.LeaseTTL > time.Minute {
		return bad("health.lease_ttl", "%s is longer than the PROXY_LEASES bucket's TTL 1m", c.Health.LeaseTTL)
	}
	if t := c.Health.Target; t != "" {
		if u, err := url.Parse(t); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("health.target", "%q: want http(s)://host[:port]/path", t)
		}
	}
	if c.Health.SnapshotInterval > time.Hour {
		return bad("health.snapshot_interval", "%s is longer than an hour: subscribers of the snapshot would wait that long for a change", c.Health.SnapshotInterval)
	}
	if r := c.Health.SnapshotRate; r < 4096 {
		return bad("health.snapshot_rate", "%d bytes a second: want at least 4096 (0: the default, %d)", r, healthdef.SnapshotRate)
	}
	if m := c.Health.SnapshotMaxBytes; m < 0 || (m > 0 && m < 4096) {
		return bad("health.snapshot_max_bytes", "%d: want 0 (the server's max_payload) or at least 4096", m)
	}
	if r := c.Health.ReportRate; r < 0 || r > 10000 {
		return bad("health.report_rate", "%g is out of range [0, 10000] (probes a second)", r)
	}
	if err := c.Gateway.validate(); err != nil {
		return err
	}
	if err := c.Pools.validate(); err != nil {
		return err
	}
	if err := c.Console.validate(); err != nil {
		return err
	}
	if l := c.Health.ProbeListen; l != "" {
		host, _, err := net.SplitHostPort(l)
		if err != nil {
			return bad("health.probe_listen", "%v", err)
		}
		if ip := net.ParseIP(host); c.Health.Target == "" && (ip == nil || ip.IsUnspecified()) {
			return bad("health.probe_listen", "%q: with no health.target, an IP the guests can reach (not a name or a wildcard)", l)
		}
	}
	if err := c.validateIPv6Target(); err != nil {
		return err
	}
	return c.validateProbeDenied()
}

// validateIPv6Target checks health.target_ipv6 and
// health.probe_listen_ipv6 by the rules health holds too
// (healthdef.Targets.CheckIPv6).
func (c *Config) validateIPv6Target() error {
	h := c.Health
	t := healthdef.Targets{Target: h.Target, ProbeListen: h.ProbeListen, TargetIPv6: h.TargetIPv6, ProbeListenIPv6: h.ProbeListenIPv6}
	if field, reason := t.CheckIPv6(); field != "" {
		return bad("health."+field, "%s", reason)
	}
	return nil
}

// proxyUserRE is a user name every proxy server and client carries
// unchanged: no ':' (it ends the user in Basic credentials), no space.
var proxyUserRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// validateAccess checks who may use the proxies: the credential's user,
// the allow-list, and that kvm hosts' proxies are not open to anyone who
// reaches them unless the operator says so. (The password is read and
// checked by LoadSecrets.)
func (p Proxy) validateAccess(hosts []Host) error {
	a := p.Auth
	if a.User != "" && !proxyUserRE.MatchString(a.User) {
		return bad("proxy.auth.user", "%q: want 1 to 64 letters, digits, '.', '_' or '-'", a.User)
	}
	if a.User == "" && a.PasswordFile != "" {
		return bad("proxy.auth.user", "required with proxy.auth.password_file")
	}
	for i, s := range p.Allow {
		if _, err := ParseAllow(s); err != nil {
			return bad(fmt.Sprintf("proxy.allow[%d]", i), "%v", err)
		}
	}
	if err := validateDeny("proxy.deny", p.Deny); err != nil {
		return err
	}
	if a.User != "" || len(p.Allow) > 0 || p.Open {
		return nil
	}
	for i, h := range hosts {
		if h.Driver == "kvm" {
			return bad("proxy.auth", "hosts[%d] (%s) is a kvm host whose proxies would be open to anyone who reaches them: "+
				"set proxy.auth (user, password_file), or proxy.allow, or proxy.open: true to mean it", i, h.Name)
		}
	}
	return nil
}

// ParseAllow reads one proxy.allow entry: a CIDR ("198.18.0.0/15") or a
// single address ("198.18.0.1", meaning /32 or /128). The prefix returned
// is masked ("10.1.2.3/8" is 10.0.0.0/8).
func ParseAllow(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an address", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func (h Host) validateKVM(f string) error {
	if _, _, err := net.SplitHostPort(h.SSH.Address); err != nil {
		return bad(f+".ssh.address", "want host:port: %v", err)
	}
	if h.SSH.User == "" {
		return bad(f+".ssh.user", "required")
	}
	if h.SSH.KeyFile == "" {
		return bad(f+".ssh.key_file", "required")
	}
	if h.SSH.KnownHosts == "" {
		return bad(f+".ssh.known_hosts", "required: host keys are always verified")
	}
	if h.DomainType != "" && h.DomainType != "kvm" && h.DomainType != "qemu" {
		return bad(f+".domain_type", "%q is not kvm or qemu", h.DomainType)
	}
	for _, d := range []struct {
		f string
		v time.Duration
	}{
		{"call", h.Budgets.Call}, {"transfer_stall", h.Budgets.TransferStall},
		{"close", h.Budgets.Close}, {"connect", h.Budgets.Connect}, {"keepalive", h.Budgets.Keepalive},
	} {
		if d.v < 0 {
			return bad(f+".budgets."+d.f, "negative duration %s", d.v)
		}
	}
	return nil
}

func checkArtifact(f string, a Artifact) error {
	switch {
	case a.URL == "":
		return bad(f+".url", "required")
	case !strings.HasPrefix(a.URL, "file://") && !strings.HasPrefix(a.URL, "http://") && !strings.HasPrefix(a.URL, "https://"):
		return bad(f+".url", "%q: want file://, http:// or https://", a.URL)
	case len(a.SHA256) != 64 || strings.Trim(strings.ToLower(a.SHA256), "0123456789abcdef") != "":
		return bad(f+".sha256", "want 64 hex digits")
	}
	return nil
}

// gatewayUserRE: a gateway user name ends where its options begin
// (USER-session-KEY, USER-label-K-V), so it has no '-'; nor ':' (it ends
// the user in Basic credentials).
var gatewayUserRE = regexp.MustCompile(`^[A-Za-z0-9._]{1,64}$`)

// Strategies of gateway.strategy.
var gatewayStrategies = []string{"round-robin", "random", "least-busy"}

func (g Gateway) validate() error {
	for _, l := range []struct{ f, v string }{{"gateway.listen", g.Listen}, {"gateway.socks_listen", g.SocksListen}, {"gateway.http", g.HTTP}} {
		if l.v == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.v); err != nil {
			return bad(l.f, "%v", err)
		}
	}
	if (g.Listen != "" || g.SocksListen != "") && len(g.Users) == 0 {
		return bad("gateway.users", "at least one user (name, password_file) is needed: the gateway is never an open proxy")
	}
	gu := make([]userRef, len(g.Users))
	for i, u := range g.Users {
		gu[i] = userRef{u.Name, u.PasswordFile}
	}
	if err := validateUsers("gateway.users", gu, " (no '-': it starts the options, as in name-session-KEY)"); err != nil {
		return err
	}
	if !slices.Contains(gatewayStrategies, g.Strategy) {
		return bad("gateway.strategy", "%q is not one of %s", g.Strategy, strings.Join(gatewayStrategies, ", "))
	}
	if err := g.validateBounds(); err != nil {
		return err
	}
	if _, err := g.CompiledRules(); err != nil {
		return err
	}
	return validateDeny("gateway.deny", g.Deny)
}

// validateDeny checks each entry of a deny list (absent: the default,
// which is good).
func validateDeny(field string, entries *[]string) error {
	if entries == nil {
		return nil
	}
	for i, s := range *entries {
		if _, err := deny.ParseEntry(s); err != nil {
			return bad(fmt.Sprintf("%s[%d]", field, i), "%v", err)
		}
	}
	return nil
}

// validateProbeDenied refuses a health probe target that proxy.deny
// denies when kvm hosts' proxies run the default user-data (whose squid
// enforces proxy.deny): every probe through them would be refused, and
// none would ever enter the rotation. Only an address is checked (a
// target's name is resolved by the proxies, not here); a sim host's
// proxies are never probed through, and a template's squid is the
// operator's.
func (c *Config) validateProbeDenied() error {
	kvm := slices.ContainsFunc(c.Hosts, func(h Host) bool { return h.Driver == "kvm" })
	if !kvm || c.Proxy.UserData != "" {
		return nil
	}
	d, err := c.Proxy.DenyList()
	if err != nil {
		return err // (validateAccess named the entry)
	}
	for _, t := range []struct{ targetField, target, listenField, listen string }{
		{"health.target", c.Health.Target, "health.probe_listen", c.Health.ProbeListen},
		{"health.target_ipv6", c.Health.TargetIPv6, "health.probe_listen_ipv6", c.Health.ProbeListenIPv6},
	} {
		field, host := t.listenField, ""
		if t.target != "" {
			field = t.targetField
			if u, err := url.Parse(t.target); err == nil {
				host = u.Hostname()
			}
		} else if t.listen != "" {
			host, _, _ = net.SplitHostPort(t.listen)
		}
		if a, err := netip.ParseAddr(host); err == nil && d.Denies(a) {
			return bad(field, "%s is in proxy.deny: the proxies would refuse every probe (take it out of proxy.deny, or probe another address)", a)
		}
	}
	return nil
}

// validatePlans checks each host's address plan, and that no address is
// in two hosts' plans (it would be given to two proxies).
func (c *Config) validatePlans() error {
	plans := make([]*addrplan.Plan, len(c.Hosts))
	for i, h := range c.Hosts {
		if h.Addresses == nil {
			continue
		}
		f := fmt.Sprintf("hosts[%d].addresses", i)
		p, err := addrplan.New(h.Name, *h.Addresses)
		var fe *messages.FieldError
		if errors.As(err, &fe) {
			return bad(f+"."+fe.Field, "%s", fe.Reason)
		}
		if err != nil {
			return bad(f, "%v", err)
		}
		for j, o := range plans[:i] {
			if o == nil {
				continue
			}
			if err := addrplan.Overlap(o, p); err != nil {
				return bad(f, "shares addresses with hosts[%d]: %v", j, err)
			}
		}
		plans[i] = p
	}
	return nil
}

// Plans returns the address plan of each host that has one, by name. It
// expects a validated config.
func (c *Config) Plans() map[string]*addrplan.Plan {
	out := map[string]*addrplan.Plan{}
	for _, h := range c.Hosts {
		if h.Addresses == nil {
			continue
		}
		if p, err := addrplan.New(h.Name, *h.Addresses); err == nil {
			out[h.Name] = p
		}
	}
	return out
}

func (k Console) validate() error {
	for _, l := range []struct{ f, v string }{{"console.listen", k.Listen}, {"console.http", k.HTTP}} {
		if l.v == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.v); err != nil {
			return bad(l.f, "%v", err)
		}
	}
	if k.Listen != "" && len(k.Users) == 0 {
		return bad("console.users", "at least one user (name, password_file) is needed: the console is never open to anyone")
	}
	ku := make([]userRef, len(k.Users))
	for i, u := range k.Users {
		ku[i] = userRef{u.Name, u.PasswordFile}
	}
	if err := validateUsers("console.users", ku, ""); err != nil {
		return err
	}
	if k.ViewRefresh < consoledef.MinViewRefresh {
		return bad("console.view_refresh", "%v: want at least %v (each refresh lists the whole fleet)", k.ViewRefresh, consoledef.MinViewRefresh)
	}
	seen := map[string]bool{}
	for i, g := range k.Gateways {
		f := fmt.Sprintf("console.gateways[%d]", i)
		u, err := url.Parse(g)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return bad(f, "%q: want http(s)://host:port, a gateway's ops listener (gateway.http)", g)
		}
		if seen[g] {
			return bad(f, "%q is named twice", g)
		}
		seen[g] = true
	}
	return nil
}

// userRef is what validateUsers checks of a user of the gateway or the
// console.
type userRef struct{ name, passwordFile string }

// validateUsers checks the users listed under field: each name valid
// (hint says what else a name may not hold) and given once, each with a
// password file.
func validateUsers(field string, users []userRef, hint string) error {
	names := map[string]bool{}
	for i, u := range users {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !gatewayUserRE.MatchString(u.name) {
			return bad(f+".name", "%q: want 1 to 64 letters, digits, '.' or '_'%s", u.name, hint)
		}
		if names[u.name] {
			return bad(f+".name", "%q is named twice", u.name)
		}
		names[u.name] = true
		if u.passwordFile == "" {
			return bad(f+".password_file", "required")
		}
	}
	return nil
}
