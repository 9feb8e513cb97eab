package config

import (
	"errors"
	"time"

	"proxyfleet/bans"
	"proxyfleet/deny"
	gwdef "proxyfleet/gateway/defaults"
	rotdef "proxyfleet/rotation/defaults"
)

// Gateway is the one address the fleet's clients send traffic to (`proxyfleet
// gateway`, or inside `serve` when Listen is set): an HTTP forward proxy
// (and SOCKS5 on SocksListen) over the proxies in the rotation, reached with
// proxy.auth.
type Gateway struct {
	// Listen is the HTTP proxy's address (host:port). Empty: no gateway
	// in serve; the gateway role needs it or SocksListen.
	Listen      string `yaml:"listen"`
	SocksListen string `yaml:"socks_listen"`
	// Users may use the gateway, each with its password (never an open
	// proxy): at least one when it listens.
	Users []GatewayUser `yaml:"users"`
	// Strategy picks a proxy for a request without a session key:
	// round-robin (default), random or least-busy.
	Strategy string `yaml:"strategy"`
	// Retries: how many other proxies a request whose proxy failed before
	// any byte reached the client is tried on (absent: 2; 0: none, the
	// request's first failure is answered).
	Retries *int `yaml:"retries"`
	// ConnectTimeout bounds the connection to a proxy and its answer to
	// CONNECT (default 5s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ResponseTimeout bounds the wait for a proxy's answer to a plain
	// request, the target's time included (default 30s): a proxy that
	// died holding an idle connection of the gateway's never answers;
	// a request without a body is then tried on another.
	ResponseTimeout time.Duration `yaml:"response_timeout"`
	// FirstByteTimeout: a connection to a proxy that carries a request
	// and shows no sign of life this long (what was sent unacknowledged,
	// nothing from the proxy) takes the proxy for dead; the request goes
	// to another at once if it can be sent again. Default 3s, at least
	// 500ms, at most response_timeout (a shorter response_timeout is its
	// default and least value).
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// IdleTimeout: a CONNECT or SOCKS5 tunnel, or a request's body being
	// received, that carries no byte in either direction for this long
	// is closed (default 5m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// RetryAfter is the Retry-After of the 503 answered when no proxy
	// matches (default 5s, sent in whole seconds).
	RetryAfter time.Duration `yaml:"retry_after"`
	// DrainTimeout bounds the wait for requests and tunnels in flight
	// once the gateway stops (default 5s); then they are closed.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// HandshakeTimeout bounds a SOCKS5 client's greeting,
	// authentication and request (default 10s).
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// KeepAliveTimeout closes an HTTP client connection idle between
	// requests for this long (default 90s).
	KeepAliveTimeout time.Duration `yaml:"keepalive_timeout"`
	// Cooldown: a proxy this gateway reported is passed over for this long
	// (unless no other matches), default 10s.
	Cooldown time.Duration `yaml:"cooldown"`
	// AuthFailures: failed credentials one source address may present
	// within a minute (default 5); then its attempts are refused
	// unchecked (HTTP 429, SOCKS5 failure) until the minute has passed.
	AuthFailures int `yaml:"auth_failures"`
	// MaxHeaderBytes (default 64 KiB, at least 8 KiB) and MaxHeaderFields
	// (default 100) bound an HTTP request's head: over either, 431 before
	// the credential is looked at, and the connection closes.
	MaxHeaderBytes  int `yaml:"max_header_bytes"`
	MaxHeaderFields int `yaml:"max_header_fields"`
	// HeaderTimeout: an HTTP request's head not complete this long after
	// the accept (or a next request's first byte) closes the connection
	// (default 10s).
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// MaxUnauthenticated: connections (HTTP and SOCKS5) open at once
	// without a valid credential yet (default 1024); over it, new ones
	// are closed as they are accepted.
	MaxUnauthenticated int `yaml:"max_unauthenticated"`
	// HTTP is where `proxyfleet gateway` serves /metrics, /healthz and
	// /readyz (overridden by --http; empty: no listener); `serve` serves
	// the gateway's metrics on health.http.
	HTTP string `yaml:"http"`
	// Deny lists the destination networks (CIDRs, or single addresses)
	// the gateway refuses, before it picks a proxy, when a target's host
	// is an address in them (names are not resolved: the proxies' squid
	// refuses those resolving into proxy.deny). Absent (or null):
	// deny.Default; an empty list: none. DenyList reads it.
	Deny *[]string `yaml:"deny"`
	// Rules judge each answer of a proxy (its status, the first BodyPeek
	// bytes of its body, the time to its first byte), in order: the first
	// that matches may ban the answering address for the request's site
	// and retry the request (at most Retries times). See package bans.
	Rules []bans.RuleSpec `yaml:"rules"`
	// BodyPeek: the bytes of an answer's body a body rule reads (default
	// 16 KiB), only for the sites a body rule names.
	BodyPeek int `yaml:"body_peek"`
	// RetryBodyBytes: the largest request body kept to send again on a
	// retry (absent: 64 KiB; 0: none): a request with a larger body is
	// not retried once its body has been sent.
	RetryBodyBytes *int `yaml:"retry_body_bytes"`
}

// bounded pairs each numeric setting of g with its bound
// (gateway/defaults.Bounds), but first_byte_timeout, whose range
// depends on response_timeout (gwdef.CheckFirstByte); retries and
// retry_body_bytes once set (SetDefaults sets them).
func (g *Gateway) bounded() []gwdef.Setting {
	s := []gwdef.Setting{
		gwdef.Bind(gwdef.ConnectTimeoutBound, &g.ConnectTimeout),
		gwdef.Bind(gwdef.ResponseTimeoutBound, &g.ResponseTimeout),
		gwdef.Bind(gwdef.RetryAfterBound, &g.RetryAfter),
		gwdef.Bind(gwdef.DrainTimeoutBound, &g.DrainTimeout),
		gwdef.Bind(gwdef.HandshakeTimeoutBound, &g.HandshakeTimeout),
		gwdef.Bind(gwdef.HeaderTimeoutBound, &g.HeaderTimeout),
		gwdef.Bind(gwdef.KeepAliveTimeoutBound, &g.KeepAliveTimeout),
		gwdef.Bind(gwdef.IdleTimeoutBound, &g.IdleTimeout),
		gwdef.Bind(gwdef.AuthFailuresBound, &g.AuthFailures),
		gwdef.Bind(gwdef.MaxHeaderBytesBound, &g.MaxHeaderBytes),
		gwdef.Bind(gwdef.MaxHeaderFieldsBound, &g.MaxHeaderFields),
		gwdef.Bind(gwdef.MaxUnauthenticatedBound, &g.MaxUnauthenticated),
		gwdef.Bind(gwdef.BodyPeekBound, &g.BodyPeek),
	}
	if g.Retries != nil {
		s = append(s, gwdef.Bind(gwdef.RetriesBound, g.Retries))
	}
	if g.RetryBodyBytes != nil {
		s = append(s, gwdef.Bind(gwdef.RetryBodyBytesBound, g.RetryBodyBytes))
	}
	for i := range g.Users {
		s = append(s, gwdef.Bind(gwdef.MaxConnsBound, &g.Users[i].MaxConns).At(i))
	}
	return s
}

// setDefaults fills g's gaps: an absent key of a setting whose 0 is a
// value of its own (retries, retry_body_bytes), a zero of any other.
func (g *Gateway) setDefaults() {
	if g.Strategy == "" {
		g.Strategy = rotdef.Strategy
	}
	setDur(&g.Cooldown, rotdef.Cooldown)
	for _, o := range []struct {
		b gwdef.Bound
		p **int
	}{{gwdef.RetriesBound, &g.Retries}, {gwdef.RetryBodyBytesBound, &g.RetryBodyBytes}} {
		if *o.p == nil {
			v := int(o.b.Default)
			*o.p = &v
		}
	}
	for _, s := range g.bounded() {
		if !s.Off {
			s.Fill()
		}
	}
	setDur(&g.FirstByteTimeout, gwdef.FirstByteDefault(g.ResponseTimeout))
}

// validateBounds checks g's numeric settings against their bounds.
func (g *Gateway) validateBounds() error {
	for _, s := range g.bounded() {
		if err := s.Check(); err != nil {
			return bad(s.Field, "%v", err)
		}
	}
	if err := gwdef.CheckFirstByte(g.FirstByteTimeout, g.ResponseTimeout); err != nil {
		return bad(gwdef.FirstByteTimeoutBound.Path, "%v", err)
	}
	return nil
}

// CompiledRules compiles gateway.rules (Validate has refused them already
// when they are bad; the error names the rule and field).
func (g Gateway) CompiledRules() (*bans.Rules, error) {
	rs, err := bans.Compile(g.Rules)
	if err != nil {
		return nil, ruleErr(err)
	}
	return rs, nil
}

func ruleErr(err error) error {
	var re *bans.RuleError
	if errors.As(err, &re) {
		return bad(re.Path("gateway.rules"), "%s", re.Reason)
	}
	return bad("gateway.rules", "%v", err)
}

// GatewayUser is one user of the gateway. The password comes from
// PasswordFile, read by LoadGatewaySecrets and never printed.
type GatewayUser struct {
	Name         string `yaml:"name"`
	PasswordFile string `yaml:"password_file"`
	// MaxConns bounds the user's connections at once (default 256).
	MaxConns int    `yaml:"max_conns"`
	Password Secret `yaml:"-" json:"-"`
}

// Console is the web console (`proxyfleet console`, or inside `serve` when
// Listen is set): the fleet in a browser, for its users only.
type Console struct {
	// Listen is the console's address (host:port). Empty: no console in
	// serve; the console role needs it.
	Listen string `yaml:"listen"`
	// Users may log in, each with its password (the console is never
	// open to anyone who reaches it): at least one when it listens.
	Users []ConsoleUser `yaml:"users"`
	// HTTP is where `proxyfleet console` serves /metrics, /healthz and
	// /readyz (overridden by --http; empty: no listener).
	HTTP string `yaml:"http"`
	// ViewRefresh is how often, at least, the proxies page's view is read
	// afresh for what the state events do not carry (default
	// console/defaults.ViewRefresh; at least MinViewRefresh).
	ViewRefresh time.Duration `yaml:"view_refresh"`
	// Gateways are the ops listeners (http://host:port, a gateway's
	// gateway.http) whose /metrics the console reads for its traffic
	// page; none: the page says so.
	Gateways []string `yaml:"gateways"`
}

// ConsoleUser is one user of the console. The password comes from
// PasswordFile, read by LoadConsoleSecrets and never printed. Only an
// Admin may act (create, delete, recycle, ...); the others only look.
type ConsoleUser struct {
	Name         string `yaml:"name"`
	PasswordFile string `yaml:"password_file"`
	Admin        bool   `yaml:"admin"`
	Password     Secret `yaml:"-" json:"-"`
}

// DenyList is proxy.deny: deny.Default when absent, the empty List for
// an empty list. Its error names the entry (Validate refuses the config
// first).
func (p Proxy) DenyList() (deny.List, error) { return denyList("proxy.deny", p.Deny) }

// DenyList is gateway.deny, as Proxy.DenyList is proxy.deny.
func (g Gateway) DenyList() (deny.List, error) { return denyList("gateway.deny", g.Deny) }

func denyList(field string, entries *[]string) (deny.List, error) {
	if entries == nil {
		return deny.Default(), nil
	}
	return deny.Parse(field, *entries)
}
