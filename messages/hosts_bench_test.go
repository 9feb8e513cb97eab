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
