// Command bench measures proxyfleet beside its peers in one run and writes
// the figures, each with the peer figure of the same run, to BENCHMARKS.md
// and bench/results.json.
//
// Every figure is a ratio against a peer or a limit measured in the same
// run, since absolute times on small shared machines are noisy. Sections
// that need the test host (VM lifecycle, uploads) read its TESTHOST_*
// variables (source .testhost/env); -sim runs only the sections that need
// none. Each section lives in its own file and returns figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// section is one group of figures measured together.
type section struct {
	name string
	// host: the section needs the test host (TESTHOST_* variables).
	host bool
	run  func(ctx context.Context, b *bench) (sectionResult, error)
}

// sectionResult is what a section measured: its figures and, optionally, a
// markdown paragraph for BENCHMARKS.md (how it was set up, what bounds it).
type sectionResult struct {
	figures []figure
	notes   string
}

// sections in the order they run. The sim sections go first: they need no
// guests, and a failure there is cheap.
var sections = []section{
	{name: "budgets", run: runBudgets},
	{name: "control-plane", run: runControlPlane},
	{name: "egress", run: runEgress},
	{name: "fleet", run: runFleet},
	{name: "fleet50k", run: runFleet50k},
	{name: "health", run: runHealth},
	{name: "gateway", run: runGateway},
	{name: "gateway-rules", run: runGatewayRules},
	{name: "console", run: runConsole},
	{name: "upload", host: true, run: runUpload},
	{name: "lifecycle", host: true, run: runLifecycle},
}

// bench carries what every section shares.
type bench struct {
	runs int    // repetitions of each noisy figure; the median is reported
	n    int    // commands per control-plane measurement
	dir  string // scratch directory, removed at the end
	log  *log.Logger

	fleet50k fleet50kOpts
}

func main() {
	out := flag.String("out", "", "write the figures as markdown to this file (BENCHMARKS.md)")
	jsonOut := flag.String("json", "", "write the figures as JSON to this file (bench/results.json)")
	simOnly := flag.Bool("sim", false, "run only the sections that need no test host")
	only := flag.String("only", "", "comma-separated section names to run (default all)")
	merge := flag.Bool("merge", false, "keep the figures of the sections not run from the -json file of an earlier run (same machine) and write them with this run's")
	runs := flag.Int("runs", 3, "repetitions of each figure; the median is reported")
	n := flag.Int("n", 2000, "commands (and raw publishes) per control-plane measurement")
	var f50 fleet50kOpts
	sizes := flag.String("fleet-sizes", "2000,12000,50000", "fleet50k: the fleet sizes to run, one run each (the largest -fleet-runs times)")
	flag.IntVar(&f50.hosts, "fleet-hosts", 500, "fleet50k: sim hosts")
	flag.BoolVar(&f50.noPlans, "fleet-no-plans", false, "fleet50k: give the hosts no address plan (the network's DHCP), to compare")
	flag.BoolVar(&f50.peer, "fleet-peer", true, "fleet50k: run the largest size once more without address plans, the peer figure of the same run")
	flag.IntVar(&f50.workers, "fleet-workers", 10, "fleet50k: worker processes")
	flag.IntVar(&f50.healths, "fleet-healths", 2, "fleet50k: health processes")
	flag.DurationVar(&f50.deadline, "fleet-deadline", 10*time.Minute, "fleet50k: a size fails if its fleet is not all in the rotation within this")
	flag.DurationVar(&f50.settle, "fleet-settle", 10*time.Second, "fleet50k: how long after the last proxy entered the burst counts as settled")
	flag.DurationVar(&f50.quiet, "fleet-quiet", 30*time.Second, "fleet50k: how long after it settled the logs are watched for warnings")
	flag.BoolVar(&f50.syncAlways, "fleet-sync-always", false, "fleet50k: run the server with sync_always (as nats.conf for a single node)")
	flag.StringVar(&f50.profileDir, "fleet-profile", "", "fleet50k: write the workers' profiles and every role's log here (CPU of w01 during the burst, every heap after); workers run with --pprof")
	flag.DurationVar(&f50.profileFor, "fleet-profile-for", 20*time.Second, "fleet50k: how long the CPU profile lasts")
	flag.IntVar(&f50.maxProcs, "fleet-gomaxprocs", 0, "fleet50k: GOMAXPROCS of each worker and health process; 0: its share of the cores (at least 1), -1: Go's default")
	flag.IntVar(&f50.runs, "fleet-runs", 3, "fleet50k: runs of the largest size; its figures are those of the median run by time into the rotation")
	flag.DurationVar(&f50.hold, "fleet-hold", 0, "fleet50k: keep each size's fleet up this long after it was measured (its config is logged), to look at it by hand")
	flag.Parse()
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench: ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "proxyfleet-bench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	b := &bench{runs: max(*runs, 1), n: *n, dir: dir, log: log.Default(), fleet50k: f50}
	if b.fleet50k.sizes, err = parseSizes(*sizes); err != nil {
		log.Fatal(err)
	}
	if f50.workers < 1 || f50.healths < 1 || f50.hosts < 1 {
		log.Fatal("-fleet-workers, -fleet-healths and -fleet-hosts must be at least 1")
	}

	var want []string
	if *only != "" {
		want = strings.Split(*only, ",")
	}
	rep := report{Written: time.Now().UTC(), Machine: machineInfo(), Runs: b.runs, SimOnly: *simOnly}
	var old *report
	if *merge {
		if *jsonOut == "" {
			log.Fatal("-merge needs -json: the earlier run's figures are read from it")
		}
		r, err := readReport(*jsonOut)
		if err != nil {
			log.Fatalf("-merge: %v", err)
		}
		old = &r
	}
	var ran []string
	failed := false
	for _, s := range sections {
		if (*simOnly && s.host) || (want != nil && !slices.Contains(want, s.name)) {
			continue
		}
		if s.host && os.Getenv("TESTHOST_SSH_ADDR") == "" {
			log.Fatalf("section %s needs the test host: run `make testhost` and `source .testhost/env`, or pass -sim", s.name)
		}
		start := time.Now()
		ran = append(ran, s.name)
		log.Printf("section %s: start", s.name)
		res, err := s.run(ctx, b)
		if err != nil {
			// One broken section must not hide the others' figures; it
			// is written as an error and fails the run at the end.
			log.Printf("section %s: %v", s.name, err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", s.name, err))
			failed = true
		}
		for _, f := range res.figures {
			f.Section = s.name
			f.Measured = rep.Written
			f.check()
			log.Printf("section %s: %s = %.3g (target %s, met %v)", s.name, f.Key, f.Value, f.Target, f.Met)
			rep.Figures = append(rep.Figures, f)
		}
		if res.notes != "" {
			rep.Notes = append(rep.Notes, sectionNote{Name: s.name, Text: res.notes})
		}
		log.Printf("section %s: done in %s", s.name, time.Since(start).Round(time.Second))
		if ctx.Err() != nil {
			break
		}
	}
	if old != nil {
		rep.merge(*old, ran)
	}
	md := rep.markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if *jsonOut != "" {
		if err := rep.writeJSON(*jsonOut); err != nil {
			log.Fatal(err)
		}
	}
	if failed || ctx.Err() != nil {
		os.Exit(1)
	}
}
