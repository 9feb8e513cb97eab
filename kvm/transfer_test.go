package kvm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
)

// testPool makes a transient dir pool in a temp dir on the test host and
// removes it (and its volumes) when the test ends.
func testPool(t *testing.T, k *Link) (libvirt.StoragePool, string) {
	t.Helper()
	dir := t.TempDir()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	name := "pf-kvmtest-" + hex.EncodeToString(suffix[:])
	x, err := (&libvirtxml.StoragePool{
		Type:   "dir",
		Name:   name,
		Target: &libvirtxml.StoragePoolTarget{Path: dir},
	}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var pool libvirt.StoragePool
	if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		var err error
		pool, err = l.StoragePoolCreateXML(x, 0)
		return err
	}); err != nil {
		t.Fatalf("create pool %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
			vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
			if err != nil {
				return err
			}
			for _, v := range vols {
				// A volume whose upload was cut may be busy for a
				// moment, until libvirtd sees the stream's end: its
				// delete is tried again until it is gone (or for 5s;
				// the pool's directory goes with the test anyway).
				poll.WaitEvery(5*time.Second, 100*time.Millisecond, func() bool {
					return l.StorageVolDelete(v, 0) == nil
				})
			}
			return l.StoragePoolDestroy(pool)
		})
		if err != nil {
			t.Errorf("remove pool %s: %v", name, err)
		}
	})
	return pool, dir
}

func testVolume(t *testing.T, k *Link, pool libvirt.StoragePool, name string, size uint64) libvirt.StorageVol {
	t.Helper()
	x, err := (&libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: size},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var vol libvirt.StorageVol
	if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		var err error
		vol, err = l.StorageVolCreateXML(pool, x, 0)
		return err
	}); err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return vol
}

func upload(vol libvirt.StorageVol, size uint64) func(l *libvirt.Libvirt, r io.Reader) error {
	return func(l *libvirt.Libvirt, r io.Reader) error {
		return l.StorageVolUpload(vol, r, 0, size, 0)
	}
}

func (k *Link) dedicatedCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.dedicated)
}

// stallingSource yields n bytes and then blocks in Read until closed.
type stallingSource struct {
	left   int
	closed chan struct{}
	once   sync.Once
}

func newStallingSource(n int) *stallingSource {
	return &stallingSource{left: n, closed: make(chan struct{})}
}

func (s *stallingSource) Read(p []byte) (int, error) {
	if s.left > 0 {
		n := min(len(p), s.left)
		s.left -= n
		return n, nil
	}
	<-s.closed
	return 0, errors.New("source closed")
}

func (s *stallingSource) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

func (s *stallingSource) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

func TestTransfer_uploadsOnADedicatedLink(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, dir := testPool(t, k)
	shared := k.current(t)
	const size = 4 << 20
	vol := testVolume(t, k, pool, "up.raw", size)
	data := make([]byte, size)
	_, _ = rand.Read(data)

	start := time.Now()
	if err := k.transfer(context.Background(), bytes.NewReader(data), upload(vol, size)); err != nil {
		t.Fatalf("upload: %v", err)
	}
	t.Logf("uploaded %d MiB in %s", size>>20, time.Since(start))
	got, err := os.ReadFile(filepath.Join(dir, "up.raw"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("volume content differs from what was uploaded")
	}
	if n := k.dedicatedCount(); n != 0 {
		t.Fatalf("%d dedicated links left open", n)
	}
	if k.current(t) != shared || shared.isDead() {
		t.Fatal("the upload touched the shared link")
	}
}

// A source that stops delivering mid-upload is cut by the no-progress
// watchdog within the stall window: the dedicated link is killed, the source
// closed, the error transient. The shared link is untouched and answers.
//
// It also pins eofReader's reason (imageupload.go). Against go-libvirt
// v0.0.0-20260217163227-273eaa321819 (unbuffered stream channels) it fails:
// the cut makes requestStream block on `abort <- true` (rpc.go:300) while
// the stream sender, released by the closed source, blocks on
// `outErr <- err` (rpc.go:294), so StorageVolUpload never returns and the
// link's Close reports "goroutines still running after 5s". The stalled
// network test below fails the same way there.
func TestTransfer_stalledSourceIsCutAndSharedLinkAnswers(t *testing.T) {
	s := startSSHD(t)
	const stall = time.Second
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr), Budgets: Budgets{TransferStall: stall}})
	pool, _ := testPool(t, k)
	shared := k.current(t)
	const size = 8 << 20
	vol := testVolume(t, k, pool, "stall.raw", size)
	src := newStallingSource(1 << 20)
	t.Cleanup(func() { src.Close() })

	start := time.Now()
	err := k.transfer(context.Background(), src, upload(vol, size))
	took := time.Since(start)
	t.Logf("stalled upload: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("stalled upload = %v (class %q), want transient, link dead, stalled", err, fleet.ClassOf(err))
	}
	if took < stall || took > stall+4*time.Second {
		t.Fatalf("stalled upload cut after %s, want just past its %s stall window", took, stall)
	}
	if !src.isClosed() {
		t.Fatal("the watchdog did not close the stalled source")
	}
	if err := k.call(context.Background(), 2*time.Second, version); err != nil {
		t.Fatalf("shared link after a cut upload: %v", err)
	}
	if k.current(t) != shared || shared.isDead() {
		t.Fatal("a cut upload cost the shared link")
	}
}

// A network that stops moving bytes under an upload (no RST, no FIN) is cut
// by the watchdog too, and the shared link, on a healthy path, answers.
func TestTransfer_stalledNetworkIsCutAndSharedLinkAnswers(t *testing.T) {
	s := startSSHD(t)
	p := s.proxy(t)
	const stall = time.Second
	direct := s.sshConfig(t, s.addr)
	viaProxy := s.sshConfig(t, p.Addr())
	var useProxy atomic.Bool
	k := newTestLink(t, LinkConfig{
		SSH:     direct,
		Budgets: Budgets{TransferStall: stall},
		Dial: func(ctx context.Context) (net.Conn, error) {
			if useProxy.Load() {
				return DialSSH(ctx, viaProxy)
			}
			return DialSSH(ctx, direct)
		},
	})
	pool, _ := testPool(t, k)
	shared := k.current(t)
	const size = 256 << 20
	vol := testVolume(t, k, pool, "netstall.raw", size)

	useProxy.Store(true) // the transfer's dedicated link goes through the proxy
	src := &stallAfter{r: io.LimitReader(zeros{}, size), after: 8 << 20, stall: p.Stall}
	start := time.Now()
	err := k.transfer(context.Background(), src, upload(vol, size))
	took := time.Since(start)
	t.Logf("upload over a stalled network: %v after %s (%d bytes read)", err, took, src.n.Load())
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, ErrLinkDead) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("upload over a stalled network = %v (class %q), want transient, link dead, stalled", err, fleet.ClassOf(err))
	}
	if took > stall+5*time.Second {
		t.Fatalf("upload over a stalled network cut after %s, want within its %s stall window", took, stall)
	}
	if err := k.call(context.Background(), 2*time.Second, version); err != nil {
		t.Fatalf("shared link after a cut upload: %v", err)
	}
	if k.current(t) != shared || shared.isDead() {
		t.Fatal("a cut upload cost the shared link")
	}
	p.Reset() // let libvirtd see the cut stream's end, so the volume can go
}

// A source that fails mid-upload ends the upload promptly with the source's
// error and class, leaves no goroutine behind (goleak, TestMain), and the
// shared link answers, on the go-libvirt version go.mod pins.
func TestTransfer_sourceErrorEndsPromptly(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr), Budgets: Budgets{TransferStall: 10 * time.Second}})
	pool, _ := testPool(t, k)
	const size = 8 << 20
	vol := testVolume(t, k, pool, "srcerr.raw", size)
	srcErr := fleet.Transient(errors.New("mirror went away"))
	src := io.MultiReader(io.LimitReader(zeros{}, 1<<20), errReader{srcErr})
	start := time.Now()
	err := k.transfer(context.Background(), src, upload(vol, size))
	took := time.Since(start)
	t.Logf("upload with a failing source: %v after %s", err, took)
	if !errors.Is(err, srcErr) || fleet.ClassOf(err) != fleet.ClassTransient {
		t.Fatalf("upload with a failing source = %v (class %q), want the source's transient error", err, fleet.ClassOf(err))
	}
	if took > 3*time.Second {
		t.Fatalf("upload with a failing source took %s, want prompt", took)
	}
	if err := k.call(context.Background(), 2*time.Second, version); err != nil {
		t.Fatalf("shared link after a failed upload: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// stallAfter calls stall once after bytes have been read from r.
type stallAfter struct {
	r     io.Reader
	after int64
	stall func()
	n     atomic.Int64
	once  sync.Once
}

func (s *stallAfter) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if s.n.Add(int64(n)) >= s.after {
		s.once.Do(s.stall)
	}
	return n, err
}
