package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const monitoringDir = "../../deploy/monitoring"

// exportedNames are the metric names the roles export: gathered from the
// registries of a running serve, worker and health (scraped over HTTP),
// and, since sim hosts have no libvirt, from the kvm observer's metrics
// after one of each event.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	r := startRoles(t)
	// A pool, so that the pool controller's per-pool families exist.
	withPool(t, r)
	names := map[string]bool{}
	for _, addr := range []string{r.serve, r.worker, r.health} {
		for n := range scrape(t, addr) {
			names[n] = true
		}
	}
	reg := prometheus.NewRegistry()
	o := newKVMMetrics(reg).observer("h1")
	o.Call("DomainLookupByName", time.Millisecond, false)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// selectorNames returns the metric names an expression selects.
func selectorNames(t *testing.T, p parser.Parser, expr string) []string {
	t.Helper()
	e, err := p.ParseExpr(expr)
	if err != nil {
		t.Errorf("expression %q: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	if len(out) == 0 {
		t.Errorf("expression %q names no metric", expr)
	}
	return out
}

// isExported: a histogram's series (_bucket, _sum, _count) are its
// family's.
func isExported(names map[string]bool, n string) bool {
	if names[n] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, suf); ok && names[b] {
			return true
		}
	}
	return false
}

// The alert rules parse (Prometheus's own rule file parser, strict about
// fields, every expression and template checked), hold the alerts
// docs/OPERATIONS.md relies on, and name only metrics the roles export;
// so do the dashboard's queries.
func TestMonitoringNamesOnlyExportedMetrics(t *testing.T) {
	names := exportedNames(t)
	p := parser.NewParser(parser.Options{})

	path := filepath.Join(monitoringDir, "alerts.yaml")
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", path, err)
	}
	if groups == nil {
		t.FailNow()
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, n := range selectorNames(t, p, r.Expr) {
				if !isExported(names, n) {
					t.Errorf("alert %s names %s, which no role exports", r.Alert, n)
				}
			}
		}
	}
	for _, want := range []string{
		"ProxyfleetRotationBelowFloor", "ProxyfleetRotationPublishErrors", "ProxyfleetNoLeaseHolder",
		"ProxyfleetTwoLeaseHolders", "ProxyfleetDeadLettersGrowing", "ProxyfleetHostQuarantined", "ProxyfleetWorkerNotReady",
	} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s in %s (have %v)", want, path, alerts)
		}
	}

	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 10 {
		t.Fatalf("dashboard.json: title %q, %d panels; want a titled dashboard of the metrics", dash.Title, len(dash.Panels))
	}
	used := map[string]bool{}
	for _, pn := range dash.Panels {
		if len(pn.Targets) == 0 {
			t.Errorf("panel %q has no query", pn.Title)
		}
		for _, tg := range pn.Targets {
			for _, n := range selectorNames(t, p, tg.Expr) {
				used[n] = true
				if !isExported(names, n) {
					t.Errorf("panel %q names %s, which no role exports", pn.Title, n)
				}
			}
		}
	}
	// The dashboard shows every family of ours but the flags and
	// versions it needs not draw.
	for n := range names {
		if !strings.HasPrefix(n, "proxyfleet_") {
			continue
		}
		shown := used[n] || used[n+"_bucket"] || used[n+"_count"]
		if !shown && !slices.Contains([]string{
			"proxyfleet_rotation_version", "proxyfleet_events_ignored_total", "proxyfleet_health_caught_up",
			"proxyfleet_health_topology_missing", "proxyfleet_health_probing", "proxyfleet_probe_targets",
			"proxyfleet_probe_results_ignored_total", "proxyfleet_worker_host_pulling",
		}, n) {
			t.Errorf("dashboard.json shows no %s", n)
		}
	}
}
