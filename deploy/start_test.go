// The tests of this file start the roles as the shipped systemd units and
// Kubernetes manifests do (about 30s, most of it building the binary once).

package deploy_test

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"

	"proxyfleet/internal/poll"
)

// startFixture is a nats-server loading deploy/nats/accounts.conf, a
// built proxyfleet and a config of two sim hosts on that server: what
// the shipped units and manifests need to start.
type startFixture struct {
	bin, config string
	natsURL     string
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
	f.natsURL = s.ClientURL()
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

// TestK8sManifestsStart runs the containers of the Deployments the way the
// kubelet would, so that every flag, environment variable, config key,
// probe and scrape path of deploy/k8s/proxyfleet.yaml is one the binary
// takes or serves (a renamed flag, variable or path fails here): their
// args ($(VAR) expanded from their env), their env with the secrets'
// values (each secret and key as docs/OPERATIONS.md creates them), the
// ConfigMap's config.yaml with only what points outside this test
// replaced (NATS, the hosts, the replicas of a one-node server, the probe
// listener's address), and every port by its name on a loopback address.
// Each container's readiness and liveness probe, the ServiceMonitor's
// endpoint and health's probe target then answer 200.
func TestK8sManifestsStart(t *testing.T) {
	t.Parallel()
	f := newStartFixture(t)
	m := readManifests(t)
	secrets := docSecrets(t)
	secretValue := func(name, key string) string {
		if !slices.Contains(secrets[name], key) {
			t.Fatalf("secret %s key %s: docs/OPERATIONS.md makes %s with keys %v", name, key, name, secrets[name])
		}
		if u, ok := strings.CutPrefix(name, "proxyfleet-nats-"); ok {
			return f.passwords[u]
		}
		return name + "-" + key + "-secret"
	}

	// The ConfigMap's config, pointed at this test's server and sim hosts.
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(m.configMaps[0].Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	probeAddr := freeAddr(t)
	nc := cfg["nats"].(map[string]any)
	nc["url"], nc["replicas"] = f.natsURL, 1
	cfg["hosts"] = []any{map[string]any{"name": "sim1", "driver": "sim", "sim": map[string]any{"dir": filepath.Join(dir, "sim1")}}}
	hc := cfg["health"].(map[string]any)
	target, err := url.Parse(hc["target"].(string))
	if err != nil {
		t.Fatal(err)
	}
	_, probePort, _ := net.SplitHostPort(hc["probe_listen"].(string))
	hc["probe_listen"] = probeAddr
	target.Host = probeAddr
	hc["target"] = target.String()
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The ServiceMonitor's path on the port http (which pods it scrapes:
	// TestK8sManifests).
	scrape := ""
	for _, sm := range m.monitors {
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port == "http" {
				scrape = ep.Path
			}
		}
	}
	for _, r := range k8sRoles {
		c := m.deployments[r.role].Spec.Template.Spec.Containers[0]
		vars := map[string]string{"POD_NAME": "proxyfleet-" + r.role + "-abc12"}
		var env []string
		for _, e := range c.Env {
			v := e.Value
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				v = secretValue(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
			}
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				v = vars[e.Name]
			}
			vars[e.Name] = v
			env = append(env, e.Name+"="+v)
		}
		// Ports by name: the --http listener's on a free loopback
		// address, the probe listener's where the config now has it.
		ports := map[string]string{}
		for _, p := range c.Ports {
			if p.Name == "probe" {
				if strconv.Itoa(int(p.ContainerPort)) != probePort {
					t.Errorf("%s: port probe %d, health.probe_listen's is %s", r.role, p.ContainerPort, probePort)
				}
				ports[p.Name] = probeAddr
			}
		}
		expand := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
		var args []string
		for i, a := range c.Args {
			a = expand.ReplaceAllStringFunc(a, func(s string) string { return vars[s[2:len(s)-1]] })
			switch {
			case i > 0 && c.Args[i-1] == "--config":
				a = config
			case strings.HasPrefix(a, "--http="):
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(a, "--http="))
				addr := freeAddr(t)
				for _, p := range c.Ports {
					if strconv.Itoa(int(p.ContainerPort)) == port {
						ports[p.Name] = addr
					}
				}
				a = "--http=" + addr
			}
			args = append(args, a)
		}
		f.run(t, r.role, args, env)
		if c.ReadinessProbe == nil {
			continue // setup: nothing to probe
		}
		get := func(what string, pr *corev1.Probe) func() bool {
			addr, ok := ports[pr.HTTPGet.Port.String()]
			if !ok {
				t.Fatalf("%s: %s probe on port %s, which the container does not name", r.role, what, pr.HTTPGet.Port.String())
			}
			return func() bool { return getOK("http://" + addr + pr.HTTPGet.Path) }
		}
		t0 := time.Now()
		poll.Until(t, r.role+" readiness probe", 30*time.Second, get("readiness", c.ReadinessProbe))
		t.Logf("%s ready in %s", r.role, time.Since(t0).Round(time.Millisecond))
		if !get("liveness", c.LivenessProbe)() {
			t.Errorf("%s: liveness probe %s fails", r.role, c.LivenessProbe.HTTPGet.Path)
		}
		if scrape == "" || !getOK("http://"+ports["http"]+scrape) {
			t.Errorf("%s: the ServiceMonitor's path %q on port http does not answer", r.role, scrape)
		}
		if r.role == "health" && !getOK("http://"+probeAddr+target.Path+"?nonce=k8s") {
			t.Errorf("health: health.target's path %s on port probe does not answer", target.Path)
		}
	}
}

// getOK says whether a GET of u answers 200.
func getOK(u string) bool {
	resp, err := http.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// docSecrets are the secrets docs/OPERATIONS.md, "Kubernetes", makes in
// the namespace proxyfleet (`kubectl -n proxyfleet create secret generic
// NAME --from-file=[KEY=]PATH ...`, a `for u in ...` loop expanded), with
// their keys.
func docSecrets(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, "### Kubernetes"), strings.Index(doc, "## What to watch")
	if i < 0 || j < i {
		t.Fatal("docs/OPERATIONS.md: no section Kubernetes")
	}
	sec := strings.ReplaceAll(doc[i:j], "\\\n", " ")
	// for V in A B C; do BODY; done, BODY repeated with $V replaced.
	loop := regexp.MustCompile(`(?s)for (\w+) in ([^;]+); do(.*?)done`)
	sec = loop.ReplaceAllStringFunc(sec, func(l string) string {
		m := loop.FindStringSubmatch(l)
		var out []string
		for _, v := range strings.Fields(m[2]) {
			out = append(out, strings.ReplaceAll(m[3], "$"+m[1], v))
		}
		return strings.Join(out, "\n")
	})
	secrets := map[string][]string{}
	create := regexp.MustCompile(`kubectl -n proxyfleet create secret generic (\S+)((?: --from-(?:file|literal)=\S+)+)`)
	for _, m := range create.FindAllStringSubmatch(sec, -1) {
		for _, src := range strings.Fields(m[2]) {
			_, v, _ := strings.Cut(src, "=")
			key, _, ok := strings.Cut(v, "=")
			if !ok { // --from-file=PATH: the key is the file's name
				key = filepath.Base(v)
			}
			secrets[m[1]] = append(secrets[m[1]], key)
		}
	}
	if len(secrets) == 0 {
		t.Fatal("docs/OPERATIONS.md, Kubernetes: no `kubectl -n proxyfleet create secret generic`")
	}
	return secrets
}
