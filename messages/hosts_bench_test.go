package messages

import (
	"fmt"
	"testing"
	"time"
)

// A host record's assignments of a hundred proxies, decoded and encoded
// as every reservation on a host with a plan does.
func BenchmarkHostAddrsDecodeEncode(b *testing.B) {
	st := AddrState{Slots: map[string]AddrSlots{}, V4: SlotSpace{Next: 100, Freed: map[int]time.Time{7: time.Now()}}, V6: SlotSpace{Next: 100}}
	for i := range 100 {
		st.Slots[fmt.Sprintf("f%05d", i*500)] = AddrSlots{V4: i + 1, V6: i + 1}
	}
	h := EncodeAddrs(st)
	b.ReportAllocs()
	for b.Loop() {
		got, err := h.Decode()
		if err != nil {
			b.Fatal(err)
		}
		_ = EncodeAddrs(got)
	}
}

// BenchmarkHostAddrsHeld is what an executor's check of one proxy's
// slots costs on a host of a hundred proxies: Held, against Decode and a
// lookup (the Decode sub-benchmark).
func BenchmarkHostAddrsHeld(b *testing.B) {
	st := AddrState{Slots: map[string]AddrSlots{}, V4: SlotSpace{Next: 100, Freed: map[int]time.Time{7: time.Now()}}, V6: SlotSpace{Next: 100}}
	for i := range 100 {
		st.Slots[fmt.Sprintf("f%05d", i*500)] = AddrSlots{V4: i + 1, V6: i + 1}
	}
	h := EncodeAddrs(st)
	b.Run("Held", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok, err := h.Held("f25000"); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, err := h.Decode()
			if _, ok := got.Slots["f25000"]; !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}
