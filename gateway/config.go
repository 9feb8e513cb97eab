package gateway

import (
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/bans"
	"proxyfleet/deny"
	"proxyfleet/gateway/defaults"
	"proxyfleet/rotation"
)

// Config is the gateway's configuration. Field errors name the field as
// the YAML does (gateway.listen, gateway.users[0].name, ...).
type Config struct {
	// Listen is the HTTP proxy's address (host:port; port 0 picks one);
	// SocksListen the SOCKS5 server's. At least one is needed; empty:
	// that listener is off.
	Listen      string
	SocksListen string
	// Users may use the gateway, each with a password: at least one
	// (the gateway is never an open proxy).
	Users []User
	// UpstreamUser and UpstreamPassword are the fleet's credential
	// (proxy.auth), sent to every proxy. Empty user: none sent.
	UpstreamUser, UpstreamPassword string
	// Retries is how many other proxies a request whose proxy failed it
	// (before any byte of the answer reached the client) is tried on:
	// default 2, at most 10; a negative value means none. Every numeric
	// setting's default and range is in gateway/defaults.Bounds.
	Retries int
	// ConnectTimeout bounds the connection to a proxy and, for CONNECT,
	// the proxy's answer to it (default 5s).
	ConnectTimeout time.Duration
	// ResponseTimeout bounds the wait for a proxy's answer (its status
	// line and headers) to a plain request (default 30s): a proxy that
	// died while the gateway kept an idle connection to it takes the
	// request and never answers. A request without a body that hits it is
	// tried on another proxy, as one whose connect failed; it includes
	// the target's time to answer, so it is long.
	ResponseTimeout time.Duration
	// FirstByteTimeout (default 3s or ResponseTimeout if shorter; at
	// least 500ms or ResponseTimeout, at most ResponseTimeout) is how
	// long a connection to a proxy may carry a request without a sign of
	// life before the proxy is taken for dead: bytes sent on it
	// unacknowledged and nothing from the proxy for that long. The request is then tried on another proxy at once if it can
	// be sent again (no byte of an answer reached the client, and no body
	// or one the gateway holds whole), and the proxy is reported. A proxy
	// that acknowledges is waited for up to ResponseTimeout, however slow
	// its target.
	FirstByteTimeout time.Duration
	// RetryAfter is the Retry-After of the 503 answered when no proxy
	// matches (default 5s; sent in whole seconds, at least 1).
	RetryAfter time.Duration
	// DrainTimeout bounds how long Run waits, once its context ends, for
	// requests and tunnels in flight before it closes them (default 5s).
	DrainTimeout time.Duration
	// HandshakeTimeout bounds a SOCKS5 client's greeting, authentication
	// and request (default 10s).
	HandshakeTimeout time.Duration
	// HeaderTimeout bounds an HTTP request's head (default 10s): from the
	// connection's accept for its first request, from the first byte of
	// a next one on a kept-alive connection; not complete by then, the
	// connection is closed.
	HeaderTimeout time.Duration
	// MaxHeaderBytes (default 64 KiB, at least 8 KiB) and
	// MaxHeaderFields (default 100) bound an HTTP request's head: one
	// over either is answered 431 Request Header Fields Too Large, before
	// its credential is looked at, and the connection is closed.
	MaxHeaderBytes, MaxHeaderFields int
	// MaxUnauthenticated bounds the connections (HTTP and SOCKS5
	// together) open at once that have not yet presented a valid
	// credential (default 1024): over it, a new connection is closed as
	// soon as it is accepted.
	MaxUnauthenticated int
	// KeepAliveTimeout closes an HTTP client connection idle between
	// requests for that long (default 90s).
	KeepAliveTimeout time.Duration
	// IdleTimeout (default 5m) closes what carries bytes for a client
	// and has carried none, in either direction, for that long: a
	// CONNECT or SOCKS5 tunnel (both its connections), a request's body
	// being received (the client's connection; the request is not
	// answered).
	IdleTimeout time.Duration
	// Deny is the destinations refused: a target whose host is an
	// address in it (a CONNECT's, a plain request's URI host, a SOCKS5
	// request's address, its domain form included) is answered 403
	// Forbidden (SOCKS5: reply 2, not allowed by ruleset) before any
	// proxy is picked. A host name is not checked here: the proxies
	// refuse names that resolve into their own list. Unless the list is
	// empty, the addresses the gateway listens on are refused too (those
	// that are not unspecified). nil: deny.Default(); an empty List:
	// nothing refused.
	Deny *deny.List
	// AuthFailures is how many failed credentials one source address
	// may present within a minute (default 5); then its attempts are
	// refused (HTTP 429 with Retry-After, SOCKS5 status failure) without
	// a password being checked, until the minute has passed.
	AuthFailures int

	// Rules judge the proxies' answers to plain requests (package bans;
	// nil: none): a ban of the answering address for the request's site,
	// a retry from another address. BodyPeek (default 16 KiB) is the
	// bytes of an answer's body a body rule reads; RetryBodyBytes
	// (default 64 KiB; negative: none) the largest request body held so
	// that a retry may send it again.
	Rules                    *bans.Rules
	BodyPeek, RetryBodyBytes int
	// Bans are the fleet's bans (a *rotation.Rotation): a request does
	// not leave from an address banned for its site, and the gateway's
	// bans are stored there. nil: bans held by this gateway alone.
	Bans Bans
	// LookupNetIP resolves a target's name to its addresses, to tell a
	// proxy with addresses one of the family it will reach the target
	// over (rotation.FamilyCache: answers kept for a short time, one
	// lookup at a time per name, bounded by a timeout). nil:
	// rotation.DefaultLookup (the system's resolver).
	LookupNetIP rotation.LookupFunc

	Logger *slog.Logger
	// Registry is where the gateway registers its metrics
	// (proxyfleet_gateway_...); nil: a registry of its own.
	Registry prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// User is one user of the gateway.
type User struct {
	// Name is what the client sends as its user name, before any
	// options (name-session-KEY, name-label-K-V, name-pool-P).
	Name     string
	Password string
	// MaxConns bounds the user's requests and tunnels at once
	// (default 256).
	MaxConns int
}

// Defaults of Config: package proxyfleet/gateway/defaults's constants.
const (
	DefaultRetries          = defaults.Retries
	DefaultConnectTimeout   = defaults.ConnectTimeout
	DefaultResponseTimeout  = defaults.ResponseTimeout
	DefaultFirstByteTimeout = defaults.FirstByteTimeout
	// MinFirstByteTimeout is FirstByteTimeout's least value (unless
	// ResponseTimeout is shorter).
	MinFirstByteTimeout       = defaults.MinFirstByteTimeout
	DefaultRetryAfter         = defaults.RetryAfter
	DefaultDrainTimeout       = defaults.DrainTimeout
	DefaultHandshakeTimeout   = defaults.HandshakeTimeout
	DefaultKeepAliveTimeout   = defaults.KeepAliveTimeout
	DefaultIdleTimeout        = defaults.IdleTimeout
	DefaultMaxConns           = defaults.MaxConns
	DefaultAuthFailures       = defaults.AuthFailures
	DefaultHeaderTimeout      = defaults.HeaderTimeout
	DefaultMaxHeaderBytes     = defaults.MaxHeaderBytes
	DefaultMaxHeaderFields    = defaults.MaxHeaderFields
	DefaultMaxUnauthenticated = defaults.MaxUnauthenticated
	// MinMaxHeaderBytes is MaxHeaderBytes's least value: the client's
	// reader (a head that fits it is taken; one larger is read apart,
	// up to MaxHeaderBytes).
	MinMaxHeaderBytes = defaults.MinMaxHeaderBytes
)

// bounded pairs each numeric setting of c with its bound
// (defaults.Bounds), but FirstByteTimeout, whose range depends on
// ResponseTimeout (defaults.CheckFirstByte).
func (c *Config) bounded() []defaults.Setting {
	s := []defaults.Setting{
		defaults.Bind(defaults.RetriesBound, &c.Retries),
		defaults.Bind(defaults.ConnectTimeoutBound, &c.ConnectTimeout),
		defaults.Bind(defaults.ResponseTimeoutBound, &c.ResponseTimeout),
		defaults.Bind(defaults.RetryAfterBound, &c.RetryAfter),
		defaults.Bind(defaults.DrainTimeoutBound, &c.DrainTimeout),
		defaults.Bind(defaults.HandshakeTimeoutBound, &c.HandshakeTimeout),
		defaults.Bind(defaults.HeaderTimeoutBound, &c.HeaderTimeout),
		defaults.Bind(defaults.KeepAliveTimeoutBound, &c.KeepAliveTimeout),
		defaults.Bind(defaults.IdleTimeoutBound, &c.IdleTimeout),
		defaults.Bind(defaults.AuthFailuresBound, &c.AuthFailures),
		defaults.Bind(defaults.MaxHeaderBytesBound, &c.MaxHeaderBytes),
		defaults.Bind(defaults.MaxHeaderFieldsBound, &c.MaxHeaderFields),
		defaults.Bind(defaults.MaxUnauthenticatedBound, &c.MaxUnauthenticated),
		defaults.Bind(defaults.BodyPeekBound, &c.BodyPeek),
		defaults.Bind(defaults.RetryBodyBytesBound, &c.RetryBodyBytes),
	}
	for i := range c.Users {
		s = append(s, defaults.Bind(defaults.MaxConnsBound, &c.Users[i].MaxConns).At(i))
	}
	return s
}

// WithDefaults returns c with every zero value that has a default
// filled in, and a negative Retries or RetryBodyBytes made 0.
func (c Config) WithDefaults() Config {
	c.Users = slices.Clone(c.Users)
	for _, s := range c.bounded() {
		s.Fill()
	}
	setDur(&c.FirstByteTimeout, defaults.FirstByteDefault(c.ResponseTimeout))
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Deny == nil {
		d := deny.Default()
		c.Deny = &d
	}
	return c
}

func setDur(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

// FieldError is a Config that does not validate, with the field named as
// the YAML does.
type FieldError struct {
	Field, Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func bad(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// userRE is a user name: it ends where its options begin
// (name-session-KEY), so it has no '-'; nor ':' (it ends the user in
// Basic credentials). The same rule as config's.
var userRE = regexp.MustCompile(`^[A-Za-z0-9._]{1,64}$`)

// Validate checks a Config (after WithDefaults). Its errors are
// *FieldError and never hold a password.
func (c Config) Validate() error {
	if c.Listen == "" && c.SocksListen == "" {
		return bad("gateway.listen", "required (or gateway.socks_listen)")
	}
	for _, l := range []struct{ f, v string }{{"gateway.listen", c.Listen}, {"gateway.socks_listen", c.SocksListen}} {
		if l.v == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.v); err != nil {
			return bad(l.f, "%v", err)
		}
	}
	if len(c.Users) == 0 {
		return bad("gateway.users", "at least one user is needed: the gateway is never an open proxy")
	}
	names := map[string]bool{}
	for i, u := range c.Users {
		f := fmt.Sprintf("gateway.users[%d]", i)
		if !userRE.MatchString(u.Name) {
			return bad(f+".name", "%q: want 1 to 64 letters, digits, '.' or '_' (no '-': it starts the options, as in name-session-KEY)", u.Name)
		}
		if names[u.Name] {
			return bad(f+".name", "%q is named twice", u.Name)
		}
		names[u.Name] = true
		if u.Password == "" {
			return bad(f+".password", "required")
		}
	}
	for _, s := range c.bounded() {
		if err := s.Check(); err != nil {
			return bad(s.Field, "%v", err)
		}
	}
	if err := defaults.CheckFirstByte(c.FirstByteTimeout, c.ResponseTimeout); err != nil {
		return bad(defaults.FirstByteTimeoutBound.Path, "%v", err)
	}
	if c.UpstreamUser == "" && c.UpstreamPassword != "" {
		return bad("proxy.auth.user", "required with a password")
	}
	return nil
}
