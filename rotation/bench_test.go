package rotation

import (
	"fmt"
	"testing"
	"time"
)

// benchRotation is a Rotation of n proxies, each with the labels region
// (one of 4) and n (its own), filled through the index as the feed does:
// a pick touches nothing else, so no server is needed to measure it.
func benchRotation(b *testing.B, n int, s Strategy) *Rotation {
	b.Helper()
	r, err := newRotation(Config{Strategy: s})
	if err != nil {
		b.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	since := time.Now()
	for i := range n {
		id := fmt.Sprintf("p%d", i)
		r.idx.put(Proxy{ID: id, Addr: fmt.Sprintf("198.18.%d.%d:3128", (i>>8)&255, i&255), Host: "h1", Since: since,
			Labels: map[string]string{"region": fmt.Sprint(i % 4), "n": fmt.Sprint(i)}}, 1)
	}
	return r
}

const benchProxies = 10_000

func BenchmarkPick(b *testing.B) {
	for _, c := range []struct {
		name string
		s    Strategy
		sel  Selector
	}{
		{"round-robin", RoundRobin, Selector{}},
		{"random", Random, Selector{}},
		{"least-busy", LeastBusy, Selector{}},
		{"round-robin/label", RoundRobin, Selector{Labels: map[string]string{"region": "2"}}},
		{"round-robin/2-labels", RoundRobin, Selector{Labels: map[string]string{"region": "2", "n": "4242"}}},
		{"round-robin/exclude-3", RoundRobin, Selector{Exclude: []string{"p1", "p2", "p3"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := benchRotation(b, benchProxies, c.s)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Pick(c.sel); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("least-busy/all-busy", func(b *testing.B) {
		// The worst case: no idle proxy, so every pick walks them all.
		r := benchRotation(b, benchProxies, LeastBusy)
		for _, m := range r.idx.all.items {
			m.inflight.Add(2)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Pick(Selector{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("round-robin/parallel", func(b *testing.B) {
		r := benchRotation(b, benchProxies, RoundRobin)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := r.Pick(Selector{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkPickSession(b *testing.B) {
	for _, c := range []struct {
		name string
		sel  Selector
	}{
		{"all", Selector{}},
		{"label", Selector{Labels: map[string]string{"region": "2"}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := benchRotation(b, benchProxies, RoundRobin)
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprintf("session-%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := r.PickSession(keys[i&1023], c.sel); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkChange is the cost of one change (a proxy in and out, with its
// labels indexed) in a rotation of 10,000: O(1), not O(fleet).
func BenchmarkChange(b *testing.B) {
	r := benchRotation(b, benchProxies, RoundRobin)
	since := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		r.mu.Lock()
		r.idx.put(Proxy{ID: "p0", Addr: "198.18.9.9:3128", Since: since, Labels: map[string]string{"region": "1"}}, 1)
		r.idx.del("p0")
		r.mu.Unlock()
	}
}
