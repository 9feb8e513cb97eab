package console

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Login throttling: a source that failed this many logins within the
// window is answered 429, its password not checked, until the oldest of
// those failures leaves the window.
const (
	loginFailures = 5
	loginWindow   = time.Minute
	// maxThrottled bounds the sources remembered; beyond it, those whose
	// failures all left the window are forgotten first, then any.
	maxThrottled = 16384
)

// throttle counts failed logins by source: an IPv4 address, or an IPv6
// address's /64 (one host of IPv6 commonly holds a whole /64).
type throttle struct {
	mu   sync.Mutex
	now  func() time.Time
	fail map[netip.Prefix][]time.Time // failures within the window, oldest first
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, fail: map[netip.Prefix][]time.Time{}}
}

// sourceOf is the request's source as the throttle counts it: the
// connection's peer (a header cannot forge it); ok is false when
// RemoteAddr is no address (then nothing is counted).
func sourceOf(r *http.Request) (netip.Prefix, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}, false
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return netip.PrefixFrom(a, 32), true
	}
	p, _ := a.Prefix(64) // an IPv6 address always has a /64
	return p, true
}

// recent drops src's failures that left the window; t.mu is held.
func (t *throttle) recent(src netip.Prefix, now time.Time) []time.Time {
	fs := t.fail[src]
	i := 0
	for i < len(fs) && now.Sub(fs[i]) >= loginWindow {
		i++
	}
	fs = fs[i:]
	if len(fs) == 0 {
		delete(t.fail, src)
	} else {
		t.fail[src] = fs
	}
	return fs
}

// blocked says whether src may not try a login now and, if so, how long
// until it may.
func (t *throttle) blocked(src netip.Prefix) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	fs := t.recent(src, now)
	if len(fs) < loginFailures {
		return 0, false
	}
	return fs[len(fs)-loginFailures].Add(loginWindow).Sub(now), true
}

// failed counts a failed login of src.
func (t *throttle) failed(src netip.Prefix) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if _, known := t.fail[src]; !known && len(t.fail) >= maxThrottled {
		for k := range t.fail {
			t.recent(k, now)
		}
		for k := range t.fail {
			if len(t.fail) < maxThrottled {
				break
			}
			delete(t.fail, k)
		}
	}
	fs := t.recent(src, now)
	if len(fs) >= loginFailures { // only the last loginFailures matter
		fs = fs[len(fs)-loginFailures+1:]
	}
	t.fail[src] = append(fs, now)
}
