// Package gateway is the fleet's clients' one address: an HTTP forward
// proxy (CONNECT and absolute http:// requests) and, on a second listener, a
// SOCKS5 server (RFC 1928, CONNECT only, username/password per RFC 1929),
// in front of the proxies of the rotation, each reached with the fleet's
// credential (proxy.auth).
//
// It consumes the rotation through Picker, declared here and implemented
// by package rotation: Pick and PickSession choose a proxy for a
// Selector (labels, and the proxies a request already tried), Acquire
// counts what a proxy carries (least-busy), Report says a proxy failed us
// (health probes it at once; the picker cools it down locally).
//
// # Never an open proxy
//
// Every request needs one of Config.Users: Proxy-Authorization: Basic for
// HTTP (none or wrong: 407 with Proxy-Authenticate: Basic
// realm="proxyfleet"), RFC 1929 for SOCKS5 (no method offered but
// username/password: "no acceptable methods"; wrong: status 1). A 407
// for a wrong credential closes the connection; one for a missing
// credential keeps it (a browser sends it on the same connection once
// asked). New refuses a config without users. Passwords are compared
// in constant time (of their SHA-256) and never logged, put in an error
// or a metric.
//
// After AuthFailures (default 5) failed credentials from one source
// within a minute (from the first of them), that source's credentials
// are refused without a password being checked until the minute has
// passed: 429 with Retry-After (and a close) for HTTP, RFC 1929 status
// 1 for SOCKS5. A source is an IPv4 address, or the /64 of an IPv6 one
// (what a network hands one host). A connection's credential that
// passed before is taken again as ever. The table of sources holds at
// most 10,000; a new one evicts the one whose minute began first.
// Each user has at most MaxConns requests and tunnels at once; over it:
// 429, or a SOCKS5 general failure.
//
// # Sessions and labels
//
// The user name carries options after the configured name:
// USER-session-KEY, USER-label-KEY-VALUE (repeatable), USER-pool-NAME
// (label pool=NAME: the members of a pool of `proxyfleet pool set`),
// combinable (alice-session-s1-label-country-de); so user names have no
// '-', nor do keys and values in this form, but a pool's name may
// (alice-pool-eu-west-session-s1): it runs to the next option word. HTTP
// requests may say the same with X-Proxyfleet-Session: KEY and
// X-Proxyfleet-Labels: k=v,k2=v2 (they win over the user name's, and are
// removed before forwarding). Options are parsed only once the password
// is right: a malformed one is then a 400. A session key picks with
// PickSession (the same proxy while it stays), otherwise Pick.
//
// # Upstream
//
// A CONNECT (or a SOCKS5 request) is carried by the gateway's own CONNECT
// to the picked proxy, with the fleet's Proxy-Authorization; once the
// proxy answers 200, the client gets 200 with X-Proxyfleet-Proxy: <id>,
// and the tunnel is piped both ways by two goroutines of the gateway,
// each burst read into a pooled buffer and written on (on Linux the wait
// holds no buffer; the request's buffers go first). A plain request (absolute http://
// URI) is forwarded as such over a keep-alive connection to the picked
// proxy (pooled per proxy), with Host from the URI, the client's fields
// but the hop-by-hop ones (and those its Connection names), the
// client's Proxy-Authorization and the gateway's own X-Proxyfleet-*
// removed, and the fleet's credential added; the answer comes back with
// X-Proxyfleet-Proxy, by its length, or chunked (what came chunked or
// until the proxy closed), written as it comes. A target is written to a
// proxy only once it passes the rule of target.go (a host name of LDH
// labels, an IPv4 address or an IPv6 one in brackets, a port 1–65535):
// else the client gets 400, or SOCKS5 reply 4 (host unreachable), and no
// proxy is picked.
//
// # Denied destinations
//
// A target whose host is an address that Config.Deny lists (by default
// deny.Default: loopback, 0.0.0.0/8 and ::, link-local with a cloud's
// metadata service, RFC 1918, 100.64.0.0/10, fc00::/7; IPv4-mapped IPv6
// addresses unmapped first) is refused before any proxy is picked, on
// CONNECT, plain requests and SOCKS5, an address given as a SOCKS5 domain
// included: 403 Forbidden with "destination A is denied", or SOCKS5
// reply 2 (connection not allowed by ruleset); no proxy hears of it. The
// addresses the gateway listens on (when not unspecified) are refused
// too, unless the list is empty. A host name is not checked by the
// gateway (it resolves one only to choose the family of an egress
// address): the proxy resolves it, and its squid refuses a name that
// resolves into its own list (proxy.deny).
//
// # One stack
//
// The HTTP proxy's connections are served by a loop of the gateway's
// own (serve.go; what happens to a request, from its head to its
// answer, is in request.go): a strict HTTP/1.x parser without
// allocation (package gateway/h1), one goroutine per connection, one write for a request's
// head (and a small body) to the proxy and one for the answer's head
// (and what came of its body) to the client, no goroutine per request
// unless a body must go up while the answer is awaited; 1xx interim
// answers are dropped, Expect: 100-continue is answered by the gateway,
// a client that leaves while its answer is awaited is noticed within
// 250ms. Every request head is read by that parser (one larger than
// the client's 8 KiB reader is read whole into a buffer of its own, up
// to MaxHeaderBytes, and then served alike), and one it does not take
// is refused there (below): there is no other parser. The gateway
// carries CONNECT and absolute http:// targets; any other (origin-form,
// OPTIONS *, https:// in absolute form, another scheme) is refused with
// 400 "this is a proxy: send CONNECT or an absolute http:// URI", before
// the credential is looked at, and the connection closed: an https://
// target is tunneled with CONNECT.
//
// # Refused heads
//
// Before its credential is looked at, a request is answered and its
// connection closed (what the client sends on is read and dropped for
// up to 500ms, so the answer is not lost to a reset) if its head breaks
// RFC 9112: 400 for a malformed request line or field (whitespace
// before a colon, obs-fold, a bare CR or LF, a control byte in a value,
// a name not a token), an HTTP/1.1 request without exactly one Host or
// with a Host that is no host[:port], Content-Length values that differ
// or are not digits, a Transfer-Encoding whose last coding is not
// chunked (or chunked twice, or any in HTTP/1.0), more than 8 options
// in Connection, an http:// target with user info, a bad authority or a
// fragment; 501 for a transfer coding besides chunked; 417 for an
// Expect but 100-continue; 505 for an HTTP version but 1.0 and 1.1. A
// chunked request body that turns out malformed (a size not hex, or
// with whitespace before it, data longer than its size, a bare LF) ends
// the proxy's connection before any more of it is sent and is answered
// 400.
//
// # Limits before authentication
//
// What a client that has not authenticated can cost is bounded. An HTTP
// request's head is due HeaderTimeout (default 10s) after the
// connection's accept, or for a next request on a kept-alive connection
// after its first byte; not complete by then, the connection is closed
// (its read deadline). A head over MaxHeaderBytes (default 64 KiB; read
// up to that much) or with more than MaxHeaderFields fields (default
// 100; counted by the parser) is answered 431 Request Header
// Fields Too Large before its credential is looked at, and the
// connection closed. At most MaxUnauthenticated connections (default
// 1024, HTTP and SOCKS5 together) are open at once that have not yet
// presented a valid credential; over it, a new connection is closed as
// it is accepted (proxyfleet_gateway_unauthenticated_refused_total).
//
// # Framing
//
// A request with both Content-Length and Transfer-Encoding: chunked is
// carried as chunked (its length is not forwarded), answered, and its
// connection closed (RFC 9112 6.1).
//
// # Idle
//
// A CONNECT or SOCKS5 tunnel that carried no byte either way for
// IdleTimeout (default 5m) is closed, both its connections; so is a
// client connection whose request's body stops coming for as long (the
// request unanswered, no proxy held to blame). Between requests, a
// kept-alive client connection is closed after KeepAliveTimeout (90s).
// These bound every wait on a client: its connection carries no TCP
// keepalive.
//
// # Failover and reports
//
// A proxy that refuses the connection, does not accept or (for CONNECT)
// answer within ConnectTimeout, answers CONNECT with anything but 200, or
// fails a plain request before any byte of the answer reached the client
// (no answer, a reset, or 407: the proxy's own answer), is reported
// (Picker.Report with the reason: "connect: connection refused",
// "connect timeout", "CONNECT answered 502 Bad Gateway") and the request
// is tried on another proxy (Selector.Exclude the ones tried), up to
// Retries more times; a session moves then, and the answer names the
// proxy that carried it. A plain request with a body is tried again only
// if the failed proxy took none of it, or the gateway holds it whole
// (below). A connection to a proxy is kept
// only at a clean message boundary: its answer read to the end (framed
// one way: not Content-Length with chunked), nothing buffered after it,
// the request's body sent whole before the answer came; and before it
// is used again it is looked at (a peek that does not wait): anything
// readable on it (the proxy's close, or bytes it sent unasked, which
// would be taken for the next request's answer) and it is closed. A
// kept-alive connection the proxy closed meanwhile is nobody's failure:
// a request without a body and of an idempotent method that finds it
// closed goes once more on a new connection to the same proxy.
//
// A dead proxy is not waited for (failover.go). An attempt is watched
// from its pick until its answer's head (CONNECT: the proxy's 200), and
// ended, its request tried on another proxy, when its proxy leaves the
// rotation (Picker.Changed; not reported), or when its connection shows
// no sign of life for FirstByteTimeout (default 3s): what was sent is
// unacknowledged by the proxy's TCP and nothing came from the proxy
// (reported, its idle connections closed). A live proxy acknowledges
// whatever its target does, so a slow target is still waited for up to
// ResponseTimeout. A kept-alive connection idle long enough for TCP
// keepalive (from 10s of quiet on) to have probed it is not used if the
// proxy answered none of the probes: the proxy is failed as silent. A
// plain request with a body goes to another proxy only if the gateway
// holds the body whole: one of a known length that came with its head
// and fits, with the head, the 32 KiB write to the proxy. Plain requests
// and CONNECT share the decision. An open tunnel whose proxy left the rotation is
// watched from then on, and closed (both its connections) once its
// proxy connection shows no sign of life for FirstByteTimeout; one whose
// proxy lives goes on. What
// speaks for the target is
// passed on and held against no proxy: every plain answer but 407, and an
// answer to CONNECT that carries squid's X-Squid-Error (the target did
// not answer, its name did not resolve), 407 aside. A SOCKS5 request
// gets the reply that says what squid's answer did (socksReplyFor):
// ERR_ACCESS_DENIED (its deny acls, proxy.deny's among them) 2, not
// allowed; ERR_CONNECT_FAIL 111 5, refused; 101 3; another errno,
// ERR_DNS_FAIL or ERR_CANNOT_FORWARD 4, host unreachable; else 1. When nothing matches
// (ErrEmpty on the first pick), the answer is 503 with Retry-After and a
// body that says so ("no proxy in the rotation", "no proxy matches labels
// country=de"); when every proxy tried failed, 502 with their reasons.
//
// # Metrics
//
// proxyfleet_gateway_requests_total{kind=connect|http|socks, outcome=ok|
// auth|throttled|limit|empty|upstream_failed|client_gone|error|denied},
// _auth_failures_total{kind,reason=missing|wrong|throttled},
// _retries_total{kind}, _failovers_total{cause} (the retries by the
// cause of the failure before them),
// _upstream_failures_total{cause=refused|timeout|status|reset|other|
// left|silent}, _idle_closed_total{what=tunnel|body},
// _reports_total{result=ok|error}, _in_flight{kind},
// _bytes_total{direction=up|down} (a tunnel's bytes are added when it
// ends), _upstream_connect_duration_seconds,
// _unauthenticated_connections and _unauthenticated_refused_total. No
// label carries a proxy id or a user name.
//
// # Lifecycle
//
// Run(ctx) listens (port 0 works: Addr, SocksAddr once Started is
// closed), serves, and when ctx ends stops accepting, closes idle
// connections, lets requests and tunnels in flight end for up to
// DrainTimeout, then closes them, and returns once every goroutine it
// started has ended.
package gateway
