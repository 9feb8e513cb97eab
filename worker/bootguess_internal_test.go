package worker

import (
	"testing"
	"time"
)

func TestBootGuessPlacesTheFirstRead(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	floor, ceil := 100*time.Millisecond, 2*time.Second
	var b bootGuess
	if got := b.firstRead(now, now, floor, ceil); got != floor {
		t.Errorf("without a boot seen: %s, want the floor %s", got, floor)
	}
	b.observe(400 * time.Millisecond)
	if got := b.firstRead(now, now, floor, ceil); got != 300*time.Millisecond {
		t.Errorf("after a boot of 400ms: %s, want 300ms", got)
	}
	if got := b.firstRead(now.Add(-250*time.Millisecond), now, floor, ceil); got != floor {
		t.Errorf("a create begun 250ms ago: %s, want the floor %s", got, floor)
	}
	if got := b.firstRead(time.Time{}, now, floor, ceil); got != floor {
		t.Errorf("no create: %s, want the floor %s", got, floor)
	}
	b.observe(10 * time.Minute) // a first boot that waited for an image transfer
	if got := b.firstRead(now, now, floor, ceil); got != ceil {
		t.Errorf("after a boot of 10m: %s, want the longest pause %s", got, ceil)
	}
	var c bootGuess
	c.observe(time.Second)
	for range 40 {
		c.observe(200 * time.Millisecond)
	}
	if got := c.firstRead(now, now, floor, ceil); got < 140*time.Millisecond || got > 160*time.Millisecond {
		t.Errorf("after many boots of 200ms: %s, want about 150ms", got)
	}
}
