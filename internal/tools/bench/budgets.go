package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// budget is one figure a Go benchmark reports with b.ReportMetric,
// requests (or reads) per operation, and the most it may be.
type budget struct {
	key       string  // the figure's key
	bench     string  // the benchmark's name, without "Benchmark"
	pkg       string  // its package
	metric    string  // the unit it reports the figure in
	max       float64 // the budget
	what, why string  // what is counted and how; what the budget stands for
}

// budgets are request counts of the worker's hot paths: performance
// budgets, held here, not asserted by tests. Requests are counted by a
// subscriber on their JetStream API subject.
var budgets = []budget{
	{"observe_event_reads", "ObservationPassRequests", "./worker/", "event-reads/op", 0,
		"single reads of last events in an observation pass over 10 unchanged proxies", "none: a pass reads them batched"},
	{"observe_event_batches", "ObservationPassRequests", "./worker/", "event-batches/op", 1.1,
		"batched reads of last events a pass over 10 unchanged proxies", "one a pass (the slack is a pass under way when the count began)"},
	{"observe_desired_reads", "ObservationPassRequests", "./worker/", "desired-reads/op", 0,
		"single reads of desired records a pass over 10 unchanged proxies", "none: the orphan sweep reads them batched"},
	{"observe_desired_batches", "ObservationPassRequests", "./worker/", "desired-batches/op", 1.1,
		"batched reads of desired records a pass over 10 unchanged proxies", "one a pass"},
	{"observe_events_other_hosts", "ObservationPassOtherHosts", "./worker/", "events-read/op", 2,
		"last events a pass of a host running 2 proxies reads, with 300 running on another host (the worker's own count, observe_events_read)", "its own host's 2: a pass's cost does not grow with the event stream"},
	{"last_events_batches", "LastEventsRequests", "./worker/", "batches/op", 3,
		"batched direct gets of one read of the last events of 2×256+17 ids", "one per 256 subjects (jsapi.MaxBatch)"},
	{"last_events_single_reads", "LastEventsRequests", "./worker/", "single-reads/op", 0,
		"single direct gets of that read", "none"},
	{"unpin_lookups", "UnpinLookups", "./worker/", "lookups/op", 1,
		"stream lookups of a stop that unpins 5 hosts of one stream", "one, shared by the unpins"},
	{"placement_record_reads", "PlacementRecordReads", "./worker/", "record-reads/op", 2,
		"host records read to place one create with 45 of 50 hosts full in the view", "at most 2: none of the full hosts'"},
}

// budgetBenchtime is the operations of each benchmark: the observation
// passes run every 20ms, so 50 passes take a second.
const budgetBenchtime = "50x"

// runBudgets runs the benchmarks of the budgets, once each package, and
// holds each figure to its budget.
func runBudgets(ctx context.Context, b *bench) (sectionResult, error) {
	byPkg := map[string][]string{}
	var pkgs []string
	for _, bg := range budgets {
		if _, ok := byPkg[bg.pkg]; !ok {
			pkgs = append(pkgs, bg.pkg)
		}
		if !slices.Contains(byPkg[bg.pkg], bg.bench) {
			byPkg[bg.pkg] = append(byPkg[bg.pkg], bg.bench)
		}
	}
	got := map[string]map[string]float64{} // benchmark → unit → value
	for _, pkg := range pkgs {
		pattern := "^Benchmark(" + strings.Join(byPkg[pkg], "|") + ")$"
		out, err := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchtime", budgetBenchtime, pkg).CombinedOutput()
		if err != nil {
			return sectionResult{}, fmt.Errorf("go test -bench %s %s: %w\n%s", pattern, pkg, err, out)
		}
		for name, m := range parseBenchMetrics(out) {
			got[name] = m
		}
	}
	var res sectionResult
	for _, bg := range budgets {
		v, ok := got[bg.bench][bg.metric]
		if !ok {
			return res, fmt.Errorf("benchmark %s reported no %s", bg.bench, bg.metric)
		}
		res.figures = append(res.figures, figure{
			Key: bg.key, Value: v, Unit: bg.metric, Target: atMost(bg.max), Runs: []float64{v},
			Ours: fmt.Sprintf("%.3g %s", v, bg.metric),
			Peer: fmt.Sprintf("budget %g: %s", bg.max, bg.why),
			How: fmt.Sprintf("Benchmark%s (%s), %s operations on an embedded nats-server: %s.",
				bg.bench, strings.Trim(bg.pkg, "./"), budgetBenchtime, bg.what),
		})
	}
	res.notes = "Request budgets: what the worker's hot paths cost in NATS requests per operation, from Go benchmarks (`b.ReportMetric`) " +
		"that `go test -bench` runs; each figure is held to its budget, the tests asserting only behaviour."
	return res, nil
}

// parseBenchMetrics reads `go test -bench` output: for each benchmark (its
// name without "Benchmark" and the -N suffix), its metrics by unit.
func parseBenchMetrics(out []byte) map[string]map[string]float64 {
	got := map[string]map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i]
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m[f[i+1]] = v
			}
		}
		got[name] = m
	}
	return got
}
