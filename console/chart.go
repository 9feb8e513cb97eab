package console

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"proxyfleet/client"
	"proxyfleet/rotation"
)

// chartSample is the least interval between two looks at the rotation:
// changes within it are taken together (a proxy that enters and leaves
// within it counts neither way).
const chartSample = time.Second

// rotationChart follows the rotation (a rotation.Rotation on the
// console's connection, as any consumer follows it) and counts, per
// minute, the proxies that entered and left it and its size. Each look
// compares the rotation's members with the last look's: O(rotation) at
// most once per chartSample while it changes, nothing while it does not.
// Every new picture is told to the live streams (changed).
type rotationChart struct {
	rot *rotation.Rotation
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	ring    *rotationRing
	ready   bool
	members map[string]struct{}
	picture chartPicture
	changed chan struct{} // closed at the next picture
}

func newRotationChart(cl *client.Client, log *slog.Logger, now func() time.Time) (*rotationChart, error) {
	rot, err := rotation.New(cl.Conn(), rotation.Config{Subjects: cl.Subjects(), Logger: log, Now: now})
	if err != nil {
		return nil, fmt.Errorf("console: rotation: %w", err)
	}
	c := &rotationChart{rot: rot, log: log, now: now, ring: newRotationRing(now), changed: make(chan struct{})}
	c.picture = drawChart(c.ring.minutes(), false, 0)
	return c, nil
}

// run follows the rotation until ctx ends; the rotation's own goroutine
// is its.
func (c *rotationChart) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.rot.Run(ctx) }()
	err := c.watch(ctx)
	cancel()
	if rerr := <-done; err == nil && rerr != nil && ctx.Err() == nil {
		err = rerr
	}
	return err
}

func (c *rotationChart) watch(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-c.rot.Ready():
	}
	ch := c.rot.Changed() // before the look: no change after it is missed
	c.look()
	tick := time.NewTicker(chartSample)
	defer tick.Stop()
	minute := minuteOf(c.now())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
			ch = nil // looked at on the next tick
		case <-tick.C:
			if ch == nil {
				ch = c.rot.Changed()
				c.look()
				minute = minuteOf(c.now())
			} else if m := minuteOf(c.now()); !m.Equal(minute) {
				// A new minute moves the chart along.
				minute = m
				c.draw()
			}
		}
	}
}

// look compares the rotation with the last look, records the difference
// and draws the chart afresh. The first look is the baseline: its
// members are the size, not entries.
func (c *rotationChart) look() {
	ps := c.rot.Proxies()
	cur := make(map[string]struct{}, len(ps))
	for _, p := range ps {
		cur[p.ID] = struct{}{}
	}
	c.mu.Lock()
	var in, out int
	if c.ready {
		for id := range cur {
			if _, ok := c.members[id]; !ok {
				in++
			}
		}
		for id := range c.members {
			if _, ok := cur[id]; !ok {
				out++
			}
		}
	}
	c.members, c.ready = cur, true
	c.ring.record(in, out, len(cur))
	c.mu.Unlock()
	c.draw()
}

// draw makes the picture of the ring now and tells the streams.
func (c *rotationChart) draw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.picture = drawChart(c.ring.minutes(), c.ready, len(c.members))
	close(c.changed)
	c.changed = make(chan struct{})
}

// current is the picture now and a channel closed at the next one.
func (c *rotationChart) current() (chartPicture, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.picture, c.changed
}

// The chart's geometry, in SVG user units.
const (
	chartW     = 720.0
	chartLeft  = 48.0 // room for the axis' numbers
	sizeTop    = 10.0
	sizeBottom = 150.0
	barsTop    = 175.0
	barsMid    = 235.0 // entries above, exits below
	barsBottom = 295.0
	chartH     = 320.0
)

// chartPicture is the chart as the page draws it: paths of the size's
// line and of the entries' and exits' bars, the scales' top values, and
// the totals. Its JSON is the live stream's "rotation" event, which the
// page's script puts in place of the drawn one.
type chartPicture struct {
	Ready     bool   `json:"ready"`
	Size      int    `json:"size"`
	Entries   int    `json:"entries"` // over the hour
	Exits     int    `json:"exits"`
	SizePath  string `json:"size_path"`
	EntryPath string `json:"entry_path"`
	ExitPath  string `json:"exit_path"`
	SizeMax   int    `json:"size_max"`
	BarMax    int    `json:"bar_max"`
	From, To  string `json:"-"` // the first and last minute (HH:MM UTC)
}

// drawChart draws the minutes (oldest first): the size as a line over
// the minutes whose size is known, each minute's entries as a bar up
// from the middle of the lower band and its exits as one down.
func drawChart(ms []minuteCount, ready bool, size int) chartPicture {
	p := chartPicture{Ready: ready, Size: size}
	for _, m := range ms {
		p.Entries += m.Entries
		p.Exits += m.Exits
		if m.Known {
			p.SizeMax = max(p.SizeMax, m.Size)
		}
		p.BarMax = max(p.BarMax, m.Entries, m.Exits)
	}
	if len(ms) > 0 {
		p.From, p.To = ms[0].Minute.Format("15:04"), ms[len(ms)-1].Minute.Format("15:04")
	}
	sizeMax, barMax := niceCeil(p.SizeMax), niceCeil(p.BarMax)
	p.SizeMax, p.BarMax = sizeMax, barMax
	step := (chartW - chartLeft) / float64(max(len(ms), 1))
	var line, up, down strings.Builder
	pen := false
	for i, m := range ms {
		x := chartLeft + float64(i)*step
		if m.Known {
			y := sizeBottom - float64(m.Size)/float64(sizeMax)*(sizeBottom-sizeTop)
			cmd := "L"
			if !pen {
				cmd, pen = "M", true
			}
			// A step: the size holds through its minute.
			fmt.Fprintf(&line, "%s%s %s H%s ", cmd, fmtNum(x), fmtNum(y), fmtNum(x+step))
		}
		w := step * 0.7
		if m.Entries > 0 {
			h := float64(m.Entries) / float64(barMax) * (barsMid - barsTop)
			fmt.Fprintf(&up, "M%s %sh%sv%sh%sZ ", fmtNum(x+step*0.15), fmtNum(barsMid), fmtNum(w), fmtNum(-h), fmtNum(-w))
		}
		if m.Exits > 0 {
			h := float64(m.Exits) / float64(barMax) * (barsBottom - barsMid)
			fmt.Fprintf(&down, "M%s %sh%sv%sh%sZ ", fmtNum(x+step*0.15), fmtNum(barsMid), fmtNum(w), fmtNum(h), fmtNum(-w))
		}
	}
	p.SizePath = strings.TrimSpace(line.String())
	p.EntryPath = strings.TrimSpace(up.String())
	p.ExitPath = strings.TrimSpace(down.String())
	return p
}

// fmtNum is a coordinate as the paths have it: one decimal.
func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// niceCeil is the least of 1, 2 and 5 times a power of ten that is at
// least n (and at least 1): the top of a scale.
func niceCeil(n int) int {
	for p := 1; ; p *= 10 {
		for _, f := range []int{1, 2, 5} {
			if f*p >= n {
				return f * p
			}
		}
	}
}
