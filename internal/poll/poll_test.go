package poll

import (
	"testing"
	"time"
)

func TestWait(t *testing.T) {
	n := 0
	if !Wait(time.Second, func() bool { n++; return n >= 3 }) {
		t.Fatal("a condition that comes true was not seen")
	}
	start := time.Now()
	if Wait(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported true")
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Wait returned after %s, bound 50ms", d)
	}
}
