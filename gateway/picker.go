package gateway

import "proxyfleet/rotation"

// Proxy, Selector and ErrEmpty are package rotation's: the gateway
// passes what the rotation gives it back to the rotation, so the two
// share the types rather than convert on every request. The gateway
// reads a Proxy's ID (the X-Proxyfleet-Proxy header, logs and reports),
// Addr (host:port) and Labels; a Selector says which proxies a request
// may use (Labels all matching, none of Exclude: the ones a request
// already tried).
type (
	Proxy    = rotation.Proxy
	Selector = rotation.Selector
)

// ErrEmpty is what a Picker returns (errors.Is) when no proxy matches.
var ErrEmpty = rotation.ErrEmpty

// Picker is what the gateway needs of the rotation. *rotation.Rotation
// implements it; tests give the gateway pickers of their own.
type Picker interface {
	// Pick chooses a proxy matching sel by the picker's strategy;
	// errors.Is(err, ErrEmpty) when none matches.
	Pick(sel Selector) (Proxy, error)
	// PickSession chooses the proxy of session key: the same one for as
	// long as it stays in the rotation and matches sel (a proxy in
	// sel.Exclude does not: the session moves).
	PickSession(key string, sel Selector) (Proxy, error)
	// Acquire says p carries one more request or tunnel until release
	// is called (for least-busy).
	Acquire(p Proxy) (release func())
	// Report says p failed the gateway, with why: health probes it at
	// once; the picker cools it down locally.
	Report(p Proxy, reason string) error
	// Len is how many proxies the rotation holds now.
	Len() int
	// Get returns the proxy id if it is in the rotation now.
	Get(id string) (Proxy, bool)
	// Changed returns a channel closed at the rotation's next change
	// (taken again after it closes): the gateway ends the requests in
	// flight on a proxy that left (see failover.go).
	Changed() <-chan struct{}
}

var _ Picker = (*rotation.Rotation)(nil)
