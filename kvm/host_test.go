package kvm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"proxyfleet/internal/faultproxy"
	"proxyfleet/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests run against a real OpenSSH sshd, started per test on loopback
// with keys made for it, forwarding to a real libvirtd's socket. Neither is
// installed or started here: the project's `make testhost` does that. When
// they are missing the tests fail (never skip: CI fails on skips, so a
// missing test host can never pass as green).
const (
	sshdPath     = "/usr/sbin/sshd"
	libvirtSock  = DefaultSocket
	testhostHint = "the kvm tests need OpenSSH's sshd and a running libvirtd; run `make testhost` first (deploy/testhost/)"
)

// requireHost fails the test when sshd or libvirtd's socket is missing.
func requireHost(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(sshdPath); err != nil {
		t.Fatalf("%s: %v\n%s", sshdPath, err, testhostHint)
	}
	c, err := net.DialTimeout("unix", libvirtSock, 2*time.Second)
	if err != nil {
		t.Fatalf("libvirtd socket %s: %v\n%s", libvirtSock, err, testhostHint)
	}
	c.Close()
}

// sshd is an OpenSSH server run for one test.
type sshd struct {
	addr    string        // 127.0.0.1:port
	dir     string        // its files
	user    string        // who logs in
	keyFile string        // the client's private key
	hostKey ssh.PublicKey // the server's host key
	log     string
}

// startSSHD runs /usr/sbin/sshd -D on a free loopback port with a fresh
// host key and client key, until the test ends.
func startSSHD(t *testing.T) *sshd {
	t.Helper()
	requireHost(t)
	dir := t.TempDir()
	s := &sshd{dir: dir, log: filepath.Join(dir, "sshd.log")}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	s.user = u.Username

	hostPriv := writeKey(t, filepath.Join(dir, "host_ed25519"))
	s.hostKey = hostPriv.PublicKey()
	clientPriv := writeKey(t, filepath.Join(dir, "client_ed25519"))
	s.keyFile = filepath.Join(dir, "client_ed25519")
	writeFile(t, filepath.Join(dir, "authorized_keys"), string(ssh.MarshalAuthorizedKey(clientPriv.PublicKey())))

	s.addr = freeAddr(t)
	conf := strings.Join([]string{
		"ListenAddress " + s.addr,
		"HostKey " + filepath.Join(dir, "host_ed25519"),
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"StrictModes no",
		"UsePAM no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PubkeyAuthentication yes",
		"PermitRootLogin prohibit-password",
		"AllowStreamLocalForwarding yes",
		"X11Forwarding no",
		"LogLevel VERBOSE",
		"",
	}, "\n")
	writeFile(t, filepath.Join(dir, "sshd_config"), conf)
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("mkdir /run/sshd: %v", err)
	}

	// In a mount namespace of its own where root's shell rc files read as
	// empty, as the test host's sshd (deploy/testhost/up.sh): the
	// sessions the direct upload runs must not run this machine's shell
	// set-up (its pyenv init waited 60 s on a stale lock, and every
	// upload stalled).
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", maskRCFiles+` exec "$0" "$@"`,
		sshdPath, "-D", "-f", filepath.Join(dir, "sshd_config"), "-E", s.log)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sshd: %v\n%s", err, testhostHint)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("sshd log:\n%s", s.readLog())
		}
	})
	var dialErr error
	if !poll.Wait(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			c.Close()
			return true
		}
		dialErr = err
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("sshd exited at start: %v\n%s", err, s.readLog())
		default:
		}
		return false
	}) {
		t.Fatalf("sshd not accepting on %s: %v\n%s", s.addr, dialErr, s.readLog())
	}
	return s
}

func (s *sshd) readLog() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// knownHosts writes a known_hosts file that lists key for every address
// and returns its path.
func (s *sshd) knownHosts(t *testing.T, key ssh.PublicKey, addrs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, a := range addrs {
		b.WriteString(knownhosts.Line([]string{knownhosts.Normalize(a)}, key) + "\n")
	}
	f, err := os.CreateTemp(s.dir, "known_hosts")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// sshConfig is how to reach this sshd at addr (its own, or a proxy's in
// front of it), with known_hosts holding its key for addr.
func (s *sshd) sshConfig(t *testing.T, addr string) SSHConfig {
	return SSHConfig{
		Host:              "testhost",
		Address:           addr,
		User:              s.user,
		KeyFile:           s.keyFile,
		KnownHostsFile:    s.knownHosts(t, s.hostKey, addr),
		Socket:            libvirtSock,
		ConnectTimeout:    5 * time.Second,
		KeepaliveInterval: -1,
	}
}

// proxy starts a fault proxy in front of the sshd.
func (s *sshd) proxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(faultproxy.Config{Target: s.addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// newTestLink makes a link that is closed when the test ends.
func newTestLink(t *testing.T, cfg LinkConfig) *Link {
	t.Helper()
	k, err := NewLink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("close link: %v", err)
		}
	})
	return k
}

// current is the link's live shared conn, dialing one if needed.
func (k *Link) current(t *testing.T) *conn {
	t.Helper()
	c, err := k.get(context.Background())
	if err != nil {
		t.Fatalf("link: %v", err)
	}
	return c
}

func writeKey(t *testing.T, path string) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
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

// within fails the test unless f returns within d; it returns f's result.
func within[T any](t *testing.T, d time.Duration, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s did not return within %s", what, d)
		panic("unreachable")
	}
}

// errorsIs is errors.Is with a message for t.
func mustBe(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s = %v, want errors.Is %v", what, err, target)
	}
}

// testhostEnv reads the project test host's settings: from the environment
// (deploy/gotest.sh sources .testhost/env), else from .testhost/env at the
// repository root, which `make testhost` writes.
func testhostEnv(t *testing.T) map[string]string {
	t.Helper()
	keys := []string{"TESTHOST_SSH_ADDR", "TESTHOST_SSH_USER", "TESTHOST_SSH_KEY", "TESTHOST_KNOWN_HOSTS"}
	env := map[string]string{}
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			env[k] = v
		}
	}
	if len(env) < len(keys) {
		b, err := os.ReadFile(filepath.Join("..", ".testhost", "env"))
		if err != nil {
			t.Fatalf("test host settings: %v in the environment and no .testhost/env (%v)\n%s", keys, err, testhostHint)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimPrefix(strings.TrimSpace(line), "export ")
			k, v, ok := strings.Cut(line, "=")
			if ok && env[k] == "" {
				env[k] = strings.Trim(v, `'"`)
			}
		}
	}
	for _, k := range keys {
		if env[k] == "" {
			t.Fatalf("test host setting %s missing\n%s", k, testhostHint)
		}
	}
	return env
}

// maskRCFiles bind-mounts /dev/null over root's shell rc files (in the
// mount namespace the script runs in).
const maskRCFiles = `home=$(getent passwd root | cut -d: -f6)
for f in .bashrc .bash_profile .bash_login .profile; do
	[ -f "$home/$f" ] && mount --bind /dev/null "$home/$f"
done
`
