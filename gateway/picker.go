package gateway

import "errors"

// Proxy is one proxy of the rotation as the gateway uses it: its id (for
// the X-Proxyfleet-Proxy header, logs and reports), its address
// (host:port) and its labels.
type Proxy struct {
	ID, Addr string
	Labels   map[string]string
}

// Selector says which proxies a request may use: those carrying every
// label of Labels, except those named in Exclude (the ones a request
// already tried).
type Selector struct {
	Labels  map[string]string
	Exclude []string
}

// ErrEmpty is what a Picker returns (errors.Is) when no proxy matches.
var ErrEmpty = errors.New("no proxy matches")

// Picker is what the gateway needs of the rotation. Package rotation
// implements it; the gateway depends on nothing else of it.
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
}
