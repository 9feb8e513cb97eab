package kvm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	"proxyfleet/fleet"
)

func otherKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A host whose key does not match known_hosts, or is not in it, is refused
// with a permanent error naming the host entry and its address, and a link
// to it fails its calls permanent too.
func TestDialSSH_hostKeyRefusedIsPermanent(t *testing.T) {
	s := startSSHD(t)
	for _, tc := range []struct {
		name       string
		knownHosts func() string
		want       string
	}{
		{"mismatch", func() string { return s.knownHosts(t, otherKey(t), s.addr) }, "does not match"},
		{"unknown host", func() string { return s.knownHosts(t, s.hostKey, "127.0.0.2:22") }, "unknown to"},
		{"empty known_hosts", func() string {
			p := filepath.Join(t.TempDir(), "known_hosts")
			writeFile(t, p, "")
			return p
		}, "unknown to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := s.sshConfig(t, s.addr)
			cfg.KnownHostsFile = tc.knownHosts()
			c, err := DialSSH(context.Background(), cfg)
			if err == nil {
				c.Close()
				t.Fatal("DialSSH accepted a host key that known_hosts does not hold")
			}
			t.Logf("%v", err)
			if fleet.ClassOf(err) != fleet.ClassPermanent {
				t.Fatalf("class %q, want permanent", fleet.ClassOf(err))
			}
			mustBe(t, err, ErrHostKey, "host key refusal")
			for _, w := range []string{"testhost", s.addr, tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not say %q", err, w)
				}
			}

			k := newTestLink(t, LinkConfig{SSH: cfg})
			// The second call comes inside the redial backoff: it gets
			// the refusal again, permanent, not a transient "link down"
			// that would cost the caller its retries.
			for _, which := range []string{"first", "second"} {
				err = k.call(context.Background(), time.Second, version)
				if fleet.ClassOf(err) != fleet.ClassPermanent || !errors.Is(err, ErrHostKey) {
					t.Fatalf("%s call on a link to a refused host = %v (class %q), want permanent ErrHostKey", which, err, fleet.ClassOf(err))
				}
			}
		})
	}
}

// A host that refuses our key (or offers no public key login) is a
// permanent error saying who was refused by whom, with which key; a link to
// it fails its calls permanent, inside its redial backoff too.
func TestDialSSH_loginRefusedIsPermanent(t *testing.T) {
	s := startSSHD(t)
	cfg := s.sshConfig(t, s.addr)
	cfg.KeyFile = filepath.Join(t.TempDir(), "stranger_ed25519")
	writeKey(t, cfg.KeyFile)
	c, err := DialSSH(context.Background(), cfg)
	if err == nil {
		c.Close()
		t.Fatal("DialSSH logged in with a key the host does not hold")
	}
	t.Logf("%v", err)
	if fleet.ClassOf(err) != fleet.ClassPermanent {
		t.Fatalf("class %q, want permanent", fleet.ClassOf(err))
	}
	mustBe(t, err, ErrAuthRefused, "login refusal")
	for _, w := range []string{"testhost", s.addr, "refused login as " + s.user, cfg.KeyFile} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
	k := newTestLink(t, LinkConfig{SSH: cfg})
	for _, which := range []string{"first", "second"} {
		err = k.call(context.Background(), time.Second, version)
		if fleet.ClassOf(err) != fleet.ClassPermanent || !errors.Is(err, ErrAuthRefused) {
			t.Fatalf("%s call on a link whose login is refused = %v (class %q), want permanent ErrAuthRefused", which, err, fleet.ClassOf(err))
		}
	}
}

func TestDialSSH_roundTripAndClose(t *testing.T) {
	s := startSSHD(t)
	c, err := DialSSH(context.Background(), s.sshConfig(t, s.addr))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
		t.Fatalf("fresh connection is done: %v", c.Err())
	default:
	}
	l := libvirt.NewWithDialer(&onceDialer{t: c})
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	if err := version(l); err != nil {
		t.Fatal(err)
	}
	if err := l.Disconnect(); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("connection not done after Disconnect closed it")
	}
	mustBe(t, c.Err(), errSSHClosed, "reason")
	if err := c.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
}

// TCP connect, handshake and forward run under one deadline: a host that
// accepts TCP and then says nothing fails the dial at ConnectTimeout,
// transient; a cancelled ctx fails it at once.
func TestDialSSH_oneDeadlineForHandshake(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	p.Stall()
	cfg := s.sshConfig(t, p.Addr())
	cfg.ConnectTimeout = 500 * time.Millisecond
	start := time.Now()
	_, err := DialSSH(context.Background(), cfg)
	took := time.Since(start)
	t.Logf("stalled handshake: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("stalled handshake = %v (class %q), want transient", err, fleet.ClassOf(err))
	}
	if took > 3*time.Second {
		t.Fatalf("stalled handshake took %s, want about 500ms", took)
	}

	cfg.ConnectTimeout = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start = time.Now()
	_, err = DialSSH(ctx, cfg)
	took = time.Since(start)
	if fleet.ClassOf(err) != fleet.ClassTransient || took > 3*time.Second {
		t.Fatalf("cancelled handshake = %v after %s, want transient at once", err, took)
	}
}

// Closing the connection while a writer is stalled on a network that
// stopped moving bytes returns at once and releases the writer: Close
// closes the TCP socket, not the channel behind the writer.
func TestSSHConn_closeDuringStalledWrite(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	c, err := DialSSH(context.Background(), s.sshConfig(t, p.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
	}()
	select {
	case err := <-wrote:
		t.Fatalf("write ended before the close: %v", err)
	case <-time.After(500 * time.Millisecond): // the writer is stalled by now
	}
	within(t, time.Second, "Close during a stalled write", func() error { return c.Close() })
	err = within(t, 2*time.Second, "the stalled writer", func() error { return <-wrote })
	if err == nil {
		t.Fatal("stalled write ended without an error")
	}
}

func TestDialSSH_configErrorsArePermanent(t *testing.T) {
	s := startSSHD(t)
	for _, tc := range []struct {
		name string
		edit func(*SSHConfig)
	}{
		{"missing key file", func(c *SSHConfig) { c.KeyFile = filepath.Join(t.TempDir(), "none") }},
		{"missing known_hosts", func(c *SSHConfig) { c.KnownHostsFile = filepath.Join(t.TempDir(), "none") }},
		{"no known_hosts configured", func(c *SSHConfig) { c.KnownHostsFile = "" }},
		{"key not authorized", func(c *SSHConfig) {
			p := filepath.Join(t.TempDir(), "other_key")
			writeKey(t, p)
			c.KeyFile = p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := s.sshConfig(t, s.addr)
			tc.edit(&cfg)
			_, err := DialSSH(context.Background(), cfg)
			if fleet.ClassOf(err) != fleet.ClassPermanent {
				t.Fatalf("DialSSH = %v (class %q), want permanent", err, fleet.ClassOf(err))
			}
			if !strings.Contains(err.Error(), "testhost") {
				t.Fatalf("error %q does not name the host", err)
			}
		})
	}
}
