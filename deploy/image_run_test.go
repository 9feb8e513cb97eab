package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

// podman runs podman for at most timeout and returns its output.
func podman(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), err
}

// TestImageLocalRuns builds the image with `make image-local` (no
// registry: these machines reach none, so `make image` cannot pull its
// bases here) and runs it as a pod would: its own user, a read-only root,
// no capabilities, the config mounted. `proxyfleet serve` with a sim host
// (the embedded NATS server on a loopback port) answers /healthz and
// /readyz, and stops cleanly on SIGTERM.
//
// podman runs it with runc: crun 1.8 (Debian 12's default runtime) refuses
// a host whose cgroups are v1 with a v2 hierarchy beside them ("cgroups in
// hybrid mode not supported"), as these machines have. Neither runtime
// may raise a limit here (the machine gives no CAP_SYS_RESOURCE, so
// podman's default RLIMIT_NOFILE and RLIMIT_NPROC fail to apply): the
// container gets lower ones, which it may set.
func TestImageLocalRuns(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install podman and runc (`make test` does, deploy/testhost/lib.sh)", tool)
		}
	}
	owner := selfOwner()
	removeImageLeftovers(t)
	image := "localhost/proxyfleet-test:" + owner
	name := "pf-image-" + owner
	// The package's binary first: built with the same flags, it leaves the
	// compiled packages in the cache for make's build (which then links
	// only) instead of compiling them twice at once.
	buildOnce(t)
	t0 := time.Now()
	cmd := exec.Command("make", "-s", "-C", "..", "image-local", "IMAGE="+image, "CONTAINER_ENGINE=podman", "VERSION=v0.0.0-imagetest", "COMMIT=c0ffee")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image-local: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = podman(time.Minute, "rmi", "-f", image) })
	t.Logf("make image-local: %s", time.Since(t0).Round(time.Millisecond))

	// The image's own settings: the Dockerfile's user and entrypoint.
	out, err := podman(30*time.Second, "image", "inspect", "--format", "{{json .Config}}", image)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		User       string
		Entrypoint []string
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("image config %q: %v", out, err)
	}
	uid, gid := dockerUser(t)
	if cfg.User != fmt.Sprintf("%d:%d", uid, gid) || len(cfg.Entrypoint) != 1 || cfg.Entrypoint[0] != binPath {
		t.Errorf("image config user %q entrypoint %v: want the Dockerfile's %d:%d and [%s]", cfg.User, cfg.Entrypoint, uid, gid, binPath)
	}
	if out, err := podman(30*time.Second, "run", "--rm", "--runtime", "runc", "--network", "none",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", image, "version"); err != nil || !strings.Contains(out, "v0.0.0-imagetest") {
		t.Errorf("proxyfleet version in the image: %v\n%s", err, out)
	}

	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("nats: {url: \"\"}\nhosts:\n  - {name: sim1, driver: sim, sim: {dir: /tmp/sim1}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr, natsAddr := freeAddr(t), freeAddr(t)
	if _, err := podman(time.Minute, "run", "-d", "--name", name, "--runtime", "runc",
		"--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"-v", config+":/etc/proxyfleet/config.yaml:ro",
		image, "serve", "--config", "/etc/proxyfleet/config.yaml", "--data-dir", "/tmp/nats",
		"--listen", natsAddr, "--http", httpAddr); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := podman(30*time.Second, "logs", name)
			t.Logf("container %s:\n%s", name, logs)
		}
		if !stopped {
			_, _ = podman(time.Minute, "rm", "-f", "-t", "0", name)
		}
	})
	poll.Until(t, "the image's serve ready on "+httpAddr, time.Minute, ready(httpAddr))
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + httpAddr + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		t.Logf("GET %s: %s", p, resp.Status)
	}
	t.Logf("started and ready %s after make image-local began", time.Since(t0).Round(time.Millisecond))
	if _, err := podman(time.Minute, "stop", "-t", "30", name); err != nil {
		t.Fatal(err)
	}
	code, err := podman(30*time.Second, "inspect", "--format", "{{.State.ExitCode}}", name)
	if err != nil || strings.TrimSpace(code) != "0" {
		t.Errorf("serve in the image exited %q (%v) on SIGTERM, want 0", strings.TrimSpace(code), err)
	}
	if _, err := podman(time.Minute, "rm", name); err == nil {
		stopped = true
	}
}

// removeImageLeftovers removes the containers and images of test
// processes that are gone (a killed run's).
func removeImageLeftovers(t *testing.T) {
	t.Helper()
	owned := regexp.MustCompile(`^(?:pf-image-|localhost/proxyfleet-test:)(\d+\.\d+)$`)
	names, _ := podman(30*time.Second, "ps", "-a", "--format", "{{.Names}}")
	for _, n := range strings.Fields(names) {
		if m := owned.FindStringSubmatch(n); m != nil && !ownerAlive(m[1]) {
			t.Logf("removing container %s, left by a test that is gone", n)
			_, _ = podman(time.Minute, "rm", "-f", "-t", "0", n)
		}
	}
	images, _ := podman(30*time.Second, "images", "--format", "{{.Repository}}:{{.Tag}}")
	for _, n := range strings.Fields(images) {
		if m := owned.FindStringSubmatch(n); m != nil && !ownerAlive(m[1]) {
			t.Logf("removing image %s, left by a test that is gone", n)
			_, _ = podman(time.Minute, "rmi", "-f", n)
		}
	}
}
