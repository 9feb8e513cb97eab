package deploy_test

// A Debian 12 container booted with systemd-nspawn, systemd as its PID 1:
// what deploy/systemd_boot_test.go installs the units into. The root comes
// from deploy/nspawn/build.sh (cached in .nspawn/; `make testhost` builds it
// once) and is booted with --volatile=overlay (every write goes to a tmpfs
// that goes with the container), --private-network (its own loopback, no
// other interface) and --register=no --keep-unit (there is no machined, no
// host systemd). Commands run in it through nsenter into the namespaces of
// its PID 1. A container outlives a killed test (nspawn leaves its init
// running when it is killed): each one carries its owner in its init's
// environment, and every test that boots one first kills those whose owner
// is gone.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"proxyfleet/internal/poll"
)

const ownerVar = "PROXYFLEET_NSPAWN_OWNER"

// selfOwner names this test process: its pid and start time (a pid alone
// may be reused by the time a later run looks).
func selfOwner() string {
	return fmt.Sprintf("%d.%s", os.Getpid(), procStart(os.Getpid()))
}

// procStart is field 22 of /proc/PID/stat, the process's start time in
// clock ticks since boot ("" if it is gone).
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func ownerAlive(owner string) bool {
	p, start, ok := strings.Cut(owner, ".")
	pid, err := strconv.Atoi(p)
	return ok && err == nil && procStart(pid) == start
}

var leftoversOnce sync.Once

// killLeftovers kills the containers (nspawn and its init) and removes the
// staging directories of test processes that are gone: a killed test's.
func killLeftovers(t *testing.T) {
	leftoversOnce.Do(func() {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		var inits, nspawns []int
		for _, p := range procs {
			pid, _ := strconv.Atoi(filepath.Base(p))
			env, err := os.ReadFile(p + "/environ")
			cmdline, _ := os.ReadFile(p + "/cmdline")
			if err != nil {
				continue
			}
			owner := ""
			for _, kv := range bytes.Split(append(env, cmdline...), []byte{0}) {
				if v, ok := bytes.CutPrefix(kv, []byte("--setenv="+ownerVar+"=")); ok {
					owner = string(v)
				} else if v, ok := bytes.CutPrefix(kv, []byte(ownerVar+"=")); ok {
					owner = string(v)
				}
			}
			if owner == "" || ownerAlive(owner) {
				continue
			}
			if bytes.HasPrefix(cmdline, []byte("systemd-nspawn")) || strings.HasSuffix(string(bytes.SplitN(cmdline, []byte{0}, 2)[0]), "/systemd-nspawn") {
				nspawns = append(nspawns, pid)
			} else {
				inits = append(inits, pid)
			}
		}
		for _, pid := range append(nspawns, inits...) {
			t.Logf("killing pid %d, left by a test that is gone", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pf-nspawn-*"))
		for _, d := range dirs {
			owner, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "pf-nspawn-"), "-")
			if !ownerAlive(owner) {
				_ = os.RemoveAll(d)
			}
		}
	})
}

// stageDir is a directory for one container's files, named by this test
// process so that a later run removes it if this one is killed.
func stageDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pf-nspawn-"+selfOwner()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// nspawnRoot builds the root with deploy/nspawn/build.sh, or finds it
// cached (well under a second).
func nspawnRoot(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, "bash", "nspawn/build.sh").CombinedOutput(); err != nil {
		t.Fatalf("deploy/nspawn/build.sh: %v\n%s", err, out)
	}
	t.Logf("the container's root is ready (%s)", time.Since(t0).Round(time.Millisecond))
	dir := os.Getenv("NSPAWN_DIR")
	if dir == "" {
		dir = "../.nspawn"
	}
	root, err := filepath.Abs(filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// container is one booted container.
type container struct {
	t    *testing.T
	name string
	pid  int // its init (systemd), in this machine's PID namespace
}

// bootContainer boots root with the directory src bound at /root/proxyfleet
// (read and write) and waits until systemd reports the system running. The
// container is killed when the test ends; if the test process dies first,
// nspawn gets SIGTERM (its parent-death signal) and powers it off, and a
// later run kills what is left.
func bootContainer(t *testing.T, name, root, src string) *container {
	t.Helper()
	killLeftovers(t)
	tool := lookTool(t, "systemd-nspawn")
	logPath := filepath.Join(src, ".nspawn.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--quiet", "-D", root, "--volatile=overlay", "--private-network",
		"--register=no", "--keep-unit", "--machine=" + name, "--console=pipe",
		"--bind=" + src + ":/root/proxyfleet", "--setenv=" + ownerVar + "=" + selfOwner(), "-b"}
	started := make(chan error, 1)
	exited := make(chan struct{})
	var cmd *exec.Cmd
	// The parent-death signal fires when the thread that started the child
	// exits: start it from a goroutine locked to its thread for as long as
	// the container runs.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd = exec.Command(tool, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
		}
		logf.Close()
		close(exited)
	}()
	if err := <-started; err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	c := &container{t: t, name: name}
	t0 := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.sh(20*time.Second, "journalctl -b --no-pager -o short-monotonic | tail -n 400")
			t.Logf("container %s journal (last 400 lines):\n%s", name, out)
			b, _ := os.ReadFile(logPath)
			t.Logf("systemd-nspawn output:\n%s", b)
		}
		// No graceful power-off: the test has stopped what it meant to.
		if c.pid > 0 {
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
		}
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	// Its init is nspawn's child.
	poll.Until(t, "the container's init", 30*time.Second, func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("systemd-nspawn exited:\n%s", b)
		default:
		}
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, k := range strings.Fields(string(kids)) {
			pid, _ := strconv.Atoi(k)
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "systemd" {
				c.pid = pid
				return true
			}
		}
		return false
	})
	// Until its manager answers (its socket comes a moment after it
	// starts), then until it has booted.
	var state string
	poll.Wait(60*time.Second, func() bool {
		state, err = c.sh(30*time.Second, "systemctl is-system-running --wait || true")
		state = strings.TrimSpace(state)
		return state != "" && state != "offline" && !strings.Contains(state, "Failed to connect")
	})
	if state != "running" {
		failed, _ := c.sh(10*time.Second, "systemctl --failed --no-legend")
		t.Fatalf("container %s: system %q (%v), failed units:\n%s", name, state, err, failed)
	}
	t.Logf("container %s booted in %s", name, time.Since(t0).Round(time.Millisecond))
	return c
}

// sh runs script with bash (-eu -o pipefail) as root in the container, in
// /root/proxyfleet, with a clean environment, for at most timeout; it
// returns stdout and stderr together.
func (c *container) sh(timeout time.Duration, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(c.pid), "-a", "--",
		"/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
		"/bin/bash", "-euo", "pipefail", "-c", "cd /root/proxyfleet\n"+script)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %s)", ctx.Err(), timeout)
	}
	return string(out), err
}

// must runs script and fails the test if it fails.
func (c *container) must(timeout time.Duration, script string) string {
	c.t.Helper()
	out, err := c.sh(timeout, script)
	if err != nil {
		c.t.Fatalf("in container %s: %v\n$ %s\n%s", c.name, err, script, out)
	}
	return out
}

// until polls script until it succeeds, for at most d.
func (c *container) until(what string, d time.Duration, script string) {
	c.t.Helper()
	var last string
	ok := poll.Wait(d, func() bool {
		out, err := c.sh(10*time.Second, script)
		last = out
		if err != nil {
			last = fmt.Sprintf("%s(%v)", out, err)
		}
		return err == nil
	})
	if !ok {
		c.t.Fatalf("in container %s: %s: not within %s; last:\n$ %s\n%s", c.name, what, d, script, last)
	}
}

var errNoPID = errors.New("no main pid")

// mainPID is a unit's main process, in the container's PID namespace.
func (c *container) mainPID(unit string) (int, error) {
	out, err := c.sh(10*time.Second, "systemctl show -P MainPID "+unit)
	if err != nil {
		return 0, err
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	if pid == 0 {
		return 0, fmt.Errorf("%s: %w", unit, errNoPID)
	}
	return pid, nil
}
