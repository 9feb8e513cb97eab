package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A merged report keeps the sections it did not run from the earlier
// one, with their notes and their own time, and says on the page that the
// sections were measured apart; it refuses a report of another machine.
func TestMergeKeepsTheSectionsNotRun(t *testing.T) {
	m := machine{CPU: "cpu", Cores: 2, MemMiB: 1024, Go: "go", OS: "linux/amd64", Kernel: "k"}
	then := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	old := report{Written: then, Machine: m, Runs: 3,
		Figures: []figure{{Key: "a", Section: "fleet", Value: 1}, {Key: "g", Section: "gateway", Value: 2}},
		Notes:   []sectionNote{{Name: "fleet", Text: "fleet note"}, {Name: "gateway", Text: "old gateway note"}}}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := old.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	read, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	now := then.Add(5 * time.Hour)
	rep := report{Written: now, Machine: m, Runs: 3,
		Figures: []figure{{Key: "g", Section: "gateway", Value: 3, Measured: now}},
		Notes:   []sectionNote{{Name: "gateway", Text: "new gateway note"}}}
	rep.merge(read, []string{"gateway"})
	if len(rep.Figures) != 2 || rep.Figures[0].Key != "a" || !rep.Figures[0].Measured.Equal(then) || rep.Figures[1].Value != 3 {
		t.Fatalf("figures after merge: %+v", rep.Figures)
	}
	if len(rep.Notes) != 2 || rep.Notes[0].Text != "fleet note" || rep.Notes[1].Text != "new gateway note" {
		t.Fatalf("notes after merge: %+v", rep.Notes)
	}
	md := rep.markdown()
	for _, want := range []string{"measured in separate runs", "fleet 2026-12-01 10:00 UTC", "gateway 2026-12-01 15:00 UTC", "fleet note", "new gateway note"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "old gateway note") {
		t.Error("markdown keeps the replaced section's note")
	}

	if strings.Contains(md, "another machine") {
		t.Error("the page says a figure of this machine was measured on another")
	}

	// A figure kept from another machine says so, with that machine.
	other := report{Written: now, Machine: m, Runs: 3}
	other.Machine.CPU = "other cpu"
	other.merge(read, []string{"gateway"})
	if got := other.markdown(); !strings.Contains(got, "fleet 2026-12-01 10:00 UTC on another machine (cpu, 2 cores") {
		t.Errorf("merged across machines, the page does not name the earlier one:\n%s", got)
	}
}

// One run's figures share its time: the page does not call them apart.
func TestOneRunNamesNoSeparateTimes(t *testing.T) {
	now := time.Now().UTC()
	rep := report{Written: now, Figures: []figure{{Key: "a", Section: "x", Measured: now}, {Key: "b", Section: "y", Measured: now}}}
	if strings.Contains(rep.markdown(), "separate runs") {
		t.Fatal("a single run's page says its sections were measured apart")
	}
}
