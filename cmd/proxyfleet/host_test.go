package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"proxyfleet/client"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// TestHostQuarantineAndRelease: `host quarantine` takes a host out of
// placement (a create naming no host goes to the other one, though the
// quarantined host has more room), `hosts` shows it quarantined with the
// operator's reason, it stays so past many automatic cool-downs, and
// `host release` brings it back: a create lands on it again. Both commands
// are answered like any other (--wait prints their results).
func TestHostQuarantineAndRelease(t *testing.T) {
	isolateNATSEnv(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, fmt.Sprintf(`hosts:
  - {name: h1, driver: sim, sim: {dir: %q}, max_proxies: 10}
  - {name: h2, driver: sim, sim: {dir: %q}, max_proxies: 10}
images:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {quarantine_cool_down: 50ms, quarantine_max_cool_down: 100ms, observe_interval: 50ms}
`, filepath.Join(dir, "h1"), filepath.Join(dir, "h2")))
	srv, _ := serveSimConfig(t, dir, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := func(args ...string) (string, string, int) {
		return runCLI(ctx, append(args, "--server", srv.url)...)
	}
	mustDone := func(args ...string) string {
		t.Helper()
		o, e, code := cli(append(args, "--wait")...)
		if code != 0 || !strings.Contains(o, ": done\n") {
			t.Fatalf("%v: exit %d\nstdout: %s\nstderr: %s\nlogs:\n%s", args, code, o, e, srv.logs.String())
		}
		return o
	}
	hostOf := func(id string) string {
		t.Helper()
		o, e, code := cli("get", id, "--json")
		var st struct {
			Event *messages.StateEvent `json:"event"`
		}
		if code != 0 || json.Unmarshal([]byte(o), &st) != nil || st.Event == nil {
			t.Fatalf("get %s: exit %d\nstdout: %s\nstderr: %s", id, code, o, e)
		}
		return st.Event.Host
	}
	// h2 holds two proxies, so h1 has the more room.
	mustDone("create", "b1", "--host", "h2")
	mustDone("create", "b2", "--host", "h2")

	o := mustDone("host", "quarantine", "h1", "--reason", "disk swap")
	if !strings.HasPrefix(o, "host.quarantine h1: command ") || !strings.Contains(o, "quarantined until released") {
		t.Errorf("host quarantine --wait printed:\n%s", o)
	}
	mustDone("create", "a1")
	if h := hostOf("a1"); h != "h2" {
		t.Errorf("a1 placed on %s while h1 is quarantined, want h2", h)
	}

	hosts := func() map[string]client.HostInfo {
		t.Helper()
		o, e, code := cli("hosts", "--json")
		var hs []client.HostInfo
		if code != 0 || json.Unmarshal([]byte(o), &hs) != nil {
			t.Fatalf("hosts --json: exit %d\nstdout: %s\nstderr: %s", code, o, e)
		}
		out := map[string]client.HostInfo{}
		for _, h := range hs {
			out[h.Host] = h
		}
		return out
	}
	// Twenty automatic cool-downs and observation ticks: no probe ends it.
	time.Sleep(20 * 50 * time.Millisecond)
	if h := hosts()["h1"]; h.State != messages.HostQuarantined || h.Reason != "operator: disk swap" || !h.Until.IsZero() {
		t.Fatalf("h1 after twenty cool-downs: %+v, want quarantined by the operator", h)
	}
	o, e, code := cli("hosts")
	if code != 0 || !strings.Contains(o, "until released: operator: disk swap") {
		t.Errorf("hosts: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}

	o = mustDone("host", "release", "h1")
	if !strings.Contains(o, "released") {
		t.Errorf("host release --wait printed:\n%s", o)
	}
	poll.Until(t, "h1 ok in hosts", 30*time.Second, func() bool { return hosts()["h1"].State == messages.HostOK })
	mustDone("create", "c1")
	if h := hostOf("c1"); h != "h1" {
		t.Errorf("c1 placed on %s after h1 was released, want h1 (the more room)", h)
	}

	// An unknown host is rejected, naming the field.
	o, e, code = cli("host", "quarantine", "h9", "--wait")
	if code != 1 || !strings.Contains(o, "rejected") || !strings.Contains(o, "unknown host") {
		t.Errorf("host quarantine h9: exit %d\nstdout: %s\nstderr: %s", code, o, e)
	}
}
