// The tests of this file start the roles as the shipped systemd units and
// Kubernetes manifests do (about 30s, most of it building the binary once).

package deploy_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"proxyfleet/internal/poll"
)

// startFixture is a nats-server loading deploy/nats/accounts.conf, a
// built proxyfleet and a config of two sim hosts on that server: what
// the shipped units and manifests need to start.
type startFixture struct {
	bin, config string
	passwords   map[string]string // by accounts.conf user
}

// natsPasswords are the passwords of accounts.conf's users in this
// package's tests; TestMain puts them in the environment once (where
// accounts.conf reads them), so that tests can run in parallel.
var natsPasswords = map[string]string{
	"admin": "admin-secret", "client": "client-secret", "worker": "worker-secret",
	"health": "health-secret", "pools": "pools-secret", "sys": "sys-secret",
}

func setNATSPasswords() {
	for u, pw := range natsPasswords {
		k := "PROXYFLEET_" + strings.ToUpper(u) + "_PASSWORD"
		if u == "sys" {
			k = "NATS_SYS_PASSWORD"
		}
		os.Setenv(k, pw)
	}
}

func newStartFixture(t *testing.T) startFixture {
	t.Helper()
	f := startFixture{passwords: natsPasswords}
	opts, err := server.ProcessConfigFile("nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	dir := t.TempDir()
	f.bin = buildOnce(t)
	f.config = filepath.Join(dir, "config.yaml")
	cfg := fmt.Sprintf("nats: {url: %q}\nhosts:\n  - {name: sim1, driver: sim, sim: {dir: %q}}\n  - {name: sim2, driver: sim, sim: {dir: %q}}\n",
		s.ClientURL(), filepath.Join(dir, "sim1"), filepath.Join(dir, "sim2"))
	if err := os.WriteFile(f.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

var (
	buildMu  sync.Mutex
	builtBin string
)

func TestMain(m *testing.M) {
	setNATSPasswords()
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// buildOnce builds proxyfleet for the package's tests, once.
func buildOnce(t *testing.T) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if builtBin != "" {
		return builtBin
	}
	dir, err := os.MkdirTemp("", "pf-deploy-start-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "proxyfleet")
	// Static, as the image's (Dockerfile) and with its flags, so that the
	// image's build and nats-server's (systemd_boot_test.go) reuse the
	// compiled packages; it also runs in the test containers as it is.
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "../cmd/proxyfleet")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("go build: %v\n%s", err, out)
	}
	builtBin = bin
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// run starts the binary with args and env until the test ends (SIGTERM,
// then wait), its output in a file the failure shows.
func (f startFixture) run(t *testing.T, name string, args, env []string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), name+".log")
	out, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(f.bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		start := time.Now()
		defer func() { t.Logf("%s stopped in %s", name, time.Since(start).Round(time.Millisecond)) }()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("%s %v:\n%s", name, args, b)
		}
	})
}

func ready(addr string) func() bool {
	return func() bool {
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get("http://" + addr + p)
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	}
}

// TestSystemdUnitsStart runs set-up, a worker and a health process with
// the ExecStart and the NATS user of their units (the binary, the config
// and the --http port replaced), against a server with accounts.conf:
// each connects as its own user, and the worker and health processes
// become ready on their --http listener.
func TestSystemdUnitsStart(t *testing.T) {
	t.Parallel()
	f := newStartFixture(t)
	addrs := map[string]string{}
	for _, r := range roleUnits {
		if r.role == "serve" || r.role == "gateway" {
			continue // serve alone; the gateway needs gateway.listen (systemd_boot_test.go starts both)
		}
		u := readUnit(t, filepath.Join("systemd", r.file))
		args := strings.Fields(u.one(t, r.file, "Service", "ExecStart"))[1:]
		addr := ""
		for i := range args {
			switch {
			case args[i-min(i, 1)] == "--config":
				args[i] = f.config
			case args[i-min(i, 1)] == "--http":
				addr = freeAddr(t)
				args[i] = addr
			}
		}
		f.run(t, r.role, args, []string{"NATS_USER=" + r.natsUser, "NATS_PASSWORD=" + f.passwords[r.natsUser]})
		if addr != "" {
			addrs[r.role] = addr
		}
	}
	for role, addr := range addrs {
		poll.Until(t, role+" ready on "+addr, 30*time.Second, ready(addr))
	}
}

// TestK8sManifestsStart runs the containers of the Deployments the same
// way: their args ($(VAR) expanded from their env as the kubelet does),
// their env with the secrets' passwords, the config and the port of
// --http=:PORT replaced.
func TestK8sManifestsStart(t *testing.T) {
	t.Parallel()
	f := newStartFixture(t)
	m := readManifests(t)
	for _, r := range k8sRoles {
		c := m.deployments[r.role].Spec.Template.Spec.Containers[0]
		vars := map[string]string{"POD_NAME": "proxyfleet-" + r.role + "-abc12"}
		var env []string
		for _, e := range c.Env {
			v := e.Value
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				v = f.passwords[strings.TrimPrefix(e.ValueFrom.SecretKeyRef.Name, "proxyfleet-nats-")]
			}
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				v = vars[e.Name]
			}
			vars[e.Name] = v
			env = append(env, e.Name+"="+v)
		}
		expand := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
		addr := ""
		var args []string
		for i, a := range c.Args {
			a = expand.ReplaceAllStringFunc(a, func(s string) string { return vars[s[2:len(s)-1]] })
			switch {
			case i > 0 && c.Args[i-1] == "--config":
				a = f.config
			case strings.HasPrefix(a, "--http="):
				addr = freeAddr(t)
				a = "--http=" + addr
			}
			args = append(args, a)
		}
		f.run(t, r.role, args, env)
		if addr != "" {
			t0 := time.Now()
			poll.Until(t, r.role+" ready on "+addr, 30*time.Second, ready(addr))
			t.Logf("%s ready in %s", r.role, time.Since(t0).Round(time.Millisecond))
		}
	}
}
