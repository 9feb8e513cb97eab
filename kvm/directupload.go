package kvm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"
	"libvirt.org/go/libvirtxml"
)

// The direct upload into a directory pool.
//
// libvirt's stream protocol moves StorageVolUpload's bytes slower than SSH
// itself does (BENCHMARKS.md, upload_vs_virsh; docs/DECISIONS.md). So when
// the volume is a file in a pool of type dir, and the link reaches the host over SSH
// (LinkConfig.Dial unset), the bytes go over a dedicated SSH client of the
// transfer's own instead: the volume is still claimed with
// StorageVolCreateXML (the race between uploaders, image.go), then one
// session runs a shell on the host that writes its stdin into a hidden
// temporary file next to the volume (".<volume>.tmp-<random>"), while we
// count and hash what we send. Once the host has the whole length and the
// sha256 matched, a second session renames the temporary file over the
// volume's file, atomically; the mark is then made as for a stream
// (imagemark.go: mark refreshes the pool first).
//
// The temporary file goes with every failure: the host's shell removes it
// itself when it got fewer bytes than announced (a source that failed, a
// cut connection, a hang-up), we remove it after a digest that did not
// match or a failed rename, and, when the client died after the whole file
// was written, a fresh SSH connection removes it (best effort: an
// unreachable host keeps it; the next upload of that volume does not
// reuse it). Nothing else is touched: the volume itself is discarded as
// after a failed stream.
//
// While the bytes go to the temporary file, the volume's file would not
// change, and waiters in other processes would take a live upload for a
// dead one (image.go, single flight). So the volume's mtime is touched
// every quarter of the stale window while the send lasts.
//
// The renamed file is the SSH user's, mode 0600 (umask 077), where
// libvirtd's own volume was root's: with the root login the tests and the
// test host use, the same; with another user, libvirt's DAC driver labels
// the image for qemu when a domain starts, as it does any volume.
//
// A host whose shell cannot create the temporary file (no write permission
// in the pool's directory for the SSH user, no POSIX shell), or does not
// see the volume libvirtd has just made (the pool is on a mount in
// libvirtd's own mount namespace), refuses before any byte is read: the
// upload then goes through the libvirt stream, into the same claimed
// volume.

// errNoDirect says the host refused a direct upload before any byte moved:
// use the stream.
var errNoDirect = errors.New("direct upload refused by the host")

// directTarget is where a direct upload writes: the pool's directory and
// the volume's file name in it.
type directTarget struct {
	dir, file string
}

// copyBuffer is the size of the direct upload's reads and writes.
const copyBuffer = 1 << 20

// chooseDirect says whether a volume at volPath of a pool described by
// poolXML takes a direct upload, and where; nil with the reason if not.
func chooseDirect(poolXML, volPath string) (*directTarget, string) {
	var def libvirtxml.StoragePool
	if err := def.Unmarshal(poolXML); err != nil {
		return nil, fmt.Sprintf("pool xml: %v", err)
	}
	if def.Type != "dir" {
		return nil, fmt.Sprintf("pool type %q is not dir", def.Type)
	}
	if def.Target == nil || !filepath.IsAbs(def.Target.Path) {
		return nil, "pool has no absolute target path"
	}
	dir := filepath.Clean(def.Target.Path)
	if !filepath.IsAbs(volPath) || filepath.Dir(volPath) != dir {
		return nil, fmt.Sprintf("volume path %q is not a file of the pool's directory %s", volPath, dir)
	}
	return &directTarget{dir: dir, file: filepath.Base(volPath)}, ""
}

// directTarget reads the pool and a's volume, and says where a direct
// upload of a goes, or nil (with the reason) for the stream.
func (c *imageCache) directTarget(ctx context.Context, a artifact) (*directTarget, string, error) {
	if c.streamOnly {
		return nil, "stream only (tests)", nil
	}
	if c.link.cfg.Dial != nil {
		return nil, "the link does not dial SSH itself", nil
	}
	var poolXML, volPath string
	err := c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		if poolXML, err = l.StoragePoolGetXMLDesc(pool, 0); err != nil {
			return fmt.Errorf("pool %s xml: %w", c.pool, err)
		}
		vol, err := l.StorageVolLookupByName(pool, a.name)
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", a.name, err)
		}
		if volPath, err = l.StorageVolGetPath(vol); err != nil {
			return fmt.Errorf("volume %s path: %w", a.name, err)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("image cache %s: %w", c.host, err)
	}
	t, why := chooseDirect(poolXML, volPath)
	return t, why, nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sendScript writes stdin into tmp, next to vol in dir, and keeps it only
// if it got exactly size bytes. It says "ready" once tmp is made, before
// it reads a byte; before that, it exits 3 for "cannot" (the caller uses
// the stream instead) or 4 for "no volume file here" (taken over, or a
// filesystem libvirtd sees and the shell does not: the stream too).
func sendScript(t directTarget, tmp string, size int64) string {
	return fmt.Sprintf(`umask 077
cd -- %[1]s || exit 3
[ -f %[2]s ] || exit 4
t=%[3]s
trap 'rm -f -- "$t"; exit 6' HUP INT TERM PIPE
( set -C; : > "$t" ) || exit 3
echo ready
cat > "$t" || { rm -f -- "$t"; exit 5; }
[ "$(wc -c < "$t")" -eq %[4]d ] || { rm -f -- "$t"; exit 5; }
`, shellQuote(t.dir), shellQuote(t.file), shellQuote(tmp), size)
}

// commitScript renames tmp over the volume's file if the volume is still
// there and tmp has size bytes; else it removes tmp.
func commitScript(t directTarget, tmp string, size int64) string {
	return fmt.Sprintf(`cd -- %[1]s && [ -f %[2]s ] && [ "$(wc -c < %[3]s)" -eq %[4]d ] && mv -f -- %[3]s %[2]s || { rm -f -- %[3]s; exit 7; }
`, shellQuote(t.dir), shellQuote(t.file), shellQuote(tmp), size)
}

func removeScript(t directTarget, tmp string) string {
	return fmt.Sprintf("rm -f -- %s\n", shellQuote(filepath.Join(t.dir, tmp)))
}

func tempName(t directTarget) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "." + t.file + ".tmp-" + hex.EncodeToString(b[:])
}

// direct is one direct upload: the temporary file's name, and whether it
// may be left on the host (the caller removes it then).
type direct struct {
	t     directTarget
	tmp   string
	size  int64
	every time.Duration // how often the volume's mtime is touched
	// verify checks what was sent (length, sha256) once the host has it
	// all; its error fails the upload as it is.
	verify func() error

	mu   sync.Mutex
	left bool // the temporary file may be on the host
}

func (d *direct) setLeft(v bool) {
	d.mu.Lock()
	d.left = v
	d.mu.Unlock()
}

// mayBeLeft reports whether the temporary file may still be on the host.
func (d *direct) mayBeLeft() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.left
}

// run is the transfer's fn: send, verify, rename. It runs in a goroutine
// of the link's, under the transfer watchdog, which kills cl on a stall.
func (d *direct) run(cl *ssh.Client, r io.Reader) error {
	sess, err := cl.NewSession()
	if err != nil {
		return fmt.Errorf("%w: open session: %w", errNoDirect, err)
	}
	defer sess.Close()
	stdin, err := sess.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return err
	}
	stderr := &limitedBuffer{max: 4096}
	sess.Stderr = stderr
	if err := sess.Start(sendScript(d.t, d.tmp, d.size)); err != nil {
		return fmt.Errorf("%w: start: %w", errNoDirect, err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keeps the volume looking alive to waiters; ends with stop
		defer wg.Done()
		d.touch(cl, stop)
	}()
	defer func() { close(stop); wg.Wait() }()
	line, rerr := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		werr := sess.Wait()
		var exit *ssh.ExitError
		if errors.As(werr, &exit) {
			// The shell said no before it read a byte: nothing was
			// made, and the stream can do it. That includes exit 4, a
			// volume libvirtd has just made that the shell does not
			// see: sshd and libvirtd need not share a view of the
			// filesystem (a pool on a mount made in libvirtd's own
			// mount namespace, as systemd's sandboxing or `ip netns
			// exec` give it), and only the stream writes where
			// libvirtd reads. (If another process took the volume
			// over meanwhile, the stream's lookup fails as it should.)
			return fmt.Errorf("%w: %w: %s", errNoDirect, werr, strings.TrimSpace(stderr.String()))
		}
		return fmt.Errorf("direct upload: waiting for the host's shell: %w", errors.Join(rerr, werr))
	}
	d.setLeft(true)
	sent, srcErr, sendErr := d.send(stdin, r)
	// On a short send, the closed stdin makes the host's shell remove
	// the temporary file before it exits.
	_ = stdin.Close()
	waitErr := sess.Wait()
	var exit *ssh.ExitError
	if errors.As(waitErr, &exit) {
		d.setLeft(false) // the shell removed it, or never kept it
	}
	if srcErr != nil {
		return fmt.Errorf("download: %w", srcErr)
	}
	if sendErr != nil {
		return fmt.Errorf("direct upload: send after %d bytes: %w (%w)", sent, sendErr, errors.Join(waitErr, errors.New(strings.TrimSpace(stderr.String()))))
	}
	if err := d.verify(); err != nil {
		if waitErr == nil { // the file is whole, and wrong
			if rmErr := runSession(cl, removeScript(d.t, d.tmp)); rmErr == nil {
				d.setLeft(false)
			}
		}
		return err
	}
	if waitErr != nil {
		return fmt.Errorf("direct upload: host's shell: %w: %s", waitErr, strings.TrimSpace(stderr.String()))
	}
	if err := runSession(cl, commitScript(d.t, d.tmp, d.size)); err != nil {
		var exit *ssh.ExitError
		if errors.As(err, &exit) {
			d.setLeft(false) // the script removed it
		}
		return fmt.Errorf("direct upload: rename %s over %s: %w", d.tmp, d.t.file, err)
	}
	d.setLeft(false)
	return nil
}

// send copies r to w in pieces of up to copyBuffer bytes; a read error is
// the source's.
func (d *direct) send(w io.Writer, r io.Reader) (n int64, srcErr, sendErr error) {
	buf := make([]byte, copyBuffer)
	for {
		k, err := 0, error(nil)
		for k < len(buf) && err == nil {
			var m int
			m, err = r.Read(buf[k:])
			k += m
		}
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n, nil, werr
			}
			n += int64(k)
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// touch sets the volume's mtime every d.every until stop is closed (a
// failed touch is retried on the next tick: the send's own errors are what
// fail the upload).
func (d *direct) touch(cl *ssh.Client, stop <-chan struct{}) {
	t := time.NewTicker(d.every)
	defer t.Stop()
	cmd := "touch -c -- " + shellQuote(filepath.Join(d.t.dir, d.t.file))
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = runSession(cl, cmd)
		}
	}
}

// runSession runs cmd in a new session of cl.
func runSession(cl *ssh.Client, cmd string) error {
	sess, err := cl.NewSession()
	if err != nil {
		return err
	}
	defer sess.Close()
	stderr := &limitedBuffer{max: 4096}
	sess.Stderr = stderr
	if err := sess.Run(cmd); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// removeLeft removes a temporary file that a failed direct upload may have
// left, over a fresh SSH connection within the call budget (its own
// client was killed). Best effort: it logs nothing and returns the error.
func (c *imageCache) removeLeft(ctx context.Context, d *direct) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.link.cfg.Budgets.Call)
	defer cancel()
	cl, err := dialSSHClient(ctx, c.link.cfg.SSH)
	if err != nil {
		return err
	}
	defer cl.Close()
	done := make(chan error, 1)
	go func() { done <- runSession(cl, removeScript(d.t, d.tmp)) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cl.Close()
		<-done
		err = ctx.Err()
	}
	return err
}

// sshTransfer is transfer for a direct upload: fn gets a dedicated SSH
// client (nothing forwarded on it) and src under the same no-progress
// watchdog, which closes the client and src on a stall, a done ctx or the
// link's Close. The client is closed before sshTransfer returns.
func (k *Link) sshTransfer(ctx context.Context, src io.Reader, fn func(cl *ssh.Client, r io.Reader) error) error {
	leave, err := k.enterTransfer(ctx)
	if err != nil {
		return err
	}
	defer leave()
	dialCtx, cancel := context.WithTimeout(ctx, k.cfg.Budgets.Connect)
	stop := context.AfterFunc(k.ctx, cancel)
	cl, err := dialSSHClient(dialCtx, k.cfg.SSH)
	stop()
	cancel()
	if err != nil {
		return fmt.Errorf("transfer link: %w", err)
	}
	c := &conn{host: k.name, dead: make(chan struct{}), kill: func() { _ = cl.Close() }, obs: k.cfg.Observer}
	drop, err := k.holdDedicated(c, 1) // and the waiter below
	if err != nil {
		return err
	}
	go func() { // ends once the client is closed, which every path does
		defer k.wg.Done()
		if err := cl.Wait(); err != nil {
			c.markDead(fmt.Errorf("ssh connection ended: %w", err))
		}
		c.markDead(errors.New("ssh connection ended"))
	}()
	defer func() {
		c.markDead(ErrLinkClosed)
		drop()
	}()
	return k.watch(ctx, c, src, func(r io.Reader) error { return fn(cl, r) },
		func(err error) error {
			c.markDead(err)
			return fmt.Errorf("transfer: %w", err)
		},
		func() { c.markDead(ErrLinkClosed) })
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
