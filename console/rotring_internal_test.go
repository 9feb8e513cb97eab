package console

import (
	"testing"
	"time"
)

// fakeClock is the ring's injected clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestRotationRingCountsByMinute(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 12, 7, 10, 0, 30, 0, time.UTC)}
	r := newRotationRing(clk.now)
	if ms := r.minutes(); len(ms) != chartMinutes || ms[0].Known || ms[chartMinutes-1].Known {
		t.Fatalf("empty ring: %d minutes, first %+v last %+v", len(ms), ms[0], ms[chartMinutes-1])
	}
	r.record(0, 0, 300) // the first read: the size, no entries
	clk.t = clk.t.Add(20 * time.Second)
	r.record(2, 0, 302)
	clk.t = clk.t.Add(time.Minute) // 10:01:50
	r.record(0, 1, 301)
	clk.t = clk.t.Add(3 * time.Minute) // 10:04:50, nothing since 10:01
	ms := r.minutes()
	last := ms[chartMinutes-1]
	if !last.Minute.Equal(time.Date(2026, 12, 7, 10, 4, 0, 0, time.UTC)) {
		t.Fatalf("the last minute is %v", last.Minute)
	}
	want := map[int]minuteCount{ // by minute past 10:00
		0: {Entries: 2, Size: 302, Known: true},
		1: {Exits: 1, Size: 301, Known: true},
		2: {Size: 301, Known: true},
		4: {Size: 301, Known: true},
	}
	for k, w := range want {
		got := ms[chartMinutes-5+k]
		w.Minute = time.Date(2026, 12, 7, 10, k, 0, 0, time.UTC)
		if got != w {
			t.Errorf("minute %d: %+v, want %+v", k, got, w)
		}
	}
	if before := ms[chartMinutes-6]; before.Known || before.Entries != 0 {
		t.Errorf("the minute before the first record: %+v", before)
	}
}

// A record older than the window still gives the size of the minutes
// before the window's first record, even after its slot was taken by a
// later minute.
func TestRotationRingCarriesTheSizeIntoTheWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	clk := &fakeClock{t: t0}
	r := newRotationRing(clk.now)
	r.record(5, 0, 50)
	clk.t = t0.Add(90 * time.Minute)
	ms := r.minutes()
	for _, m := range ms {
		if !m.Known || m.Size != 50 || m.Entries != 0 {
			t.Fatalf("90 minutes after the only record: %+v", m)
		}
	}
	// 10:00's slot is 11:00's: a record at 11:00 takes it; the minutes
	// of the window before 11:00 (10:01 to 10:59 at 11:00:30) carry 50.
	clk.t = t0.Add(60*time.Minute + 30*time.Second)
	r.record(0, 10, 40)
	ms = r.minutes()
	if first := ms[0]; !first.Known || first.Size != 50 || !first.Minute.Equal(t0.Add(time.Minute)) {
		t.Fatalf("the window's first minute: %+v", first)
	}
	if last := ms[chartMinutes-1]; last.Size != 40 || last.Exits != 10 {
		t.Fatalf("the current minute: %+v", last)
	}
	// An hour on, the 11:00 record left the window; its size stays.
	clk.t = t0.Add(3 * time.Hour)
	for _, m := range r.minutes() {
		if m.Size != 40 || m.Exits != 0 || !m.Known {
			t.Fatalf("long after: %+v", m)
		}
	}
}
