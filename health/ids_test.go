package health

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortedIDs: random inserts and deletes keep the same ids, in the
// same order, as a sorted slice; After walks from any id, present or not.
func TestSortedIDs(t *testing.T) {
	var s sortedIDs
	want := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		id := fmt.Sprintf("p%d", rng.IntN(3000))
		if rng.IntN(3) == 0 {
			if got := s.Delete(id); got != want[id] {
				t.Fatalf("step %d: Delete(%s) = %v, want %v", i, id, got, want[id])
			}
			delete(want, id)
		} else {
			if got := s.Insert(id); got == want[id] {
				t.Fatalf("step %d: Insert(%s) = %v with it present %v", i, id, got, want[id])
			}
			want[id] = true
		}
		if s.Len() != len(want) {
			t.Fatalf("step %d: Len %d, want %d", i, s.Len(), len(want))
		}
	}
	sorted := make([]string, 0, len(want))
	for id := range want {
		sorted = append(sorted, id)
	}
	slices.Sort(sorted)
	var all []string
	s.After("", func(id string) bool { all = append(all, id); return true })
	if !slices.Equal(all, sorted) {
		t.Fatalf("After(\"\") gives %d ids, not the %d sorted", len(all), len(sorted))
	}
	for _, from := range []string{"p1", "p1500", "p2999", "p", "q", sorted[len(sorted)/2]} {
		var got []string
		s.After(from, func(id string) bool { got = append(got, id); return len(got) < 100 })
		i, _ := slices.BinarySearch(sorted, from)
		if i < len(sorted) && sorted[i] == from {
			i++
		}
		w := sorted[i:min(len(sorted), i+100)]
		if !slices.Equal(got, w) {
			t.Fatalf("After(%s): %v, want %v", from, got, w)
		}
	}
	for _, c := range s.chunks {
		if len(c) == 0 || len(c) > 2*idChunk {
			t.Fatalf("a chunk of %d ids", len(c))
		}
	}
	for id := range want {
		s.Delete(id)
	}
	if s.Len() != 0 || len(s.chunks) != 0 {
		t.Fatalf("emptied: Len %d, %d chunks", s.Len(), len(s.chunks))
	}
}
