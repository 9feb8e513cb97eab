package rotation

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	a4 = netip.MustParseAddr("198.18.0.1")
	a6 = netip.MustParseAddr("2001:db8::1")
)

// The family of a proxy's address for a target of given families: IPv6
// when both have it, else IPv4 when both have it, else none.
func TestEgressFamily(t *testing.T) {
	both := Proxy{EgressAddrs: []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8:1::1")}}
	only4 := Proxy{EgressAddrs: both.EgressAddrs[:1]}
	only6 := Proxy{EgressAddrs: both.EgressAddrs[1:]}
	for _, c := range []struct {
		name string
		f    Families
		p    Proxy
		want int
	}{
		{"A to both", FamiliesOf([]netip.Addr{a4}), both, IPv4},
		{"AAAA to both", FamiliesOf([]netip.Addr{a6}), both, IPv6},
		{"A and AAAA to both", FamiliesOf([]netip.Addr{a4, a6}), both, IPv6},
		{"A and AAAA to IPv4 only", Families{V4: true, V6: true}, only4, IPv4},
		{"AAAA to IPv4 only", Families{V6: true}, only4, NoFamily},
		{"A to IPv6 only", Families{V4: true}, only6, NoFamily},
		{"nothing", Families{}, both, NoFamily},
		{"mapped IPv4 is A", FamiliesOf([]netip.Addr{netip.MustParseAddr("::ffff:198.18.0.1")}), both, IPv4},
	} {
		if got := c.f.EgressFamily(c.p); got != c.want {
			t.Errorf("%s: family %d, want %d", c.name, got, c.want)
		}
		if a := RandomEgress(c.p, c.f.EgressFamily(c.p)); a.IsValid() != (c.want != NoFamily) || (a.IsValid() && !InFamily(a, c.want)) {
			t.Errorf("%s: egress %s", c.name, a)
		}
	}
}

// countingLookup resolves from m, counting the lookups; release (when
// set) holds each lookup until it is closed.
type countingLookup struct {
	m       map[string][]netip.Addr
	n       atomic.Int32
	release chan struct{}
}

func (l *countingLookup) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	l.n.Add(1)
	if l.release != nil {
		select {
		case <-l.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if as, ok := l.m[host]; ok {
		return as, nil
	}
	return nil, errors.New("no such host")
}

// Answers are kept for FamilyTTL, failures for FamilyFailTTL, then asked
// again; concurrent askers of one name share one lookup.
func TestFamilyCache(t *testing.T) {
	l := &countingLookup{m: map[string][]netip.Addr{"dual.example": {a4, a6}, "v4.example": {a4}}}
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	c := NewFamilyCache(l.lookup, clock)
	ctx := t.Context()
	for range 3 {
		if f, err := c.Families(ctx, "dual.example"); err != nil || f != (Families{V4: true, V6: true}) {
			t.Fatalf("dual.example: %+v %v", f, err)
		}
	}
	if n := l.n.Load(); n != 1 {
		t.Fatalf("%d lookups for one name within its TTL", n)
	}
	advance(FamilyTTL)
	if _, err := c.Families(ctx, "dual.example"); err != nil || l.n.Load() != 2 {
		t.Fatalf("after the TTL: %v, %d lookups", err, l.n.Load())
	}
	for range 2 {
		if _, err := c.Families(ctx, "nx.example"); err == nil {
			t.Fatal("nx.example resolved")
		}
	}
	if n := l.n.Load(); n != 3 {
		t.Fatalf("a failure was asked again at once: %d lookups", n)
	}
	advance(FamilyFailTTL)
	_, _ = c.Families(ctx, "nx.example")
	if n := l.n.Load(); n != 4 {
		t.Fatalf("a failure was kept past FamilyFailTTL: %d lookups", n)
	}

	// Coalesced: 8 askers while one lookup is held make one lookup.
	l.release = make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			f, err := c.Families(ctx, "v4.example")
			if err == nil && f != (Families{V4: true}) {
				err = errors.New("wrong families")
			}
			errs <- err
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.n.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// Let the others reach the lookup in flight (the count holds
	// however late they come: after it, the answer is cached).
	time.Sleep(20 * time.Millisecond)
	close(l.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := l.n.Load(); n != 5 {
		t.Errorf("8 concurrent askers made %d lookups, want 1", n-4)
	}
}

// A lookup that does not answer is given up after FamilyLookupTimeout,
// even when the asker's context has no deadline: the name gets no family.
func TestFamilyCacheLookupTimeout(t *testing.T) {
	var gotDeadline atomic.Bool
	c := NewFamilyCache(func(ctx context.Context, _ string) ([]netip.Addr, error) {
		d, ok := ctx.Deadline()
		gotDeadline.Store(ok && time.Until(d) <= FamilyLookupTimeout)
		return nil, context.DeadlineExceeded
	}, nil)
	p := Proxy{EgressAddrs: []netip.Addr{a4}}
	if f := c.TargetFamily(context.Background(), "slow.example", p); f != NoFamily {
		t.Errorf("an unresolved name: family %d", f)
	}
	if !gotDeadline.Load() {
		t.Error("the lookup had no deadline within FamilyLookupTimeout")
	}
}

// TargetFamily: an address literal's own family, no lookup for a proxy
// without addresses, a name's resolved family otherwise.
func TestTargetFamily(t *testing.T) {
	l := &countingLookup{m: map[string][]netip.Addr{"v6.example": {a6}}}
	c := NewFamilyCache(l.lookup, nil)
	p := Proxy{EgressAddrs: []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8:1::1")}}
	ctx := t.Context()
	for host, want := range map[string]int{"198.18.0.9": IPv4, "[2001:db8::9]": IPv6, "2001:db8::9": IPv6, "v6.example": IPv6, "nx.example": NoFamily} {
		if got := c.TargetFamily(ctx, host, p); got != want {
			t.Errorf("%s: family %d, want %d", host, got, want)
		}
	}
	n := l.n.Load()
	if got := c.TargetFamily(ctx, "other.example", Proxy{ID: "bare"}); got != AnyFamily || l.n.Load() != n {
		t.Errorf("a proxy without addresses: family %d, %d lookups", got, l.n.Load()-n)
	}
}

// Proxy tells a proxy with both families an address of the family a
// named target is reached over: the name's as the lookup resolves it;
// none for a name that does not resolve.
func TestProxyFuncEgressFamilyOfAName(t *testing.T) {
	l := &countingLookup{m: map[string][]netip.Addr{"v4.example": {a4}, "v6.example": {a6}, "dual.example": {a4, a6}}}
	r, err := newRotation(Config{LookupNetIP: l.lookup})
	if err != nil {
		t.Fatal(err)
	}
	p := planned(4)
	p.Addr = "198.18.101.5:3128"
	r.idx.put(p, 1)
	for host, want := range map[string]int{"v4.example": IPv4, "v6.example": IPv6, "dual.example": IPv6, "nx.example": NoFamily} {
		req := httptest.NewRequest(http.MethodGet, "https://"+host+"/", nil)
		u, err := r.Proxy(req)
		if err != nil {
			t.Fatal(err)
		}
		h, err := r.ProxyConnectHeader(req.Context(), u, host+":443")
		if err != nil {
			t.Fatal(err)
		}
		if want == NoFamily {
			if h != nil {
				t.Errorf("%s (does not resolve): CONNECT header %v", host, h)
			}
			continue
		}
		if a, err := netip.ParseAddr(h.Get(HeaderEgress)); err != nil || !InFamily(a, want) {
			t.Errorf("%s: CONNECT header %v, want an IPv%d address", host, h, want)
		}
	}
}

// The cache holds at most MaxFamilyNames names.
func TestFamilyCacheIsBounded(t *testing.T) {
	c := NewFamilyCache(func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{a4}, nil }, nil)
	for i := range MaxFamilyNames + 10 {
		if _, err := c.Families(t.Context(), fmt.Sprintf("n%d.example", i)); err != nil {
			t.Fatal(err)
		}
		if n := len(c.names); n > MaxFamilyNames {
			t.Fatalf("%d names held", n)
		}
	}
}
