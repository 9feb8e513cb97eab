package bans

import (
	"net/netip"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestSetBannedPerSite(t *testing.T) {
	s := NewSet(0)
	a := netip.MustParseAddr("203.0.113.7")
	b := netip.MustParseAddr("2001:db8::1")
	s.Add(a, "shop.example", t0.Add(time.Minute), t0)
	if !s.Banned(a, "shop.example", t0) {
		t.Error("a not banned for shop.example")
	}
	if s.Banned(a, "other.example", t0) {
		t.Error("a banned for another site: bans are per site")
	}
	if s.Banned(b, "shop.example", t0) {
		t.Error("b banned without a ban")
	}
	if !s.Banned(netip.MustParseAddr("::ffff:203.0.113.7"), "shop.example", t0) {
		t.Error("the mapped form of a is not banned")
	}
	if s.Banned(a, "shop.example", t0.Add(time.Minute)) {
		t.Error("banned at its end")
	}
	// The last ban stored wins, shorter or not.
	s.Add(a, "shop.example", t0.Add(10*time.Second), t0)
	if s.Banned(a, "shop.example", t0.Add(20*time.Second)) {
		t.Error("the shortened ban still holds")
	}
	s.Remove(a, "shop.example")
	if s.Banned(a, "shop.example", t0) || s.Len() != 0 {
		t.Errorf("removed ban holds, %d held", s.Len())
	}
}

func TestSetExpire(t *testing.T) {
	s := NewSet(0)
	for i := range 10 {
		a := netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})
		s.Add(a, "shop.example", t0.Add(time.Duration(i+1)*time.Second), t0)
	}
	// A replaced end leaves a stale entry in the queue: it must not drop
	// the ban's new end.
	s.Add(netip.AddrFrom4([4]byte{203, 0, 113, 0}), "shop.example", t0.Add(time.Hour), t0)
	if n := s.Expire(t0.Add(5 * time.Second)); n != 4 {
		t.Errorf("Expire at 5s dropped %d, want 4 (2s to 5s; the one at 1s was extended)", n)
	}
	if s.Len() != 6 || s.Active(t0.Add(5*time.Second)) != 6 {
		t.Errorf("held %d, active %d; want 6 and 6", s.Len(), s.Active(t0.Add(5*time.Second)))
	}
	if !s.Banned(netip.AddrFrom4([4]byte{203, 0, 113, 0}), "shop.example", t0.Add(30*time.Minute)) {
		t.Error("the extended ban was expired at its old end")
	}
	if s.Add(netip.AddrFrom4([4]byte{203, 0, 113, 9}), "shop.example", t0, t0) != 0 || s.Banned(netip.AddrFrom4([4]byte{203, 0, 113, 9}), "shop.example", t0) {
		t.Error("a ban over at once is held")
	}
}

func TestSetBounded(t *testing.T) {
	s := NewSet(3)
	site := "shop.example"
	for i := range 3 {
		s.Add(netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), site, t0.Add(time.Duration(10-i)*time.Minute), t0)
	}
	// Full: the ban ending first (198.18.0.2, at 8m) makes room.
	if n := s.Add(netip.AddrFrom4([4]byte{198, 18, 0, 9}), site, t0.Add(time.Hour), t0); n != 1 {
		t.Errorf("evicted %d, want 1", n)
	}
	if s.Len() != 3 || s.Banned(netip.AddrFrom4([4]byte{198, 18, 0, 2}), site, t0) || !s.Banned(netip.AddrFrom4([4]byte{198, 18, 0, 0}), site, t0) {
		t.Errorf("wrong ban evicted (held %d)", s.Len())
	}
	// Churn keeps the queue bounded by the bans held.
	for i := range 10_000 {
		s.Add(netip.AddrFrom4([4]byte{198, 18, 0, 0}), site, t0.Add(time.Duration(i+1)*time.Second), t0)
	}
	if len(s.q) > 2*s.Len()+64 {
		t.Errorf("queue of %d for %d bans", len(s.q), s.Len())
	}
}

func BenchmarkSetBanned(b *testing.B) {
	s := NewSet(0)
	for i := range 100_000 {
		s.Add(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), "shop.example", t0.Add(time.Hour), t0)
	}
	a := netip.AddrFrom4([4]byte{10, 0, 1, 2})
	b.ReportAllocs()
	for b.Loop() {
		if !s.Banned(a, "shop.example", t0) {
			b.Fatal("not banned")
		}
	}
}
