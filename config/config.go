package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"proxyfleet/addrplan"
	consoledef "proxyfleet/console/defaults"
	healthdef "proxyfleet/health/defaults"
	"proxyfleet/messages"
	topodef "proxyfleet/topology/defaults"
	workerdef "proxyfleet/worker/defaults"
)

// Config is the whole file.
type Config struct {
	NATS         NATS    `yaml:"nats"`
	Hosts        []Host  `yaml:"hosts"`
	Images       []Image `yaml:"images"`
	DefaultImage string  `yaml:"default_image"`
	Proxy        Proxy   `yaml:"proxy"`
	Worker       Worker  `yaml:"worker"`
	Health       Health  `yaml:"health"`
	Gateway      Gateway `yaml:"gateway"`
	Pools        Pools   `yaml:"pools"`
	Console      Console `yaml:"console"`
}

// NATS says how to reach the NATS system. An empty URL means the embedded
// server of `serve`.
type NATS struct {
	URL    string `yaml:"url"`
	Creds  string `yaml:"creds"`
	TLS    TLS    `yaml:"tls"`
	Prefix string `yaml:"prefix"`
	// Replicas of every stream and bucket (1 for a single server, 3 in a
	// cluster).
	Replicas int `yaml:"replicas"`
	// DuplicateWindow is PROXY_CMDS's dedupe window on Nats-Msg-Id.
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	// ResultsMaxAge is how long answers stay readable in PROXY_RESULTS.
	ResultsMaxAge time.Duration `yaml:"results_max_age"`
	// DeletedMaxAge is how long a proxy's "deleted" event stays in
	// PROXY_EVENTS before it ages out.
	DeletedMaxAge time.Duration `yaml:"deleted_max_age"`
	// CommandIDMaxAge is how long a command id is remembered, so that a
	// duplicate published after the dedupe window still has no effect.
	CommandIDMaxAge time.Duration `yaml:"command_id_max_age"`
	// RepairInterval is how often set-up's repairer (`serve`, or
	// `proxyfleet setup --repair`) checks that every stream and bucket
	// exists, recreating any that was deleted.
	RepairInterval time.Duration `yaml:"repair_interval"`
}

// TLS for the NATS connection.
type TLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Host is one KVM (or simulated) host. The keys package kvm owns (socket,
// uri, pool, network, domain_type, budgets; an image's format too) get no
// default here: left empty, kvm fills them with its own (kvm/options.go).
type Host struct {
	Name       string  `yaml:"name"`
	Driver     string  `yaml:"driver"` // "kvm" (default) or "sim"
	SSH        SSH     `yaml:"ssh"`
	Socket     string  `yaml:"socket"`
	URI        string  `yaml:"uri"`
	Pool       string  `yaml:"pool"`
	Network    string  `yaml:"network"`
	DomainType string  `yaml:"domain_type"`
	MaxProxies int     `yaml:"max_proxies"` // room: 20 for kvm, 100 for sim by default
	Budgets    Budgets `yaml:"budgets"`
	Sim        Sim     `yaml:"sim"`
	// Addresses is the host's address plan: the addresses its proxies
	// are configured with and leave from. Absent: its network's DHCP.
	Addresses *addrplan.Config `yaml:"addresses"`
}

// SSH reaches a host's libvirt socket.
type SSH struct {
	Address    string `yaml:"address"`
	User       string `yaml:"user"`
	KeyFile    string `yaml:"key_file"`
	KnownHosts string `yaml:"known_hosts"`
}

// Budgets bound every call to a host.
type Budgets struct {
	Call          time.Duration `yaml:"call"`
	TransferStall time.Duration `yaml:"transfer_stall"`
	Close         time.Duration `yaml:"close"`
	Connect       time.Duration `yaml:"connect"`
	Keepalive     time.Duration `yaml:"keepalive"`
}

// Sim configures a host of driver "sim": its domains are files in Dir.
type Sim struct {
	Dir string `yaml:"dir"`
	// Delay is added to every call, BootDelay between create and the
	// proxy having an address.
	Delay     time.Duration `yaml:"delay"`
	BootDelay time.Duration `yaml:"boot_delay"`
}

// Image is a base image proxies boot from.
type Image struct {
	Name    string    `yaml:"name"`
	URL     string    `yaml:"url"`
	SHA256  string    `yaml:"sha256"`
	Format  string    `yaml:"format"`
	Kernel  *Artifact `yaml:"kernel"`
	Initrd  *Artifact `yaml:"initrd"`
	Cmdline string    `yaml:"cmdline"`
}

// Artifact is a file fetched by URL and checked by digest.
type Artifact struct {
	URL    string `yaml:"url"`
	SHA256 string `yaml:"sha256"`
}

// Proxy holds the defaults of every proxy, and who may use the proxies.
type Proxy struct {
	Port      int    `yaml:"port"`
	CPUs      int    `yaml:"cpus"`
	MemoryMiB int    `yaml:"memory_mib"`
	UserData  string `yaml:"user_data"`
	// Auth is the credential every proxy requires (HTTP Basic): the
	// guests' proxy servers are configured with it, and health's probes
	// (and the fleet's clients) send it.
	Auth ProxyAuth `yaml:"auth"`
	// Allow lists the source networks (CIDRs, or single addresses) that
	// may use the proxies at all; empty: any source (with Auth, still
	// only with the credential).
	Allow []string `yaml:"allow"`
	// Open must be true for kvm hosts whose proxies would otherwise be
	// open to anyone who reaches them (no Auth and no Allow): an open
	// proxy is never made by accident.
	Open bool `yaml:"open"`
	// Deny lists the destination networks (CIDRs, or single addresses)
	// the proxies refuse to reach, a name that resolves into one of them
	// included (squid's dst acl). Absent (or null): deny.Default; an
	// empty list: none. DenyList reads it.
	Deny *[]string `yaml:"deny"`
}

// ProxyAuth is the proxies' credential. The password comes from
// PasswordFile, or else from the environment variable
// PasswordEnv; it is read by LoadSecrets, never written back out
// (Password has no YAML key) and never printed (Secret redacts itself).
type ProxyAuth struct {
	User         string `yaml:"user"`
	PasswordFile string `yaml:"password_file"`
	Password     Secret `yaml:"-" json:"-"`
}

// PasswordEnv is the environment variable the proxies' password is taken
// from when proxy.auth.password_file is not set.
const PasswordEnv = "PROXYFLEET_PROXY_PASSWORD"

// Worker tunes intake and execution.
type Worker struct {
	// AckWait is how long JetStream waits for an ack before redelivering;
	// long work keeps its message with InProgress at a third of it.
	AckWait time.Duration `yaml:"ack_wait"`
	// MaxAttempts bounds deliveries of one command's work before it is
	// failed and dead-lettered.
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff between attempts of transient failures.
	BackoffInitial time.Duration `yaml:"backoff_initial"`
	BackoffMax     time.Duration `yaml:"backoff_max"`
	// ReadyTimeout bounds the wait for a created proxy to run with an IP.
	ReadyTimeout time.Duration `yaml:"ready_timeout"`
	// PollInterval is the longest pause between Get calls while waiting
	// (the pauses start at 100ms and double up to it).
	PollInterval time.Duration `yaml:"poll_interval"`
	// PinnedTTL is how long a host's work consumer stays pinned to a worker
	// that stopped pulling, i.e. how fast a dead worker's hosts move.
	PinnedTTL time.Duration `yaml:"pinned_ttl"`
	// Concurrency is the number of work items a worker runs at once per host.
	// A create holds its item until the proxy runs (its boot included), so
	// the default, 20, is a KVM host's default room: a burst of creates
	// that fills a host boots at once instead of in waves.
	Concurrency int `yaml:"concurrency"`
	// DrainTimeout bounds the graceful stop, the whole of it (work in
	// flight, handing the hosts over), whether NATS answers or not.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// CheckInterval is how often a worker checks that its consumers exist
	// and are consumed (it also checks at once when a consume reports an
	// error), recreating them, and how often it looks again for a missing
	// stream or bucket.
	CheckInterval time.Duration `yaml:"check_interval"`
	// ObserveInterval is how often a host's owner re-reads its running
	// proxies, publishing only what changed.
	ObserveInterval time.Duration `yaml:"observe_interval"`
	// ObservePasses is how many observation passes a worker runs at
	// once, over all its hosts (their ticks come together, and each pass
	// holds what it read of its host until it is done); a pass that
	// cannot start within ObserveInterval waits for the next tick.
	ObservePasses int `yaml:"observe_passes"`
	// A host whose calls fail transiently QuarantineFailures times within
	// QuarantineWindow is quarantined (placement skips it, its work
	// waits) for QuarantineCoolDown, then probed; each failed probe
	// doubles the cool-down, up to QuarantineMaxCoolDown. A negative
	// QuarantineFailures turns quarantine off.
	QuarantineFailures    int           `yaml:"quarantine_failures"`
	QuarantineWindow      time.Duration `yaml:"quarantine_window"`
	QuarantineCoolDown    time.Duration `yaml:"quarantine_cool_down"`
	QuarantineMaxCoolDown time.Duration `yaml:"quarantine_max_cool_down"`
	// Heartbeat is how often a worker renews its record in PROXY_WORKERS,
	// the membership the hosts are shared over.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// Liveness is how young a worker's record must be for the others to
	// count it live (default three heartbeats): a dead worker's hosts are
	// pulled by the others this long after its last heartbeat, and owned
	// once their pins expire (pinned_ttl).
	Liveness time.Duration `yaml:"liveness"`
	// SweepGrace is how long a volume of ours must have gone unused (a
	// proxy's with no domain, a cached image's no configured image names)
	// before the host's observation pass removes it.
	SweepGrace time.Duration `yaml:"sweep_grace"`
	// HTTP is where `proxyfleet worker` serves /metrics, /healthz and
	// /readyz (host:port; overridden by --http). Empty: no listener.
	// `serve` serves them on health.http instead.
	HTTP string `yaml:"http"`
}

// Health tunes the health consumer.
type Health struct {
	HTTP     string        `yaml:"http"`
	Interval time.Duration `yaml:"interval"`
	Timeout  time.Duration `yaml:"timeout"`
	Rise     int           `yaml:"rise"`
	Fall     int           `yaml:"fall"`
	Grace    time.Duration `yaml:"grace"`
	// Target is the URL probed through each proxy; the answer must hold
	// the nonce the probe adds, or Expect if set. Empty: the health
	// process's own /probe on ProbeListen.
	Target string `yaml:"target"`
	Expect string `yaml:"expect"`
	// ProbeListen is where the health process serves /probe, on an
	// address the guests can reach (e.g. 198.18.0.1:0). With neither it
	// nor Target, health probes a TCP connect to each proxy (a proxy of
	// a sim host enters on its running event, never probed).
	ProbeListen string `yaml:"probe_listen"`
	// TargetIPv6 is the URL probed through each proxy for its IPv6
	// egress addresses (each probe names one of the proxy's addresses,
	// and a proxy leaves from a named address only over its family); its
	// host an IPv6 address or a name reached over IPv6. Empty: health's
	// own /probe on ProbeListenIPv6, if set. With neither (the default),
	// IPv6 egress addresses are not probed one by one. Needs Target or
	// ProbeListen, which then probe the IPv4 addresses.
	TargetIPv6 string `yaml:"target_ipv6"`
	// ProbeListenIPv6 is where the health process also serves /probe
	// for the IPv6 probes, on an IPv6 address the guests can reach
	// (e.g. [2001:db8::1]:8081).
	ProbeListenIPv6 string `yaml:"probe_listen_ipv6"`
	// Concurrency bounds the probes in flight.
	Concurrency int `yaml:"concurrency"`
	// LeaseTTL is how long the publisher's lease lasts without renewal
	// (at most PROXY_LEASES's TTL, 1m).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// OpenCheckInterval is how often a proxy in the rotation is checked
	// again for refusing a request without the credential (with
	// proxy.auth set): an open one leaves at once. A candidate is
	// checked on every probe until it is admitted.
	OpenCheckInterval time.Duration `yaml:"open_check_interval"`
	// ReportInterval: after a consumer's report of a proxy (a gateway
	// whose request through it failed) made health probe it at once,
	// further reports of it within this long ask for nothing.
	// ReportRate bounds the probes reports ask for, per second over all
	// proxies. A report never takes a proxy out: only health's own
	// probes do.
	ReportInterval time.Duration `yaml:"report_interval"`
	ReportRate     float64       `yaml:"report_rate"`
	// SnapshotInterval is the least time between two snapshots of the
	// whole rotation on <prefix>.rotation (each costs O(fleet) bytes);
	// every change goes out at once on <prefix>.rotation.changes.
	SnapshotInterval time.Duration `yaml:"snapshot_interval"`
	// SnapshotRate bounds the bytes a second of those snapshots: after
	// one of B bytes the next waits B/snapshot_rate if longer than
	// snapshot_interval (default 262144, 256 KiB: a 1 MiB snapshot of
	// 12,000 proxies goes out at most every 4 s under churn).
	SnapshotRate int `yaml:"snapshot_rate"`
	// SnapshotMaxBytes is the largest snapshot sent whole (0: the NATS
	// server's max_payload); a larger rotation is announced on
	// <prefix>.rotation with a notice (truncated) instead.
	SnapshotMaxBytes int `yaml:"snapshot_max_bytes"`
}

// Load reads, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML strictly (unknown keys are errors), fills defaults and
// validates.
func Parse(b []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	// An empty file is io.EOF: it decodes to the defaults.
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse: %w", err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// SetDefaults fills every zero value that has a default.
func (c *Config) SetDefaults() {
	n := &c.NATS
	if n.Prefix == "" {
		n.Prefix = messages.DefaultPrefix
	}
	if n.Replicas == 0 {
		n.Replicas = topodef.Replicas
	}
	setDur(&n.DuplicateWindow, topodef.DuplicateWindow)
	setDur(&n.ResultsMaxAge, topodef.ResultsMaxAge)
	setDur(&n.DeletedMaxAge, workerdef.DeletedTTL)
	setDur(&n.CommandIDMaxAge, topodef.CommandIDMaxAge)
	setDur(&n.RepairInterval, topodef.RepairInterval)
	for i := range c.Hosts {
		h := &c.Hosts[i]
		if h.Driver == "" {
			h.Driver = "kvm"
		}
		if h.MaxProxies == 0 {
			h.MaxProxies = defaultMaxProxies[h.Driver]
		}
	}
	if c.DefaultImage == "" && len(c.Images) == 1 {
		c.DefaultImage = c.Images[0].Name
	}
	p := &c.Proxy
	if p.Port == 0 {
		p.Port = workerdef.ProxyPort
	}
	if p.CPUs == 0 {
		p.CPUs = 1
	}
	if p.MemoryMiB == 0 {
		p.MemoryMiB = 512
	}
	w := &c.Worker
	setDur(&w.AckWait, topodef.AckWait)
	if w.MaxAttempts == 0 {
		w.MaxAttempts = topodef.MaxAttempts
	}
	setDur(&w.BackoffInitial, workerdef.BackoffInitial)
	setDur(&w.BackoffMax, workerdef.BackoffMax)
	setDur(&w.ReadyTimeout, workerdef.ReadyTimeout)
	setDur(&w.PollInterval, workerdef.PollInterval)
	setDur(&w.PinnedTTL, topodef.PinnedTTL)
	if w.Concurrency == 0 {
		w.Concurrency = workerdef.Concurrency
	}
	setDur(&w.DrainTimeout, workerdef.DrainTimeout)
	setDur(&w.CheckInterval, workerdef.CheckInterval)
	setDur(&w.ObserveInterval, workerdef.ObserveInterval)
	if w.ObservePasses == 0 {
		w.ObservePasses = workerdef.ObservePasses
	}
	if w.QuarantineFailures == 0 {
		w.QuarantineFailures = workerdef.QuarantineFailures
	}
	setDur(&w.QuarantineWindow, workerdef.QuarantineWindow)
	setDur(&w.QuarantineCoolDown, workerdef.QuarantineCoolDown)
	setDur(&w.QuarantineMaxCoolDown, workerdef.QuarantineMaxCoolDown)
	setDur(&w.Heartbeat, workerdef.Heartbeat)
	setDur(&w.Liveness, workerdef.LivenessHeartbeats*w.Heartbeat)
	setDur(&w.SweepGrace, workerdef.SweepGrace)
	hl := &c.Health
	if hl.HTTP == "" {
		hl.HTTP = healthdef.HTTPAddr
	}
	setDur(&hl.Interval, healthdef.Interval)
	setDur(&hl.Timeout, healthdef.Timeout(hl.Interval))
	if hl.Rise == 0 {
		hl.Rise = healthdef.Rise
	}
	if hl.Fall == 0 {
		hl.Fall = healthdef.Fall
	}
	setDur(&hl.Grace, healthdef.Grace)
	if hl.Concurrency == 0 {
		hl.Concurrency = healthdef.Concurrency
	}
	setDur(&hl.LeaseTTL, healthdef.LeaseTTL)
	setDur(&hl.OpenCheckInterval, healthdef.OpenCheckInterval)
	setDur(&hl.ReportInterval, healthdef.ReportInterval)
	if hl.ReportRate == 0 {
		hl.ReportRate = healthdef.ReportRate
	}
	setDur(&hl.SnapshotInterval, healthdef.SnapshotInterval)
	if hl.SnapshotRate == 0 {
		hl.SnapshotRate = healthdef.SnapshotRate
	}
	c.Gateway.setDefaults()
	c.Pools.setDefaults()
	setDur(&c.Console.ViewRefresh, consoledef.ViewRefresh)
}

// defaultMaxProxies is a host's room by driver: what a KVM host of modest
// size runs, and more for a simulated one, whose proxies cost a file.
var defaultMaxProxies = map[string]int{"kvm": 20, "sim": 100}

func setDur(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// HostNames lists the hosts in config order.
func (c *Config) HostNames() []string {
	out := make([]string, len(c.Hosts))
	for i, h := range c.Hosts {
		out[i] = h.Name
	}
	return out
}

// Host returns the named host.
func (c *Config) Host(name string) (Host, bool) {
	for _, h := range c.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}

// Image returns the named image.
func (c *Config) Image(name string) (Image, bool) {
	for _, im := range c.Images {
		if im.Name == name {
			return im, true
		}
	}
	return Image{}, false
}
