package main

import (
	"context"
	"fmt"
	"os/exec"
)

// consoleBenchtime is the requests of each kind BenchmarkConsole50k
// times, after its fleet is seeded and the console's view has read it.
const consoleBenchtime = "5x"

// runConsole runs BenchmarkConsole50k (package console): the proxies
// page at 50,000 proxies, its first page and a filter by host, each held
// to a second.
func runConsole(ctx context.Context, _ *bench) (sectionResult, error) {
	const pattern = "^BenchmarkConsole50k$"
	out, err := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", consoleBenchtime, "-timeout", "15m", "./console/").CombinedOutput()
	if err != nil {
		return sectionResult{}, fmt.Errorf("go test -bench %s ./console/: %w\n%s", pattern, err, out)
	}
	got := parseBenchMetrics(out)["Console50k"]
	var res sectionResult
	for _, f := range []struct{ key, metric, what string }{
		{"console_50k_first_view_s", "first-view-s", "the proxies page's first page (100 rows, no filter)"},
		{"console_50k_filter_host_s", "filter-host-s", "the proxies page filtered by one host (100 of 50,000)"},
	} {
		v, ok := got[f.metric]
		if !ok {
			return res, fmt.Errorf("BenchmarkConsole50k reported no %s:\n%s", f.metric, out)
		}
		res.figures = append(res.figures, figure{
			Key: f.key, Value: v, Unit: "s", Target: atMost(1), Runs: []float64{v},
			Ours: fmt.Sprintf("%.3g s", v),
			Peer: "bound 1 s (the console's issue: 50,000 proxies stay fast)",
			How: fmt.Sprintf("BenchmarkConsole50k (console), %s requests over HTTP by a logged-in user, the mean: %s, "+
				"with 50,000 proxies over 500 hosts in 10 pools (desired records, running events, checks) on an embedded nats-server, "+
				"once the console's view has read them.", consoleBenchtime, f.what),
		})
	}
	res.notes = "The console: the proxies page at fleet_50k's size, served from the console's in-memory view of the proxies " +
		"(docs/CONSOLE.md), each request timed whole (HTTP, session, render) from a Go benchmark that `go test -bench` runs."
	return res, nil
}
