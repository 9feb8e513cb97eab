package health

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/health/defaults"
	"proxyfleet/messages"
)

// NoHTTP as Config.HTTPAddr serves no HTTP of its own: the caller mounts
// Handler where it likes.
const NoHTTP = "-"

// Config of a health process. New fills the zero values with defaults (see
// WithDefaults).
type Config struct {
	Subjects messages.Subjects
	// HTTPAddr is the listen address of /rotation, /healthz, /readyz and
	// /metrics; a port of 0 picks a free one (see Health.Addr). Empty:
	// defaults.HTTPAddr; NoHTTP: none.
	HTTPAddr string
	Logger   *slog.Logger
	// Now is the clock of the fold (grace, probe times), of the
	// snapshots' time and of the lease's validity and expiry.
	Now func() time.Time
	// Grace is how long a proxy keeps its place after reporting
	// provisioning without an address from the same command and host
	// (another command or host takes it out at once). Zero demotes it at
	// once.
	Grace time.Duration

	// OpTimeout bounds each request to NATS made while publishing
	// (default: defaults.OpTimeout).
	OpTimeout time.Duration
	// RetryInterval is the wait before publishing again after a failure
	// (default: defaults.RetryInterval).
	RetryInterval time.Duration
	// CatchUpPoll is how often the consumer's info is read while catching
	// up, in case no message says it was the last (default:
	// defaults.CatchUpPoll).
	CatchUpPoll time.Duration
	// CheckInterval is how often the stream, the buckets and the
	// consumer are looked at, to repair what someone deleted (default:
	// defaults.CheckInterval). It is also the consumer's heartbeat (at least 500ms): a
	// consumer that was deleted without a word is noticed after two.
	CheckInterval time.Duration

	// Probing. A proxy is probed with a request through it to a target
	// that answers a value the prober checks (see HTTPProber). The prober
	// is Prober if set, else an HTTPProber of Target if set, else of this
	// process's own /probe served on ProbeListen. With none of the three,
	// a TCP connect to each proxy's address is all that is probed
	// (TCPProber; logged at warn level at start). Proxies of the sim
	// driver (a running event with source sim) are never probed: they
	// enter on their event.

	// Prober probes one proxy; tests inject one.
	Prober Prober
	// Target is the URL probed through each proxy (http or https). A
	// nonce query parameter is added; the answer must contain Expect or,
	// if Expect is empty, the nonce. Only a target that answers as
	// ProbeHandler does (a health process's /probe) reports the proxy's
	// egress and the headers that reached it; another yields no egress
	// and no leak verdict (the open check works with any target).
	Target string
	Expect string
	// ProbeListen is an address the guests can reach (an IP, not a
	// wildcard, when Target is empty) where this process serves
	// GET /probe?nonce=N, answering N. With an empty Target, the target is
	// http://<its bound address>/probe.
	ProbeListen string
	// TargetIPv6 is the URL probed through each proxy for its IPv6
	// egress addresses, as Target is for its IPv4 ones: each probe names
	// one of the proxy's addresses (messages.HeaderEgress), and squid uses
	// a named address only over its family. Its host is an IPv6 address
	// or a name the guests reach over IPv6. Empty: the /probe served on
	// ProbeListenIPv6, if set; with neither, no IPv6 egress address is
	// probed one by one (proxyfleet_health_egress_target{family="ipv6"}
	// is 0). Needs Target or ProbeListen, whose target is then the IPv4
	// one; set when that one is itself an IPv6 address, it is an error.
	TargetIPv6 string
	// ProbeListenIPv6 is a second address (an IPv6 one the guests can
	// reach, when TargetIPv6 is empty) where this process serves
	// GET /probe: with an empty TargetIPv6, the IPv6 target is
	// http://[its bound address]/probe.
	ProbeListenIPv6 string
	// Interval between probe rounds (default: defaults.Interval); Timeout
	// of each probe (default: defaults.Timeout of Interval), at most
	// Interval.
	Interval time.Duration
	Timeout  time.Duration
	// Rise passing probes in a row put a proxy in the rotation; Fall
	// failing ones take it out (defaults: defaults.Rise, defaults.Fall).
	Rise, Fall int
	// Concurrency bounds the probes in flight (default:
	// defaults.Concurrency).
	Concurrency int

	// ProxyUser and ProxyPassword are the credentials the fleet's proxies
	// require (proxy.auth): every probe health makes through a proxy
	// carries them (Proxy-Authorization: Basic), and with a target to
	// probe, a proxy is also checked to refuse the same request without
	// them (see OpenCheckInterval). An empty user: no credentials, no
	// open check. The password is never logged, nor put in an error,
	// a metric or anything published.
	ProxyUser, ProxyPassword string
	// OpenCheckInterval is how often a proxy in the rotation is checked
	// again to refuse a request without credentials (default:
	// defaults.OpenCheckInterval). A
	// candidate is checked before it enters, and one found open is
	// checked at every round until it refuses.
	OpenCheckInterval time.Duration
	// ReportInterval is how soon after a report made health probe a proxy
	// another report of it asks for nothing (default:
	// defaults.ReportInterval); ReportRate how many probes a second reports
	// may ask for over all proxies (default: defaults.ReportRate). See
	// report.go.
	ReportInterval time.Duration
	ReportRate     float64

	// SnapshotInterval is the least time between two snapshots published
	// on <prefix>.rotation (default: defaults.SnapshotInterval): a snapshot costs O(fleet) bytes,
	// so under churn it is sent at this pace, the latest version each
	// time, while the feed carries every change as it happens. The first
	// change after a quiet interval goes out at once.
	SnapshotInterval time.Duration
	// SnapshotRate bounds the bytes a second the snapshots on
	// <prefix>.rotation carry under churn (default:
	// defaults.SnapshotRate): after a snapshot of B bytes the next waits
	// B/SnapshotRate if that is longer than SnapshotInterval, so the bytes
	// snapshots cost under churn are bounded whatever the rotation's size
	// (docs/DECISIONS.md, "Snapshots paced by their bytes"). The feed is
	// not paced.
	SnapshotRate int
	// SnapshotMaxBytes is the largest snapshot published whole on
	// <prefix>.rotation (0: the server's max_payload, 1 MiB by default);
	// a larger rotation is announced there with a notice (truncated,
	// its size, the feed's subject) instead of its proxies.
	SnapshotMaxBytes int

	// LeaseTTL is how long the publisher's lease in PROXY_LEASES lasts
	// without a renewal (default: defaults.LeaseTTL); the holder renews every third of
	// it, a standby takes over once the lease's revision has not changed
	// for that long. At most the bucket's own TTL.
	LeaseTTL time.Duration
	// Instance names this process in the lease (default host-pid-random).
	Instance string

	// Registry is where the process registers its metrics and what
	// /metrics serves (the process's registry: cmd/proxyfleet adds the Go,
	// process and build collectors and the worker's metrics); nil: a
	// registry of this process's own. Nothing is registered globally.
	Registry *prometheus.Registry
	// ReadyCheck, if set, must also return nil for /readyz to answer 200
	// (serve adds its worker's readiness).
	ReadyCheck func() error

	// leaseLooked, if set, is called by the loop after each look at the
	// lease (a renewal, or a standby's read): a test that must show a
	// lease was not taken, or that a standby published nothing, waits
	// for the loop's looks instead of sleeping. Set by export_test.go.
	leaseLooked func()
}

// WithDefaults returns cfg with every zero value (and negative duration)
// filled with its default, the constants of package health/defaults,
// which package config fills a file's gaps with too. Timeout's follows
// Interval (defaults.Timeout); Grace has none (zero demotes at once);
// Instance is New's to make.
func (cfg Config) WithDefaults() Config {
	if cfg.Subjects.Prefix == "" {
		cfg.Subjects = messages.NewSubjects("")
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = defaults.HTTPAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.OpTimeout, defaults.OpTimeout)
	def(&cfg.RetryInterval, defaults.RetryInterval)
	def(&cfg.CatchUpPoll, defaults.CatchUpPoll)
	def(&cfg.CheckInterval, defaults.CheckInterval)
	def(&cfg.Interval, defaults.Interval)
	def(&cfg.Timeout, defaults.Timeout(cfg.Interval))
	def(&cfg.LeaseTTL, defaults.LeaseTTL)
	def(&cfg.SnapshotInterval, defaults.SnapshotInterval)
	if cfg.SnapshotRate == 0 {
		cfg.SnapshotRate = defaults.SnapshotRate
	}
	def(&cfg.OpenCheckInterval, defaults.OpenCheckInterval)
	def(&cfg.ReportInterval, defaults.ReportInterval)
	if cfg.ReportRate <= 0 {
		cfg.ReportRate = defaults.ReportRate
	}
	cfg.Rise = cmp.Or(cfg.Rise, defaults.Rise)
	cfg.Fall = cmp.Or(cfg.Fall, defaults.Fall)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaults.Concurrency)
	return cfg
}

// check reports the first setting of cfg, already defaulted, that New
// cannot run with: a negative grace, count or rate, an invalid subject
// prefix, a probe timeout longer than the interval, or a password without
// a user.
func (cfg Config) check() error {
	if cfg.Grace < 0 {
		return fmt.Errorf("health: negative grace %v", cfg.Grace)
	}
	if !messages.ValidPrefix(cfg.Subjects.Prefix) {
		return fmt.Errorf("health: invalid subject prefix %q", cfg.Subjects.Prefix)
	}
	switch {
	case cfg.Rise < 0:
		return fmt.Errorf("health: rise %d is negative", cfg.Rise)
	case cfg.Fall < 0:
		return fmt.Errorf("health: fall %d is negative", cfg.Fall)
	case cfg.Concurrency < 0:
		return fmt.Errorf("health: concurrency %d is negative", cfg.Concurrency)
	case cfg.Timeout > cfg.Interval:
		return fmt.Errorf("health: probe timeout %v is longer than the interval %v", cfg.Timeout, cfg.Interval)
	}
	if cfg.SnapshotRate < 0 {
		return fmt.Errorf("health: snapshot rate %d is negative", cfg.SnapshotRate)
	}
	if cfg.SnapshotMaxBytes < 0 {
		return fmt.Errorf("health: snapshot max bytes %d is negative", cfg.SnapshotMaxBytes)
	}
	if cfg.ProxyUser == "" && cfg.ProxyPassword != "" {
		return errors.New("health: a proxy password without a user")
	}
	return nil
}
