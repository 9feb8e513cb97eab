package rotation

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// LookupFunc resolves a host name to its addresses (A and AAAA), as
// net.Resolver.LookupNetIP with network "ip" does.
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// DefaultLookup is net.DefaultResolver's LookupNetIP for network "ip".
func DefaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// The bounds of a FamilyCache: how long an answer is kept (a failure for
// less, so a name that starts to resolve is soon used), how long one
// lookup may take (a request waits for it: a name not resolved by then
// is left to the proxy), and how many names are kept.
const (
	FamilyTTL           = 30 * time.Second
	FamilyFailTTL       = 5 * time.Second
	FamilyLookupTimeout = time.Second
	MaxFamilyNames      = 4096
)

// FamilyCache answers which address families target names resolve to,
// for choosing the family of an egress address (TargetFamily). It keeps
// answers and failures for a short time, up to MaxFamilyNames names (when
// full it drops those expired, or else all), and makes one lookup at a
// time for a name however many ask. Safe for concurrent use.
type FamilyCache struct {
	lookup LookupFunc
	now    func() time.Time
	group  singleflight.Group
	mu     sync.RWMutex
	names  map[string]familyEntry
}

type familyEntry struct {
	f       Families
	err     error
	expires time.Time
}

// NewFamilyCache is a FamilyCache over lookup (nil: DefaultLookup) and
// the clock now (nil: time.Now).
func NewFamilyCache(lookup LookupFunc, now func() time.Time) *FamilyCache {
	if lookup == nil {
		lookup = DefaultLookup
	}
	if now == nil {
		now = time.Now
	}
	return &FamilyCache{lookup: lookup, now: now, names: map[string]familyEntry{}}
}

// Families are the families host resolves to. An error when it does not
// resolve within FamilyLookupTimeout, or to no address. The lookup runs
// apart from ctx's cancellation (others may wait for it) but within its
// values and the timeout, which bounds the wait.
func (c *FamilyCache) Families(ctx context.Context, host string) (Families, error) {
	if e, ok := c.cached(host); ok {
		return e.f, e.err
	}
	v, _, _ := c.group.Do(host, func() (any, error) {
		if e, ok := c.cached(host); ok {
			return e, nil
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FamilyLookupTimeout)
		defer cancel()
		addrs, err := c.lookup(lctx, host)
		e := familyEntry{f: FamiliesOf(addrs)}
		ttl := FamilyTTL
		switch {
		case err != nil:
			e.err = fmt.Errorf("resolve %q: %w", host, err)
		case !e.f.V4 && !e.f.V6:
			e.err = fmt.Errorf("resolve %q: no address", host)
		}
		if e.err != nil {
			e.f, ttl = Families{}, FamilyFailTTL
		}
		c.store(host, e, ttl)
		return e, nil
	})
	e := v.(familyEntry)
	return e.f, e.err
}

func (c *FamilyCache) cached(host string) (familyEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.names[host]
	if !ok || !c.now().Before(e.expires) {
		return familyEntry{}, false
	}
	return e, true
}

func (c *FamilyCache) store(host string, e familyEntry, ttl time.Duration) {
	now := c.now()
	e.expires = now.Add(ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.names) >= MaxFamilyNames {
		for h, old := range c.names {
			if !now.Before(old.expires) {
				delete(c.names, h)
			}
		}
		if len(c.names) >= MaxFamilyNames {
			clear(c.names)
		}
	}
	c.names[host] = e
}

// TargetFamily is the family of p's addresses that a request to host
// (a name, or an address literal, an IPv6 one in brackets or not) is told
// to leave from: an address literal's; for a name, its families'
// (Families.EgressFamily), or NoFamily when it does not resolve (the
// proxy then chooses: no guess). A proxy without addresses needs none:
// AnyFamily, and no lookup.
func (c *FamilyCache) TargetFamily(ctx context.Context, host string, p Proxy) int {
	if f := FamilyOf(host); f != AnyFamily || len(p.EgressAddrs) == 0 {
		return f
	}
	fs, err := c.Families(ctx, host)
	if err != nil {
		return NoFamily
	}
	return fs.EgressFamily(p)
}
