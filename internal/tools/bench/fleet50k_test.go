package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"proxyfleet/config"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("2000, 12000,50000")
	if err != nil || !slices.Equal(got, []int{2000, 12000, 50000}) {
		t.Fatalf("parseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "2000,", "-1", "2k"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q) accepted", bad)
		}
	}
	if sizeName(50000) != "50k" || sizeName(2500) != "2500" {
		t.Errorf("sizeName: %s, %s", sizeName(50000), sizeName(2500))
	}
}

// Only WARN and ERROR records from the moment on count, from every
// process's log; lines that are not JSON records are skipped.
func TestWarningsSince(t *testing.T) {
	dir := t.TempDir()
	since := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	write := func(name string, lines ...string) *role {
		path := filepath.Join(dir, name+".log")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return &role{log: f}
	}
	w := write("w01",
		`{"time":"2026-12-01T09:59:59Z","level":"WARN","msg":"before"}`,
		`{"time":"2026-12-01T10:00:01Z","level":"INFO","msg":"fine"}`,
		`{"time":"2026-12-01T10:00:02Z","level":"WARN","msg":"publishing the rotation","err":"too big"}`,
		`panic: not a record`)
	h := write("h1", `{"time":"2026-12-01T10:00:03Z","level":"ERROR","msg":"lost"}`)
	p := &fleetProcs{workers: []*role{w}, healths: []*role{h}, names: map[*role]string{w: "w01", h: "h1"}}
	got := p.warningsSince(since)
	if len(got) != 2 || !strings.HasPrefix(got[0], "w01 10:00:02.000 WARN \"publishing the rotation\" too big") || !strings.HasPrefix(got[1], "h1 10:00:03.000 ERROR \"lost\"") {
		t.Fatalf("warnings: %q", got)
	}
}

// Each size gives every figure with its bound, and the note
// shows how each grows.
func TestFleet50kFigures(t *testing.T) {
	o := fleet50kOpts{hosts: 500, workers: 10, healths: 2, settle: 10 * time.Second, quiet: 30 * time.Second}
	results := []fleet50kResult{
		{n: 2000, inRotation: 5 * time.Second, workerHWM: []float64{50, 52}, healthHWM: []float64{40}, maxMsg: 1 << 20, rotBytes: 4 << 20,
			changes: 2000, verbs: map[string]float64{"list": 0.1, "get": 0.02, "hosts": 0.03, "rotation": 0.05, "watch": 0.04}},
		{n: 50000, inRotation: 70 * time.Second, workerHWM: []float64{80}, healthHWM: []float64{170}, maxMsg: 900, rotBytes: 50000 * 300,
			changes: 50000, warnings: []string{"h2 WARN x"}, verbs: map[string]float64{"list": 2.4}},
	}
	peer := &fleet50kResult{n: 50000, inRotation: 60 * time.Second, workerHWM: []float64{61.5}, healthHWM: []float64{150}, cpu: "CPU x"}
	res := fleet50kFigures(o, results, peer)
	if !strings.Contains(res.notes, "The peer of the same run, 50000 proxies once more with no address plan on any host (the network's DHCP): all in the rotation after 60.0 s, worker peak RSS 61.5 MiB, health peak RSS 150 MiB. CPU x.") {
		t.Errorf("no peer in the notes:\n%s", res.notes)
	}
	met := map[string]bool{}
	for _, f := range res.figures {
		f.check()
		met[f.Key] = f.Met
	}
	for key, want := range map[string]bool{
		"fleet_2k_in_rotation_s": true, "fleet_2k_worker_rss_mib": true, "fleet_2k_rotation_max_msg_kib": false,
		"fleet_2k_rotation_bytes_per_change": false, "fleet_2k_warnings": true, "fleet_2k_list_s": true,
		"fleet_50k_in_rotation_s": false, "fleet_50k_worker_rss_mib": false, "fleet_50k_health_rss_mib": false,
		"fleet_50k_rotation_max_msg_kib": true, "fleet_50k_rotation_bytes_per_change": true, "fleet_50k_warnings": false,
		"fleet_50k_list_s": true, "fleet_50k_watch_s": true,
	} {
		if got, ok := met[key]; !ok || got != want {
			t.Errorf("%s: met %v (present %v), want %v", key, got, ok, want)
		}
	}
	if !strings.Contains(res.notes, "| all in the rotation (s) | 5 | 70 (over) |") {
		t.Errorf("notes lack the growth table:\n%s", res.notes)
	}
}

// The fleet50k config gives every host a plan with room for its proxies,
// no two sharing an address: the config validates at each size.
func TestFleet50kConfigPlans(t *testing.T) {
	for _, n := range []int{2000, 12000, 50000} {
		path, err := fleet50kConfig(t.TempDir(), "/dev/shm/x", "nats://127.0.0.1:4222", n, 500, true)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Load(path)
		if err != nil {
			t.Fatalf("%d proxies: %v", n, err)
		}
		for name, p := range c.Plans() {
			if p.Slots4() < c.Hosts[0].MaxProxies {
				t.Errorf("%d proxies: %s has %d IPv4 slots for room %d", n, name, p.Slots4(), c.Hosts[0].MaxProxies)
			}
		}
		if len(c.Plans()) != 500 {
			t.Errorf("%d proxies: %d plans", n, len(c.Plans()))
		}
	}
}
