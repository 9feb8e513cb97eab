package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// figure is one measured key with its target, the figures it was computed
// from and how it was measured.
type figure struct {
	Key     string    `json:"key"`
	Section string    `json:"section"`
	Value   float64   `json:"value"`          // the median of Runs when there are several
	Unit    string    `json:"unit"`           // "ratio", "MiB", "ms", "s"
	Target  string    `json:"target"`         // ">= 0.4", "<= 48"
	Met     bool      `json:"met"`            // Value meets Target
	Runs    []float64 `json:"runs,omitempty"` // one value per run
	Ours    string    `json:"ours"`           // proxyfleet's figure, with its unit ("201 commands/s")
	Peer    string    `json:"peer,omitempty"` // the peer's figure of the same run, or the limit
	How     string    `json:"how"`            // how it was measured
	Bound   string    `json:"bound,omitempty"`
	// Measured is when its section ran: a merged report (-merge) holds
	// sections of several runs, each figure still beside its peer of the
	// same run.
	Measured time.Time `json:"measured,omitzero"`
	// Machine is the machine of a figure kept from an earlier run by
	// -merge, when it was another than this run's (sessions run on
	// machines of one kind, not always the same one); nil: the report's.
	Machine *machine `json:"machine,omitempty"`
}

// atLeast and atMost make a target.
func atLeast(v float64) string { return fmt.Sprintf(">= %g", v) }
func atMost(v float64) string  { return fmt.Sprintf("<= %g", v) }

var _ = atMost // used by the host and health sections

// check sets Met from Value and Target.
func (f *figure) check() {
	var op string
	var lim float64
	if _, err := fmt.Sscanf(f.Target, "%s %g", &op, &lim); err != nil {
		f.Met = false
		return
	}
	switch op {
	case ">=":
		f.Met = f.Value >= lim
	case "<=":
		f.Met = f.Value <= lim
	}
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	MemMiB int    `json:"mem_mib"`
	Go     string `json:"go"`
	OS     string `json:"os"`
	Kernel string `json:"kernel"`
}

func (m machine) String() string {
	return fmt.Sprintf("%s, %d cores, %d MiB, Linux %s, %s, %s", m.CPU, m.Cores, m.MemMiB, m.Kernel, m.Go, m.OS)
}

func machineInfo() machine {
	m := machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			m.MemMiB = kb / 1024
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// sectionNote is a section's paragraph for BENCHMARKS.md.
type sectionNote struct {
	Name string `json:"section"`
	Text string `json:"text"`
}

// report is the whole run, as written to bench/results.json.
type report struct {
	Written time.Time     `json:"written"`
	Machine machine       `json:"machine"`
	Runs    int           `json:"runs"`
	SimOnly bool          `json:"sim_only"`
	Figures []figure      `json:"figures"`
	Errors  []string      `json:"errors,omitempty"`
	Notes   []sectionNote `json:"notes,omitempty"`
}

// merge keeps from old, the report of an earlier run, the figures and
// notes of every section this run did not measure (ran: the sections it
// did), so `-only gateway -merge` updates one section of BENCHMARKS.md and
// leaves the others as they were measured. Each figure stays beside its
// peer of its own run; one kept from another machine carries that
// machine, and the page names it.
func (r *report) merge(old report, ran []string) {
	var figs []figure
	for _, f := range old.Figures {
		if slices.Contains(ran, f.Section) {
			continue
		}
		if f.Measured.IsZero() {
			f.Measured = old.Written
		}
		if f.Machine == nil && old.Machine != r.Machine {
			m := old.Machine
			f.Machine = &m
		}
		if f.Machine != nil && *f.Machine == r.Machine {
			f.Machine = nil
		}
		figs = append(figs, f)
	}
	r.Figures = append(figs, r.Figures...)
	var notes []sectionNote
	for _, n := range old.Notes {
		if !slices.Contains(ran, n.Name) {
			notes = append(notes, n)
		}
	}
	r.Notes = append(notes, r.Notes...)
	r.SimOnly = r.SimOnly && old.SimOnly
}

// readReport reads a report written by writeJSON.
func readReport(path string) (report, error) {
	var r report
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func (r *report) writeJSON(path string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // targets read ">= 0.4", not "\u003e= 0.4"
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func (r *report) markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `make bench` (internal/tools/bench) on %s; the same figures are in bench/results.json.\n\n", r.Written.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %s. Each figure is a ratio against a peer measured in the same run, or a limit; noisy figures are the median of %d runs (all runs are listed).\n\n", m, r.Runs)
	if when := r.sectionTimes(); len(when) > 0 {
		b.WriteString("The sections were measured in separate runs of `make bench` on this machine (`-only … -merge`), each figure beside its peer of its own run: " + strings.Join(when, "; ") + ".\n\n")
	}
	if r.SimOnly {
		b.WriteString("This run measured only the sections that need no test host (`make bench-sim`).\n\n")
	}
	b.WriteString("| key | value | target | met | proxyfleet | peer, same run | runs |\n|---|---|---|---|---|---|---|\n")
	for _, f := range r.Figures {
		met := "yes"
		if !f.Met {
			met = "**no**"
		}
		runs := make([]string, len(f.Runs))
		for i, v := range f.Runs {
			runs[i] = fmt.Sprintf("%.3g", v)
		}
		fmt.Fprintf(&b, "| `%s` | %.3g %s | %s | %s | %s | %s | %s |\n", f.Key, f.Value, f.Unit, f.Target, met, f.Ours, f.Peer, strings.Join(runs, ", "))
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "\n**Section failed:** %s\n", e)
	}
	b.WriteString("\n## How each figure is measured\n")
	for _, f := range r.Figures {
		fmt.Fprintf(&b, "\n- `%s`: %s\n", f.Key, f.How)
		if f.Bound != "" {
			fmt.Fprintf(&b, "  What bounds it: %s\n", f.Bound)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n", n.Name, strings.TrimSpace(n.Text))
	}
	return b.String()
}

// sectionTimes lists "section at time" for each section, in the order of
// the figures, when they were measured at more than one time or on
// another machine.
func (r *report) sectionTimes() []string {
	var out []string
	times := map[time.Time]bool{}
	seen := map[string]bool{}
	other := false
	for _, f := range r.Figures {
		other = other || f.Machine != nil
		at := f.Measured
		if at.IsZero() {
			at = r.Written
		}
		times[at] = true
		if !seen[f.Section] {
			seen[f.Section] = true
			s := f.Section + " " + at.Format("2006-01-02 15:04 MST")
			if f.Machine != nil {
				s += " on another machine (" + f.Machine.String() + ")"
			}
			out = append(out, s)
		}
	}
	if len(times) < 2 && !other {
		return nil
	}
	return out
}
