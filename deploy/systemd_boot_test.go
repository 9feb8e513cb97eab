package deploy_test

// TestSystemdBoot installs the binary and the units of deploy/systemd into a
// Debian 12 container booted with systemd (nspawn_test.go) by running the
// shell blocks of docs/OPERATIONS.md, "systemd", as they stand, then checks
// what that section and the units promise: every unit active, the roles
// ready, a create and a delete through the CLI on a sim host, the
// hardening (a role writes only its state directory and reads no other
// role's secrets), a drain within TimeoutStopSec, a killed worker
// restarted by systemd and owning its hosts again, and JSON in the
// journal. Two rounds, in containers of their own and at once: the roles
// with a nats-server unit, and serve alone.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// docBlocks returns the shell blocks of docs/OPERATIONS.md marked
// `<!-- systemd_boot_test: NAME -->`, joined in their order.
func docBlocks(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- systemd_boot_test: ([a-z-]+) -->\n```sh\n(.*?)```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		if m[1] == name {
			out = append(out, m[2])
		}
	}
	if len(out) == 0 {
		t.Fatalf("docs/OPERATIONS.md has no block marked systemd_boot_test: %s", name)
	}
	return strings.Join(out, "\n")
}

var (
	natsServerMu  sync.Mutex
	natsServerBin string
)

// buildNATSServer builds nats-server from the module version go.mod pins,
// once for the package's tests.
func buildNATSServer(t *testing.T) string {
	t.Helper()
	natsServerMu.Lock()
	defer natsServerMu.Unlock()
	if natsServerBin != "" {
		return natsServerBin
	}
	bin := filepath.Join(filepath.Dir(buildOnce(t)), "nats-server")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	natsServerBin = bin
	return bin
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkout stages what an operator has in a checkout after `make build`:
// the binaries, the repository's deploy files, and the operator's own
// files (files: name -> content).
func checkout(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := stageDir(t)
	copyFile(t, buildOnce(t), filepath.Join(dir, "bin/proxyfleet"), 0o755)
	copyFile(t, buildNATSServer(t), filepath.Join(dir, "bin/nats-server"), 0o755)
	units, _ := filepath.Glob("systemd/*")
	for _, f := range append(units, "nats/accounts.conf", "nats/nats-server.conf", "nats/nats-server.service") {
		copyFile(t, f, filepath.Join(dir, "deploy", f), 0o644)
	}
	copyFile(t, "../nats.conf", filepath.Join(dir, "nats.conf"), 0o644)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// shQuote quotes s for the shell.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// unitState is what systemctl show says of a unit.
func (c *container) unitState(unit string) map[string]string {
	c.t.Helper()
	out := c.must(10*time.Second, "systemctl show -p ActiveState,SubState,Result,MainPID,NRestarts,ExecMainStatus,InvocationID "+unit)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}

// checkAccess runs, as a unit's main process (its uid, gid and groups, in
// its mount namespace: its read-only and hidden paths, its /proc), a write
// (W) or read (R) of each path, and compares allowed or denied with want.
func (c *container) checkAccess(unit string, want map[string]bool) {
	c.t.Helper()
	var sb strings.Builder
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		op, path, _ := strings.Cut(k, " ")
		try := "cat " + path + " >/dev/null"
		if op == "W" {
			try = "echo x > " + path + " && rm -f " + path
		}
		fmt.Fprintf(&sb, "if (%s) 2>/dev/null; then echo '%s ok'; else echo '%s denied'; fi\n", try, k, k)
	}
	script := fmt.Sprintf(`pid=$(systemctl show -P MainPID %s)
uid=$(awk '/^Uid:/{print $2}' /proc/$pid/status)
gid=$(awk '/^Gid:/{print $2}' /proc/$pid/status)
groups=$(awk '/^Groups:/{$1=""; print}' /proc/$pid/status | xargs | tr ' ' ,)
if [ -n "$groups" ]; then g="--groups=$groups"; else g=--clear-groups; fi
nsenter -t $pid -m -- setpriv --reuid=$uid --regid=$gid $g --inh-caps=-all --bounding-set=-all --no-new-privs -- /bin/sh -c %s
`, unit, shQuote(sb.String()))
	out := c.must(20*time.Second, script)
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, res, ok := strings.Cut(l, " ok")
		if ok && res == "" {
			got[k] = true
		} else if k, ok := strings.CutSuffix(l, " denied"); ok {
			got[k] = false
		}
	}
	for _, k := range keys {
		v, ok := got[k]
		switch {
		case !ok:
			c.t.Errorf("%s: %s: no answer in\n%s", unit, k, out)
		case v != want[k]:
			c.t.Errorf("%s: %s: allowed=%v, want %v", unit, k, v, want[k])
		}
	}
}

// journalJSON checks that the unit's processes logged at least min lines
// to the journal, each a JSON object with level, msg and (unless role is
// empty: serve's top level has none) role.
func (c *container) journalJSON(unit, role string, min int) {
	c.t.Helper()
	out := c.must(20*time.Second, "journalctl -u "+unit+" -o json --no-pager")
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			c.t.Fatalf("journalctl -o json: %v: %q", err, l)
		}
		if e["_COMM"] != "proxyfleet" {
			continue // systemd's own lines about the unit
		}
		msg, _ := e["MESSAGE"].(string)
		var rec map[string]any
		if err := json.Unmarshal([]byte(msg), &rec); err != nil {
			c.t.Errorf("%s logged a line that is not JSON: %q", unit, msg)
			continue
		}
		if rec["level"] == nil || rec["msg"] == nil || (role != "" && rec["role"] != role) {
			c.t.Errorf("%s logged %q: want level, msg and role %q", unit, msg, role)
		}
		n++
	}
	if n < min {
		c.t.Errorf("journalctl -u %s: %d lines of the process, want at least %d", unit, n, min)
	}
}

func TestSystemdBoot(t *testing.T) {
	t.Parallel()
	root := nspawnRoot(t)
	t0 := time.Now()
	t.Cleanup(func() { t.Logf("both rounds done %s after the root was ready", time.Since(t0).Round(time.Millisecond)) })
	t.Run("roles", func(t *testing.T) {
		t.Parallel()
		systemdRoles(t, root)
	})
	t.Run("serve", func(t *testing.T) {
		t.Parallel()
		systemdServe(t, root)
	})
}

// systemdRoles is the first round: nats-server and every role as its own
// unit, installed by the docs' blocks.
func systemdRoles(t *testing.T, root string) {
	t0 := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	src := checkout(t, map[string]string{
		"config.yaml": `nats: {url: "nats://127.0.0.1:4222"}
hosts:
  - {name: sim1, driver: sim, sim: {dir: /var/lib/proxyfleet-worker/sim1}}
  # a create takes 4s here: one in flight when the worker is stopped
  - {name: sim2, driver: sim, sim: {dir: /var/lib/proxyfleet-worker/sim2, boot_delay: 4s}}
images:
  - {name: demo, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
default_image: demo
proxy:
  auth: {user: fleet}
worker:
  # a killed worker's hosts are owned again within seconds (15s by default)
  pinned_ttl: 3s
gateway:
  listen: 127.0.0.1:8888
  users: [{name: alice, password_file: /etc/proxyfleet/gateway-alice}]
`,
		// The sim hosts need no SSH; the install step copies these all the same.
		"id_ed25519": "not a key: the sim driver reads none\n", "known_hosts": "\n",
		"gateway-alice": "alice-secret\n",
	})
	c := bootContainer(t, "pf-sd-roles", root, src)
	step("booted")
	c.must(2*time.Minute, docBlocks(t, "roles"))
	step("installed and enabled as docs/OPERATIONS.md says")

	units := []string{"nats-server", "proxyfleet-setup", "proxyfleet-worker", "proxyfleet-health", "proxyfleet-pools", "proxyfleet-gateway"}
	c.until("every unit active and every role ready", time.Minute,
		"systemctl is-active "+strings.Join(units, " ")+"\n"+
			"for p in 9090 9091 9093 9094; do curl -fsS -o /dev/null http://127.0.0.1:$p/readyz; done")
	step("every unit active, /readyz ready")
	out := c.must(2*time.Minute, docBlocks(t, "roles-check"))
	t.Logf("the docs' check:\n%s", out)
	step("the docs' check: create and delete through the CLI")
	for _, u := range units {
		if s := c.unitState(u); s["ActiveState"] != "active" || s["NRestarts"] != "0" {
			t.Errorf("%s: %v: want active, never restarted", u, s)
		}
	}

	// The hardening, as each process sees the machine.
	healthPID, err := c.mainPID("proxyfleet-health")
	if err != nil {
		t.Fatal(err)
	}
	workerPID, err := c.mainPID("proxyfleet-worker")
	if err != nil {
		t.Fatal(err)
	}
	c.checkAccess("proxyfleet-worker", map[string]bool{
		"W /var/lib/proxyfleet-worker/probe":         true,
		"W /etc/proxyfleet/probe":                    false,
		"W /usr/local/bin/probe":                     false,
		"W /var/lib/probe":                           false,
		"W /root/probe":                              false,
		"R /etc/proxyfleet/config.yaml":              true,
		"R /etc/proxyfleet/id_ed25519":               true,
		"R /etc/proxyfleet/worker.env":               false, // systemd read it
		"R /etc/proxyfleet/admin.env":                false,
		"R /etc/proxyfleet/health.env":               false,
		"R /etc/proxyfleet/pools.env":                false,
		"R /etc/proxyfleet/client.env":               false,
		"R /etc/proxyfleet/gateway-alice":            false,
		"R /etc/nats/users.env":                      false,
		fmt.Sprintf("R /proc/%d/environ", workerPID): true,
		fmt.Sprintf("R /proc/%d/environ", healthPID): false,
	})
	c.checkAccess("proxyfleet-health", map[string]bool{
		"W /var/lib/proxyfleet-worker/probe":         false,
		"W /etc/proxyfleet/probe":                    false,
		"R /etc/proxyfleet/config.yaml":              true,
		"R /etc/proxyfleet/id_ed25519":               false,
		"R /etc/proxyfleet/worker.env":               false,
		fmt.Sprintf("R /proc/%d/environ", workerPID): false,
	})
	c.checkAccess("proxyfleet-gateway", map[string]bool{
		"R /etc/proxyfleet/gateway-alice": true,
		"R /etc/proxyfleet/id_ed25519":    false,
		"R /etc/proxyfleet/client.env":    false,
	})
	step("hardening checked")

	// A drain: a create in flight on sim2 (4s) when the worker is stopped.
	client := "set -a; . /etc/proxyfleet/client.env; set +a\n"
	c.must(30*time.Second, client+"proxyfleet create p2 --host sim2")
	c.until("p2 in flight", 30*time.Second,
		`curl -fsS http://127.0.0.1:9090/metrics | awk '/^proxyfleet_work_in_flight/ {n += $2} END {exit !(n > 0)}'`)
	stopStart := time.Now()
	c.must(time.Minute, "systemctl stop proxyfleet-worker")
	took := time.Since(stopStart)
	s := c.unitState("proxyfleet-worker")
	if s["Result"] != "success" || took >= 45*time.Second {
		t.Errorf("systemctl stop proxyfleet-worker: %s, %v: want Result=success within TimeoutStopSec=45", took, s)
	}
	drain := c.must(20*time.Second, "journalctl -u proxyfleet-worker _SYSTEMD_INVOCATION_ID="+s["InvocationID"]+" -o cat --no-pager")
	for _, want := range []string{`"msg":"draining worker"`, `"msg":"worker stopped"`} {
		if !strings.Contains(drain, want) {
			t.Errorf("the stopped worker's journal has no %s:\n%s", want, drain)
		}
	}
	step(fmt.Sprintf("systemctl stop drained the worker in %s", took.Round(time.Millisecond)))
	c.must(30*time.Second, "systemctl start proxyfleet-worker")
	c.must(time.Minute, client+"proxyfleet create p2 --host sim2 --wait")
	step("restarted; p2 runs")

	// A killed worker: systemd restarts it, and it owns its hosts again.
	before := c.unitState("proxyfleet-worker")
	c.must(10*time.Second, "systemctl kill -s SIGKILL --kill-who=main proxyfleet-worker")
	var after map[string]string
	c.until("the killed worker restarted", 30*time.Second, fmt.Sprintf(
		`[ "$(systemctl show -P NRestarts proxyfleet-worker)" -gt %s ] && systemctl is-active proxyfleet-worker`, before["NRestarts"]))
	after = c.unitState("proxyfleet-worker")
	if after["MainPID"] == before["MainPID"] {
		t.Fatalf("worker MainPID %s before and after the kill", after["MainPID"])
	}
	c.until("the restarted worker owns sim1 and sim2", time.Minute, client+fmt.Sprintf(
		`proxyfleet hosts --json | tee /dev/stderr | grep -c '"owner": *"[^"]*-%s"' | grep -qx 2`, after["MainPID"]))
	c.must(time.Minute, client+"proxyfleet create p3 --host sim1 --wait && proxyfleet get p3")
	step("killed, restarted by systemd, its hosts owned again")

	c.journalJSON("proxyfleet-worker", "worker", 10)
	c.journalJSON("proxyfleet-health", "health", 2)
	c.journalJSON("proxyfleet-pools", "pools", 1)
	c.journalJSON("proxyfleet-gateway", "gateway", 1)
	c.journalJSON("proxyfleet-setup", "setup", 1)

	// Every unit stops within its TimeoutStopSec, cleanly.
	for _, u := range slices.Backward(units) {
		c.must(time.Minute, "systemctl stop "+u)
		if s := c.unitState(u); s["Result"] != "success" {
			t.Errorf("systemctl stop %s: %v, want Result=success", u, s)
		}
	}
	step("every unit stopped cleanly")
}

// systemdServe is the second round: serve alone.
func systemdServe(t *testing.T, root string) {
	t0 := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(t0).Seconds(), what) }
	src := checkout(t, map[string]string{
		"config.yaml": `nats: {url: ""}
hosts:
  - {name: sim1, driver: sim, sim: {dir: /var/lib/proxyfleet/sim1}}
images:
  - {name: demo, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
default_image: demo
proxy:
  auth: {user: fleet}
`,
	})
	c := bootContainer(t, "pf-sd-serve", root, src)
	step("booted")
	c.must(2*time.Minute, docBlocks(t, "serve"))
	c.until("serve active and ready", time.Minute,
		"systemctl is-active proxyfleet-serve && curl -fsS -o /dev/null http://127.0.0.1:9091/readyz")
	step("active, /readyz ready")
	out := c.must(2*time.Minute, docBlocks(t, "serve-check"))
	t.Logf("the docs' check:\n%s", out)
	step("the docs' check: create and delete through the CLI")
	c.checkAccess("proxyfleet-serve", map[string]bool{
		"W /var/lib/proxyfleet/probe":      true,
		"W /var/lib/proxyfleet/nats/probe": true,
		"W /etc/proxyfleet/probe":          false,
		"W /var/lib/probe":                 false,
		"R /etc/proxyfleet/config.yaml":    true,
		"R /etc/proxyfleet/serve.env":      false,
	})
	c.journalJSON("proxyfleet-serve", "", 3)
	stopStart := time.Now()
	c.must(time.Minute, "systemctl stop proxyfleet-serve")
	took := time.Since(stopStart)
	if s := c.unitState("proxyfleet-serve"); s["Result"] != "success" || took >= 45*time.Second {
		t.Errorf("systemctl stop proxyfleet-serve: %s, %v: want Result=success within TimeoutStopSec=45", took, s)
	}
	step("stopped in " + took.Round(time.Millisecond).String())
}
