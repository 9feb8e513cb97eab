package deploy_test

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// unit is a systemd unit file: section -> key -> values, in order (a key
// may repeat).
type unit map[string]map[string][]string

func (u unit) get(section, key string) []string { return u[section][key] }

func (u unit) one(t *testing.T, name, section, key string) string {
	t.Helper()
	v := u.get(section, key)
	if len(v) != 1 {
		t.Fatalf("%s: [%s] %s set %d times, want once", name, section, key, len(v))
	}
	return v[0]
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		case strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: continued line (keep each setting on one line)", path, n)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// roleUnits are the units shipped, by role, with the NATS user of
// deploy/nats/accounts.conf each connects as ("" for serve's embedded
// server, which has no users).
var roleUnits = []struct{ role, file, natsUser string }{
	{"serve", "proxyfleet-serve.service", ""},
	{"worker", "proxyfleet-worker.service", "worker"},
	{"health", "proxyfleet-health.service", "health"},
	{"setup", "proxyfleet-setup.service", "admin"},
	{"pools", "proxyfleet-pools.service", "pools"},
	{"gateway", "proxyfleet-gateway.service", "client"},
}

// unitUser is the system user of deploy/systemd/proxyfleet.sysusers a
// role's unit runs as: one per role, so that no role reads another's
// secrets (systemd_boot_test.go shows it); serve's is proxyfleet.
func unitUser(role string) string {
	if role == "serve" {
		return "proxyfleet"
	}
	return "proxyfleet-" + role
}

const binPath = "/usr/local/bin/proxyfleet"

// accountsUsers loads deploy/nats/accounts.conf with the server's own
// loader (its passwords from the environment TestMain sets) and returns
// its users.
func accountsUsers(t *testing.T) map[string]bool {
	t.Helper()
	opts, err := server.ProcessConfigFile("nats/accounts.conf")
	if err != nil {
		t.Fatalf("nats/accounts.conf: %v", err)
	}
	users := map[string]bool{}
	for _, u := range opts.Users {
		users[u.Username] = true
	}
	return users
}

// TestSystemdUnits reads every unit: one per role, each as its own
// sysusers.d user, its credentials from its own environment file naming
// a user of accounts.conf, nothing listening on a wildcard address, and
// the hardening every unit shares.
func TestSystemdUnits(t *testing.T) {
	users := accountsUsers(t)
	files, _ := filepath.Glob("systemd/*.service")
	var shipped []string
	for _, f := range files {
		shipped = append(shipped, filepath.Base(f))
	}
	var want []string
	for _, r := range roleUnits {
		want = append(want, r.file)
	}
	slices.Sort(want)
	if !slices.Equal(shipped, want) {
		t.Errorf("deploy/systemd has units %v, want one per role %v", shipped, want)
	}
	sysUsers := sysusersUsers(t)
	hardening := map[string]string{
		"NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
		"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
		"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "RestrictSUIDSGID": "yes",
		"MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native", "UMask": "0077",
	}
	for _, r := range roleUnits {
		t.Run(r.role, func(t *testing.T) {
			u := readUnit(t, filepath.Join("systemd", r.file))
			for _, k := range []string{"User", "Group"} {
				if v := u.one(t, r.file, "Service", k); v != unitUser(r.role) || !sysUsers[v] {
					t.Errorf("%s=%s, want %s, a user of proxyfleet.sysusers (%v)", k, v, unitUser(r.role), sysUsers)
				}
			}
			args := strings.Fields(u.one(t, r.file, "Service", "ExecStart"))
			if len(args) < 2 || args[0] != binPath || args[1] != r.role {
				t.Fatalf("ExecStart=%s: want %s %s ...", strings.Join(args, " "), binPath, r.role)
			}
			if !slices.Contains(args, "--config") {
				t.Errorf("ExecStart runs without --config: %v", args)
			}
			for i, a := range args {
				name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !ok && i+1 < len(args) {
					val = args[i+1]
				}
				if strings.HasPrefix(a, "-") && (name == "http" || name == "listen") {
					host, _, err := net.SplitHostPort(val)
					if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
						t.Errorf("ExecStart --%s %s: want a loopback address by default (the units serve no one else unasked)", name, val)
					}
				}
			}
			env := u.get("Service", "EnvironmentFile")
			if r.natsUser == "" {
				// serve: the embedded server has no users; the proxies'
				// password, if proxy.auth is set, may come from there.
				if len(env) != 1 || env[0] != "-/etc/proxyfleet/serve.env" {
					t.Errorf("EnvironmentFile=%v, want -/etc/proxyfleet/serve.env (optional)", env)
				}
			} else {
				if len(env) != 1 || env[0] != "/etc/proxyfleet/"+r.natsUser+".env" {
					t.Errorf("EnvironmentFile=%v, want /etc/proxyfleet/%s.env (NATS_USER=%s)", env, r.natsUser, r.natsUser)
				}
				if !users[r.natsUser] {
					t.Errorf("NATS user %s is not in deploy/nats/accounts.conf (%v)", r.natsUser, users)
				}
			}
			for k, v := range hardening {
				if got := u.get("Service", k); len(got) != 1 || sdBool(got[0]) != v {
					t.Errorf("%s=%q, want %q", k, got, v)
				}
			}
			if u.one(t, r.file, "Install", "WantedBy") != "multi-user.target" {
				t.Errorf("WantedBy=%v", u.get("Install", "WantedBy"))
			}
		})
	}
}

// sdBool spells a systemd boolean as "yes" (true, on, 1) or "no".
func sdBool(v string) string {
	switch v {
	case "true", "on", "1":
		return "yes"
	case "false", "off", "0":
		return "no"
	}
	return v
}

// sysusersUsers applies deploy/systemd/proxyfleet.sysusers to an empty
// root with systemd-sysusers and returns the users it creates: system
// users with no login shell, each but serve's proxyfleet a member of the
// group proxyfleet (which reads the config).
func sysusersUsers(t *testing.T) map[string]bool {
	t.Helper()
	tool := lookTool(t, "systemd-sysusers")
	abs, err := filepath.Abs("systemd/proxyfleet.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "--root="+root, abs).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers %s: %v\n%s", abs, err, out)
	}
	users := map[string]bool{}
	b, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 7 {
			t.Fatalf("passwd line %q", line)
		}
		if uid, _ := strconv.Atoi(f[2]); uid == 0 || uid >= 1000 {
			t.Errorf("user %s has uid %s: want a system uid (1-999)", f[0], f[2])
		}
		if f[6] != "/usr/sbin/nologin" {
			t.Errorf("user %s has shell %s: want /usr/sbin/nologin", f[0], f[6])
		}
		users[f[0]] = true
	}
	g, err := os.ReadFile(filepath.Join(root, "etc/group"))
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, line := range strings.Split(strings.TrimSpace(string(g)), "\n") {
		if f := strings.Split(line, ":"); len(f) == 4 && f[0] == "proxyfleet" && f[3] != "" {
			members = strings.Split(f[3], ",")
		}
	}
	for _, r := range roleUnits {
		if u := unitUser(r.role); u != "proxyfleet" && !slices.Contains(members, u) {
			t.Errorf("%s is not in the group proxyfleet (members %v): it cannot read the config", u, members)
		}
	}
	if len(users) != len(roleUnits) {
		t.Errorf("sysusers made %d users %v, want one per role (%d)", len(users), users, len(roleUnits))
	}
	return users
}

// lookTool finds a systemd tool. The check needs it: `make test` installs
// systemd (deploy/testhost/lib.sh); a test that cannot check must fail,
// not pass quietly.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		for _, dir := range []string{"/usr/bin", "/bin"} {
			if _, serr := os.Stat(filepath.Join(dir, name)); serr == nil {
				return filepath.Join(dir, name)
			}
		}
		t.Fatalf("%s not found: install systemd and systemd-container (`make test` does, deploy/testhost/lib.sh)", name)
	}
	return p
}

// TestSystemdAnalyze runs `systemd-analyze verify` on every unit, the
// roles' and nats-server's (verify says, and exits 0, for an unknown key or
// a bad value: any output fails the test) and `systemd-analyze security`
// (the exposure score of the hardening, at most 2.0 of 10). Verify checks
// that ExecStart's binary exists; the copies it reads run a stand-in.
func TestSystemdAnalyze(t *testing.T) {
	tool := lookTool(t, "systemd-analyze")
	dir := t.TempDir()
	stand := filepath.Join(dir, "proxyfleet")
	if err := os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var copies []string
	files := []string{"nats/nats-server.service"}
	for _, r := range roleUnits {
		files = append(files, filepath.Join("systemd", r.file))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bin := binPath
		if strings.HasPrefix(f, "nats/") {
			bin = "/usr/local/bin/nats-server"
		}
		if !bytes.Contains(b, []byte("ExecStart="+bin+" ")) {
			t.Fatalf("%s: ExecStart does not run %s", f, bin)
		}
		p := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte(bin), []byte(stand)), 0o644); err != nil {
			t.Fatal(err)
		}
		copies = append(copies, p)
	}
	cmd := exec.Command(tool, append([]string{"verify", "--man=no", "--generators=no"}, copies...)...)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, p := range copies {
		cmd := exec.Command(tool, "security", "--offline=true", "--threshold=20", "--no-pager", p)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze security %s: exposure above 2.0 (%v)\n%s", filepath.Base(p), err, out)
		}
	}
}
