package console

import "time"

// chartMinutes is how far back the rotation chart goes: the current
// minute and the 59 before it.
const chartMinutes = 60

// minuteCount is one minute of the rotation: the proxies that entered
// and left it in that minute, and its size at the last change seen in
// it (or carried from an earlier minute when none was).
type minuteCount struct {
	Minute         time.Time // the minute's start
	Entries, Exits int
	Size           int
	Known          bool // the size was observed in or before this minute
}

// rotationRing counts entries and exits per minute for the last
// chartMinutes minutes, by an injected clock. It holds a fixed array:
// O(1) per record, O(chartMinutes) per read, whatever the rotation's
// size. It is not safe for concurrent use (its owner locks).
type rotationRing struct {
	now   func() time.Time
	slots [chartMinutes]minuteCount
	// evicted is the newest minute with a record whose slot a later
	// minute took: its size carries into the window's first minutes when
	// no slot holds a newer one from before the window.
	evicted minuteCount
}

func newRotationRing(now func() time.Time) *rotationRing { return &rotationRing{now: now} }

// minuteOf is t's minute, in UTC.
func minuteOf(t time.Time) time.Time { return t.UTC().Truncate(time.Minute) }

// slot is the slot of minute m, emptied if it held an older minute.
func (r *rotationRing) slot(m time.Time) *minuteCount {
	i := int((m.Unix() / 60) % chartMinutes)
	s := &r.slots[i]
	if !s.Minute.Equal(m) {
		if s.Known && s.Minute.After(r.evicted.Minute) {
			r.evicted = *s
		}
		*s = minuteCount{Minute: m}
	}
	return s
}

// record adds entries and exits at now and sets the size now.
func (r *rotationRing) record(entries, exits, size int) {
	now := r.now()
	s := r.slot(minuteOf(now))
	s.Entries += entries
	s.Exits += exits
	s.Size, s.Known = size, true
}

// minutes returns the last chartMinutes minutes, oldest first, ending
// with the current one. A minute without a record has no entries or
// exits and the size of the latest minute before it that had one (Known
// false before the first record).
func (r *rotationRing) minutes() []minuteCount {
	cur := minuteOf(r.now())
	out := make([]minuteCount, chartMinutes)
	start := cur.Add(-(chartMinutes - 1) * time.Minute)
	// The size before the window: of the newest record older than it.
	base := r.evicted
	for _, s := range r.slots {
		if s.Known && s.Minute.Before(start) && s.Minute.After(base.Minute) {
			base = s
		}
	}
	size, known := base.Size, base.Known
	for k := range chartMinutes {
		m := start.Add(time.Duration(k) * time.Minute)
		s := r.slots[int((m.Unix()/60)%chartMinutes)]
		if s.Minute.Equal(m) && s.Known {
			size, known = s.Size, true
			out[k] = s
			continue
		}
		out[k] = minuteCount{Minute: m, Size: size, Known: known}
	}
	return out
}
