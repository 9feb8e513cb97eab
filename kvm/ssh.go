package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"golang.org/x/sys/cpu"

	"proxyfleet/fleet"
)

// SSHConfig says how to reach one host's libvirt socket over SSH.
type SSHConfig struct {
	// Host is the host entry's name; every error names it.
	Host string
	// Address is host:port of the host's sshd.
	Address string
	// User logs in with the private key in KeyFile.
	User    string
	KeyFile string
	// KnownHostsFile is an OpenSSH known_hosts file. The host's key must
	// be in it under Address (as OpenSSH writes it: "[host]:port" unless
	// the port is 22). There is no way to skip this check.
	KnownHostsFile string
	// Socket is the libvirt unix socket on the host; empty means
	// DefaultSocket.
	Socket string
	// ConnectTimeout bounds TCP connect, SSH handshake and the socket
	// forward together: one deadline for all three. 0 means
	// DefaultBudgets.Connect.
	ConnectTimeout time.Duration
	// KeepaliveInterval is how often a keepalive@openssh.com request is
	// sent; 0 means DefaultBudgets.Keepalive, a negative value disables
	// keepalives.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a keepalive may wait for its reply
	// before the client is killed; 0 means DefaultKeepaliveTimeout.
	KeepaliveTimeout time.Duration
	// Ciphers are the SSH ciphers offered, in order of preference; nil:
	// AES-GCM first on a CPU with AES instructions, else
	// ChaCha20-Poly1305 first.
	Ciphers []string
}

// aesGCMFirst and chachaFirst are the cipher preferences with and without
// AES instructions: AES-GCM is the fastest cipher where the CPU has them
// and the slowest, in software, where it has not. (x/crypto/ssh v0.59
// puts AES-GCM first whatever the CPU; this keeps that order on purpose.)
var (
	aesGCMFirst = []string{
		"aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
		"aes128-ctr", "aes192-ctr", "aes256-ctr",
	}
	chachaFirst = []string{
		"chacha20-poly1305@openssh.com", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
		"aes128-ctr", "aes192-ctr", "aes256-ctr",
	}
)

// ciphers is the cipher preference of the connection (see Ciphers).
func (c SSHConfig) ciphers() []string {
	if c.Ciphers != nil {
		return c.Ciphers
	}
	if cpu.X86.HasAES || cpu.ARM64.HasAES {
		return aesGCMFirst
	}
	return chachaFirst
}

func (c SSHConfig) withDefaults() SSHConfig {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = DefaultBudgets.Connect
	}
	if c.KeepaliveInterval == 0 {
		c.KeepaliveInterval = DefaultBudgets.Keepalive
	}
	if c.KeepaliveTimeout <= 0 {
		c.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	return c
}

// name is how errors name the host: entry name and address.
func (c SSHConfig) name() string {
	if c.Host == "" {
		return c.Address
	}
	return c.Host + " (" + c.Address + ")"
}

// ErrHostKey is matched by errors.Is on every host key refusal: the host is
// unknown to the known_hosts file, or its key does not match. Such an error
// is permanent: only an operator can fix it.
var ErrHostKey = errors.New("ssh host key refused")

// ErrAuthRefused is matched by errors.Is when the host refused our login:
// it did not accept the configured key for the configured user, or offers
// no public key login at all. Such an error is permanent: only an operator
// can fix it.
var ErrAuthRefused = errors.New("ssh login refused")

// ErrKeepalive is the reason recorded when a keepalive got no reply in time.
var ErrKeepalive = errors.New("ssh keepalive timed out")

// errSSHClosed is the reason recorded when the connection was closed by its
// owner.
var errSSHClosed = errors.New("ssh connection closed")

// SSHConn is the host's libvirt socket, forwarded over an SSH client that the
// SSHConn owns. Reads and writes go to the forwarded channel.
//
// Close closes the SSH client, that is its TCP socket, and never the
// forwarded channel first. Closing an SSH channel writes a close message
// under the channel's write mutex; a writer stalled on a vanished host holds
// that mutex until the kernel gives up retransmitting (about 15 minutes).
// Closing the TCP socket takes no lock and unblocks that writer at once.
// A channel close added here "for tidiness" would bring that stall back
// (TestSSHConn_closeDuringStalledWrite).
type SSHConn struct {
	net.Conn // the forwarded channel

	client *ssh.Client
	done   chan struct{} // closed when the connection ended, for any reason

	mu  sync.Mutex
	err error // why it ended; set before done is closed

	// keepaliveReplies counts the keepalives answered. Only tests read
	// it: that a healthy link stays up is shown by keepalives answered
	// for longer than their timeout, not by waiting a guessed time.
	keepaliveReplies atomic.Int64
}

// Close closes the SSH client's TCP socket. It does not block on the
// forwarded channel and is safe to call more than once and concurrently.
func (c *SSHConn) Close() error {
	first := c.end(errSSHClosed)
	err := c.client.Close() // idempotent; the TCP socket, never the channel
	if !first || errors.Is(err, net.ErrClosed) {
		// Already closed, by us or because the transport failed: the
		// connection is down, which is all Close promises.
		return nil
	}
	return err
}

// Done is closed once the connection has ended: closed, killed by a
// keepalive, or dropped by the peer or the network.
func (c *SSHConn) Done() <-chan struct{} { return c.done }

// Err says why the connection ended, or nil while it is up.
func (c *SSHConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// end records the reason and signals done, once; it reports whether this
// call was the one. It does not close the client.
func (c *SSHConn) end(reason error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.err = reason
	close(c.done)
	return true
}

// kill ends the connection for reason and closes the client.
func (c *SSHConn) kill(reason error) {
	c.end(reason)
	_ = c.client.Close()
}

// DialSSH connects to cfg.Address, verifies the host key against
// cfg.KnownHostsFile, logs in with cfg.KeyFile and forwards to the libvirt
// socket, all under one deadline (cfg.ConnectTimeout, or ctx's if sooner).
// Every failure closes what was opened. Errors are classed: a host key
// refusal, an unreadable key file or known_hosts file, and a refused login
// are permanent; network failures and timeouts are transient.
func DialSSH(ctx context.Context, cfg SSHConfig) (*SSHConn, error) {
	cfg = cfg.withDefaults()
	c, err := dialSSH(ctx, cfg)
	if err != nil {
		return nil, Classify(fmt.Errorf("ssh %s: %w", cfg.name(), err))
	}
	return c, nil
}

func dialSSH(ctx context.Context, cfg SSHConfig) (*SSHConn, error) {
	client, conn, stop, err := dialClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ch, err := client.Dial("unix", cfg.Socket)
	if err != nil {
		stop()
		client.Close()
		return nil, fmt.Errorf("forward to %s: %w", cfg.Socket, err)
	}
	if err := finishDial(ctx, client, conn, stop); err != nil {
		return nil, err
	}
	c := &SSHConn{Conn: ch, client: client, done: make(chan struct{})}
	go c.watch()
	if cfg.KeepaliveInterval > 0 {
		go c.keepalive(cfg.KeepaliveInterval, cfg.KeepaliveTimeout)
	}
	return c, nil
}

// dialSSHClient connects and logs in as DialSSH does, under the same
// deadline, and returns the SSH client itself, for sessions (a direct
// upload, directupload.go); it forwards nothing and sends no keepalives.
// The caller closes the client.
func dialSSHClient(ctx context.Context, cfg SSHConfig) (*ssh.Client, error) {
	cfg = cfg.withDefaults()
	client, conn, stop, err := dialClient(ctx, cfg)
	if err == nil {
		err = finishDial(ctx, client, conn, stop)
	}
	if err != nil {
		return nil, Classify(fmt.Errorf("ssh %s: %w", cfg.name(), err))
	}
	return client, nil
}

// dialClient connects to cfg.Address, verifies the host key and logs in,
// under one deadline (cfg.ConnectTimeout, or ctx's if sooner) that stays set
// on conn, and a cancelled ctx moves into the past, until finishDial.
func dialClient(ctx context.Context, cfg SSHConfig) (client *ssh.Client, conn net.Conn, stop func() bool, err error) {
	signer, err := readKey(cfg.KeyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	hostKeys, algos, err := hostKeyCheck(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	clientCfg := &ssh.ClientConfig{
		Config:            ssh.Config{Ciphers: cfg.ciphers()},
		User:              cfg.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		AuthCallback:      refusedLogin(cfg, signer),
		HostKeyCallback:   hostKeys,
		HostKeyAlgorithms: algos,
		// No Timeout: it only applies to ssh.Dial; the deadline
		// below covers connect, handshake and forward together.
	}

	deadline := time.Now().Add(cfg.ConnectTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	d := net.Dialer{Deadline: deadline}
	// nc, not the named result conn: the AfterFunc below may read it
	// while a failed return writes conn (a data race, seen by -race).
	nc, err := d.DialContext(ctx, "tcp", cfg.Address)
	if err != nil {
		return nil, nil, nil, err
	}
	// One deadline for handshake and forward; a cancelled ctx moves it
	// to the past, which fails whatever is blocked on the socket.
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })

	sc, chans, reqs, err := ssh.NewClientConn(nc, cfg.Address, clientCfg)
	if err != nil {
		stop()
		nc.Close() // NewClientConn closes it too; closing twice is harmless
		return nil, nil, nil, err
	}
	return ssh.NewClient(sc, chans, reqs), nc, stop, nil
}

// finishDial clears the dial's deadline, or closes the client if ctx
// ended meanwhile.
func finishDial(ctx context.Context, client *ssh.Client, conn net.Conn, stop func() bool) error {
	if !stop() {
		// ctx ended while we were finishing: the deadline may be in
		// the past already.
		client.Close()
		return context.Cause(ctx)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		client.Close()
		return err
	}
	return nil
}

// watch records the end of a connection that the peer or the network ended.
// It returns once the client's transport is gone, which Close guarantees.
func (c *SSHConn) watch() {
	err := c.client.Wait()
	if err == nil {
		err = errors.New("ssh connection ended")
	}
	c.end(err)
}

// keepalive sends keepalive@openssh.com every interval; a request without a
// reply within timeout kills the client. It returns once the connection
// has ended and its last request has returned.
func (c *SSHConn) keepalive(interval, timeout time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		reply := make(chan error, 1)
		go func() {
			_, _, err := c.client.SendRequest("keepalive@openssh.com", true, nil)
			reply <- err
		}()
		timer := time.NewTimer(timeout)
		select {
		case err := <-reply:
			timer.Stop()
			if err != nil {
				c.kill(fmt.Errorf("%w: %v", ErrKeepalive, err))
				return
			}
			c.keepaliveReplies.Add(1)
		case <-timer.C:
			c.kill(fmt.Errorf("%w: no reply within %s", ErrKeepalive, timeout))
			<-reply // the client is closed, so the request returns
			return
		case <-c.done:
			timer.Stop()
			<-reply
			return
		}
	}
}

// refusedLogin ends the handshake with a permanent ErrAuthRefused, naming
// the user, the host and the key, once the host has refused the key or
// offers no public key login. (Without it the library's own error says
// neither who was refused nor by whom, and carries no type to classify.)
func refusedLogin(cfg SSHConfig, signer ssh.Signer) ssh.ClientAuthCallback {
	return func(c *ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		const pk = "publickey"
		tried, offered := slices.Contains(c.TriedMethods, pk), slices.Contains(c.AllowedMethods, pk)
		if !tried && offered {
			return nil, nil // try the key (ClientConfig.Auth)
		}
		why := fmt.Sprintf("the key in %s (%s %s) was not accepted", cfg.KeyFile,
			signer.PublicKey().Type(), ssh.FingerprintSHA256(signer.PublicKey()))
		if !offered {
			why = fmt.Sprintf("it offers no public key login (methods %v)", c.AllowedMethods)
		}
		return nil, fleet.Permanent(fmt.Errorf("%w: host %s refused login as %s: %s",
			ErrAuthRefused, cfg.name(), cfg.User, why))
	}
}

func readKey(file string) (ssh.Signer, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fleet.Permanent(fmt.Errorf("read key file: %w", err))
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, fleet.Permanent(fmt.Errorf("parse key file %s: %w", file, err))
	}
	return signer, nil
}

// hostKeyCheck builds the host key callback from the known_hosts file, and
// the host key algorithms to ask for: those of the keys known for the
// address, so a host with several keys presents one we can check.
func hostKeyCheck(cfg SSHConfig) (ssh.HostKeyCallback, []string, error) {
	if cfg.KnownHostsFile == "" {
		return nil, nil, fleet.Permanent(errors.New("no known_hosts file configured"))
	}
	kh, err := knownhosts.New(cfg.KnownHostsFile)
	if err != nil {
		return nil, nil, fleet.Permanent(fmt.Errorf("read known_hosts: %w", err))
	}
	cb := func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		err := kh(hostname, remote, key)
		if err == nil {
			return nil
		}
		var ke *knownhosts.KeyError
		what := "refused"
		if errors.As(err, &ke) {
			what = "is unknown to " + cfg.KnownHostsFile
			if len(ke.Want) > 0 {
				what = "does not match " + cfg.KnownHostsFile
			}
		}
		return fleet.Permanent(fmt.Errorf("%w: host %s presented %s %s, which %s: %w",
			ErrHostKey, cfg.name(), key.Type(), ssh.FingerprintSHA256(key), what, err))
	}
	return cb, knownAlgorithms(kh, cfg.Address), nil
}

// knownAlgorithms asks the known_hosts callback which keys it holds for
// address (by offering a key it cannot hold) and returns the host key
// algorithms for them, or nil (the library's default) if it holds none.
func knownAlgorithms(kh ssh.HostKeyCallback, address string) []string {
	probe := probeKey{}
	err := kh(address, &net.TCPAddr{IP: net.IPv4zero, Port: 22}, probe)
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) || len(ke.Want) == 0 {
		return nil
	}
	var algos []string
	seen := map[string]bool{}
	add := func(a ...string) {
		for _, s := range a {
			if !seen[s] {
				seen[s] = true
				algos = append(algos, s)
			}
		}
	}
	for _, k := range ke.Want {
		switch t := k.Key.Type(); t {
		case ssh.KeyAlgoRSA:
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			add(t)
		}
	}
	return algos
}

// probeKey is a public key no known_hosts line can hold.
type probeKey struct{}

func (probeKey) Type() string                        { return "proxyfleet-probe" }
func (probeKey) Marshal() []byte                     { return []byte("proxyfleet-probe") }
func (probeKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }
