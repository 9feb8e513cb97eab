package console

import (
	"net/http"
	"testing"
	"time"
)

// The throttle counts an IPv4 source by its address and an IPv6 source
// by its /64, blocks the sixth try within a minute for as long as the
// fifth-last failure stays in the window, and forgets failures older
// than the window.
func TestThrottleSources(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	th := newThrottle(func() time.Time { return now })
	src := func(remote string) string {
		p, ok := sourceOf(&http.Request{RemoteAddr: remote})
		if !ok {
			t.Fatalf("no source of %q", remote)
		}
		return p.String()
	}
	for remote, want := range map[string]string{
		"198.18.0.7:4000":           "198.18.0.7/32",
		"[2001:db8:1:2:aa::1]:4000": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::9]:1":  "2001:db8:1:2::/64",
		"[::ffff:198.18.0.7]:4000":  "198.18.0.7/32",
		"[fe80::1%eth0]:4000":       "fe80::/64",
	} {
		if got := src(remote); got != want {
			t.Errorf("source of %s: %s, want %s", remote, got, want)
		}
	}
	if _, ok := sourceOf(&http.Request{RemoteAddr: "pipe"}); ok {
		t.Error("a RemoteAddr that is no address is counted")
	}

	a, _ := sourceOf(&http.Request{RemoteAddr: "[2001:db8:1:2::1]:1"})
	same, _ := sourceOf(&http.Request{RemoteAddr: "[2001:db8:1:2::ffff]:1"})
	other, _ := sourceOf(&http.Request{RemoteAddr: "[2001:db8:1:3::1]:1"})
	for i := range loginFailures {
		if _, no := th.blocked(a); no {
			t.Fatalf("blocked after %d failures", i)
		}
		th.failed(a)
		now = now.Add(time.Second)
	}
	wait, no := th.blocked(same)
	if !no || wait != loginWindow-loginFailures*time.Second {
		t.Fatalf("the same /64 after %d failures: blocked %v for %s", loginFailures, no, wait)
	}
	if _, no := th.blocked(other); no {
		t.Fatal("another /64 is blocked")
	}
	now = now.Add(wait)
	if _, no := th.blocked(a); no {
		t.Fatal("still blocked once the first failure left the window")
	}
	th.failed(a) // the fifth within the window again
	if _, no := th.blocked(a); !no {
		t.Fatal("not blocked with five failures in the window")
	}
}
