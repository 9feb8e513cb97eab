package main

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// callStats is the worker's libvirt call histogram, summed by procedure.
type callStats map[string]struct {
	n   float64
	sum float64
}

// scrapeCalls reads proxyfleet_libvirt_call_duration_seconds from the
// worker's /metrics.
func scrapeCalls(addr string) (callStats, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := callStats{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		var count bool
		switch {
		case strings.HasPrefix(l, "proxyfleet_libvirt_call_duration_seconds_sum{"):
		case strings.HasPrefix(l, "proxyfleet_libvirt_call_duration_seconds_count{"):
			count = true
		default:
			continue
		}
		_, rest, _ := strings.Cut(l, `procedure="`)
		proc, rest, _ := strings.Cut(rest, `"`)
		i := strings.LastIndexByte(rest, ' ')
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if err != nil {
			continue
		}
		s := out[proc]
		if count {
			s.n += v
		} else {
			s.sum += v
		}
		out[proc] = s
	}
	return out, sc.Err()
}

// since is what happened between two scrapes, as one line: the calls by
// procedure, most time first.
func (a callStats) since(b callStats) string {
	type row struct {
		proc   string
		n, sum float64
	}
	var rows []row
	var total float64
	for p, s := range a {
		d := row{p, s.n - b[p].n, s.sum - b[p].sum}
		if d.n > 0 {
			rows = append(rows, d)
			total += d.sum
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return int(y.sum*1e6 - x.sum*1e6) })
	parts := make([]string, len(rows))
	for i, r := range rows {
		parts[i] = fmt.Sprintf("%s %.0f× %.0f ms", r.proc, r.n, 1000*r.sum/r.n)
	}
	return fmt.Sprintf("libvirt calls %.1f s in all: %s", total, strings.Join(parts, ", "))
}
