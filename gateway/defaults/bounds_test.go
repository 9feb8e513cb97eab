package defaults

import (
	"os"
	"strings"
	"testing"
	"time"
)

// docs/GATEWAY.md's table of limits is Bounds: a row per bound, its
// default and range as Format writes them, in order, and no other row.
func TestBoundsAreDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/GATEWAY.md")
	if err != nil {
		t.Fatal(err)
	}
	const head = "| setting | default | least | greatest | notes |\n| --- | --- | --- | --- | --- |\n"
	_, table, ok := strings.Cut(string(b), head)
	if !ok {
		t.Fatalf("docs/GATEWAY.md has no table of limits (%q)", head)
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := strings.Split(table, "\n")
	for i, bd := range Bounds {
		want := "| `" + strings.TrimPrefix(bd.Path, "gateway.") + "` | " + bd.Format(bd.Default) + " | " + bd.Format(bd.Min) + " | " + bd.Format(bd.Max) + " |"
		if i >= len(rows) || !strings.HasPrefix(rows[i], want) {
			t.Errorf("row %d: want it to start %q", i, want)
		}
	}
	if len(rows) != len(Bounds) {
		t.Errorf("%d rows for %d bounds", len(rows), len(Bounds))
	}
}

func TestBound(t *testing.T) {
	d := Bound{Path: "gateway.x_timeout", Kind: Duration, Default: int64(time.Second), Min: int64(time.Millisecond), Max: int64(time.Hour)}
	if d.Fill(0) != d.Default || d.Fill(-1) != -1 || d.Check(-1) == nil || d.Check(d.Max) != nil || d.Check(d.Max+1) == nil {
		t.Errorf("duration bound: fill 0 %d, fill -1 %d, check -1 %v, max %v, max+1 %v", d.Fill(0), d.Fill(-1), d.Check(-1), d.Check(d.Max), d.Check(d.Max+1))
	}
	if err := d.Check(int64(2 * time.Hour)); err == nil || err.Error() != "2h is out of range [1ms, 1h]" {
		t.Errorf("check 2h: %v", err)
	}
	o := Bound{Path: "gateway.xs", Default: 2, Min: 0, Max: 10, Off: true}
	if o.Fill(0) != 2 || o.Fill(-1) != 0 || o.Fill(3) != 3 {
		t.Errorf("off bound: fill 0 %d, -1 %d, 3 %d", o.Fill(0), o.Fill(-1), o.Fill(3))
	}
	u := Bound{Path: "gateway.users[].x"}
	if u.At(2) != "gateway.users[2].x" {
		t.Errorf("At(2): %s", u.At(2))
	}
	for _, c := range []struct {
		fb, resp time.Duration
		ok       bool
	}{
		{3 * time.Second, 30 * time.Second, true},
		{MinFirstByteTimeout - 1, 30 * time.Second, false},
		{31 * time.Second, 30 * time.Second, false},
		{300 * time.Millisecond, 300 * time.Millisecond, true},
		{200 * time.Millisecond, 300 * time.Millisecond, false},
	} {
		if err := CheckFirstByte(c.fb, c.resp); (err == nil) != c.ok {
			t.Errorf("first byte %s, response %s: %v", c.fb, c.resp, err)
		}
	}
	if FirstByteDefault(time.Second) != time.Second || FirstByteDefault(time.Minute) != FirstByteTimeout {
		t.Error("FirstByteDefault")
	}
}
