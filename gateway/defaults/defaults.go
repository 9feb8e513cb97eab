// Package defaults holds the defaults of the gateway's settings, as
// constants, and the range of each numeric one (Bounds):
// gateway.Config.WithDefaults fills a Config's zero values with them and
// Validate checks the ranges; package config does the same for a file, so
// a gateway started from a file and one started from code agree. It
// imports only the standard library, so that config, which may not lean
// on NATS, can read it. The gateway's other defaults are those of the
// packages that own the setting: the deny list is deny.Default, strategy
// and cooldown the rotation's (proxyfleet/rotation/defaults).
package defaults

import "time"

const (
	// Retries is how many other proxies a request whose proxy failed
	// before any byte reached the client is tried on.
	Retries = 2
	// ConnectTimeout bounds the connection to a proxy and its answer to
	// CONNECT.
	ConnectTimeout = 5 * time.Second
	// ResponseTimeout bounds the wait for a proxy's answer to a plain
	// request, the target's time included.
	ResponseTimeout = 30 * time.Second
	// FirstByteTimeout is how long a connection to a proxy may carry a
	// request without a sign of life before the proxy is taken for dead
	// (at most the response timeout).
	FirstByteTimeout = 3 * time.Second
	// RetryAfter is the Retry-After of the 503 answered when no proxy
	// matches.
	RetryAfter = 5 * time.Second
	// DrainTimeout bounds the wait for requests and tunnels in flight
	// once the gateway stops.
	DrainTimeout = 5 * time.Second
	// HandshakeTimeout bounds a SOCKS5 client's greeting, authentication
	// and request.
	HandshakeTimeout = 10 * time.Second
	// KeepAliveTimeout closes an HTTP client connection idle between
	// requests.
	KeepAliveTimeout = 90 * time.Second
	// IdleTimeout closes a tunnel, or a request's body being received,
	// that carried no byte in either direction for this long.
	IdleTimeout = 5 * time.Minute
	// MaxConns bounds a user's requests and tunnels at once.
	MaxConns = 256
	// AuthFailures is how many failed credentials one source address may
	// present within a minute.
	AuthFailures = 5
	// HeaderTimeout bounds the time to an HTTP request's complete head.
	HeaderTimeout = 10 * time.Second
	// MaxHeaderBytes and MaxHeaderFields bound an HTTP request's head.
	MaxHeaderBytes  = 64 << 10
	MaxHeaderFields = 100
	// MinMaxHeaderBytes is max_header_bytes' least value: the size of
	// the gateway's reader of a client connection (a head that fits it
	// is taken whole; a larger one is read apart).
	MinMaxHeaderBytes = 8 << 10
	// MinFirstByteTimeout is first_byte_timeout's least value (unless
	// response_timeout is shorter).
	MinFirstByteTimeout = 500 * time.Millisecond
	// BodyPeek is the bytes of an answer's body a body rule (package
	// bans) reads.
	BodyPeek = 16 << 10
	// RetryBodyBytes is the largest request body held so that it may be
	// sent again on a retry.
	RetryBodyBytes = 64 << 10
	// MaxUnauthenticated bounds the connections open at once without a
	// valid credential yet.
	MaxUnauthenticated = 1024
)
