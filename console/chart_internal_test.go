package console

import (
	"strings"
	"testing"
	"time"
)

func TestDrawChart(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 9, 1, 0, 0, time.UTC)
	ms := make([]minuteCount, chartMinutes)
	for i := range ms {
		ms[i] = minuteCount{Minute: t0.Add(time.Duration(i) * time.Minute)}
	}
	// Known from minute 57: 300, then 3 in and 1 out, then 302.
	ms[57] = minuteCount{Minute: ms[57].Minute, Size: 300, Known: true}
	ms[58] = minuteCount{Minute: ms[58].Minute, Entries: 3, Exits: 1, Size: 302, Known: true}
	ms[59] = minuteCount{Minute: ms[59].Minute, Size: 302, Known: true}
	p := drawChart(ms, true, 302)
	if p.Size != 302 || p.Entries != 3 || p.Exits != 1 || p.SizeMax != 500 || p.BarMax != 5 {
		t.Fatalf("picture: %+v", p)
	}
	if p.From != "09:01" || p.To != "10:00" {
		t.Errorf("from %s to %s", p.From, p.To)
	}
	// The line starts at minute 57 (nothing is drawn before the first
	// known size) and steps through three minutes.
	if strings.Count(p.SizePath, "M") != 1 || strings.Count(p.SizePath, "H") != 3 {
		t.Errorf("size path %q", p.SizePath)
	}
	x57 := chartLeft + 57*(chartW-chartLeft)/chartMinutes
	if !strings.HasPrefix(p.SizePath, "M"+fmtNum(x57)+" ") {
		t.Errorf("size path %q does not start at minute 57 (x %s)", p.SizePath, fmtNum(x57))
	}
	if strings.Count(p.EntryPath, "Z") != 1 || strings.Count(p.ExitPath, "Z") != 1 {
		t.Errorf("bars: entries %q, exits %q", p.EntryPath, p.ExitPath)
	}
	// An empty hour draws nothing.
	for i := range ms {
		ms[i] = minuteCount{Minute: ms[i].Minute}
	}
	if e := drawChart(ms, false, 0); e.SizePath != "" || e.EntryPath != "" || e.ExitPath != "" || e.SizeMax != 1 {
		t.Errorf("an empty hour: %+v", e)
	}
}

func TestNiceCeil(t *testing.T) {
	for n, want := range map[int]int{0: 1, 1: 1, 2: 2, 3: 5, 7: 10, 10: 10, 11: 20, 300: 500, 50000: 50000, 50001: 100000} {
		if got := niceCeil(n); got != want {
			t.Errorf("niceCeil(%d) = %d, want %d", n, got, want)
		}
	}
}

// Every page's template parses: they are parsed on the first page
// rendered, not at init, so this is where a broken one shows first.
func TestEveryPageTemplateParses(t *testing.T) {
	if _, err := templates(); err != nil {
		t.Fatal(err)
	}
}
