package kvm

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/cpu"

	"proxyfleet/fleet"
)

// The direct upload into a directory pool (directupload.go), against the
// real libvirtd through a real sshd; the pool's directory is on this
// machine, so the tests read it to see what landed and what was left.

// tempFiles lists the direct upload's temporary files in dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var tmp []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			tmp = append(tmp, e.Name())
		}
	}
	return tmp
}

// Into a dir pool, the bytes go over SSH into a temporary file renamed over
// the volume: the volume holds them, is marked, and nothing else is left.
func TestImage_directUploadIntoDirPool(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, dir := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 9<<20+7)
	c, tr := testCache(t, k, pool.Name, "h1")
	img := ImageSource{Name: "i", URL: u, SHA256: digest, Format: "raw"}
	vols, err := c.ensure(context.Background(), img)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if tr.count("direct") != 1 || tr.count("stream") != 0 {
		t.Fatalf("trace %s, want one direct upload and no stream", tr)
	}
	checkVolume(t, vols.Base, data)
	arts, _ := c.artifacts(img)
	st, err := c.inspect(context.Background(), arts[0])
	if err != nil || !st.ready {
		t.Fatalf("volume not ready after a direct upload: %+v, %v", st, err)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
	want := []string{vols.Base.Name, markName(arts[0])}
	slices.Sort(want)
	if got := poolVolumes(t, k, pool); !slices.Equal(got, want) {
		t.Fatalf("pool holds %v, want %v", got, want)
	}
	// Another cache finds it marked: nothing to upload.
	c2, tr2 := testCache(t, k, pool.Name, "h1")
	if _, err := c2.ensure(context.Background(), img); err != nil || tr2.count("upload") != 0 {
		t.Fatalf("second ensure: %v (%s), want the marked volume", err, tr2)
	}
}

// A source that fails mid-way ends the direct upload with a transient
// error; neither the temporary file nor the volume is left.
func TestImage_directSourceErrorLeavesNothing(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr), Budgets: Budgets{TransferStall: 10 * time.Second}})
	pool, dir := testPool(t, k)
	const size = 16 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(make([]byte, 5<<20))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the mirror drops the connection
	}))
	t.Cleanup(srv.Close)
	c, tr := testCache(t, k, pool.Name, "h1")
	start := time.Now()
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: srv.URL + "/disk.raw", SHA256: sha(make([]byte, size)), Format: "raw"})
	t.Logf("ensure with a failing mirror: %v after %s (%s)", err, time.Since(start), tr)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ensure = %v (class %q), want transient with the body's unexpected EOF", err, fleet.ClassOf(err))
	}
	if tr.count("direct") != 1 || tr.count("discard") != 1 {
		t.Fatalf("trace %s, want a direct upload and a discard", tr)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v after a failed upload, want nothing", v)
	}
}

// A digest that does not match fails permanent; the whole temporary file
// and the volume go.
func TestImage_directDigestMismatchLeavesNothing(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, dir := testPool(t, k)
	u, _, _ := writeArtifact(t, t.TempDir(), "disk.raw", 3<<20)
	c, tr := testCache(t, k, pool.Name, "h1")
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: u, SHA256: sha([]byte("else")), Format: "raw"})
	if fleet.ClassOf(err) != fleet.ClassPermanent || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("ensure = %v (class %q), want a permanent sha256 mismatch", err, fleet.ClassOf(err))
	}
	if tr.count("direct") != 1 || tr.count("discard") != 1 {
		t.Fatalf("trace %s, want a direct upload and a discard", tr)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v after a mismatch, want nothing", v)
	}
}

// The libvirt stream still works where it is used (streamOnly stands for
// a pool of another type: chooseDirect decides that, below).
func TestImage_streamUploadStillWorks(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 5<<20+3)
	c, tr := testCache(t, k, pool.Name, "h1")
	c.streamOnly = true
	vols, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: u, SHA256: digest, Format: "raw"})
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if tr.count("stream") != 1 || tr.count("direct") != 0 {
		t.Fatalf("trace %s, want one stream upload", tr)
	}
	checkVolume(t, vols.Base, data)
}

// A live direct upload keeps its volume's mtime moving, so a waiter in
// another process does not take it for abandoned: the volume's own file
// does not change while the bytes go to the temporary file.
func TestImage_directUploadIsNotTakenOverWhileAlive(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	const size, chunk = 4 << 20, 64 << 10
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		tick := time.NewTicker(80 * time.Millisecond) // the whole file in about 5s
		defer tick.Stop()
		for off := 0; off < size; off += chunk {
			if _, err := w.Write(data[off : off+chunk]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	img := ImageSource{Name: "i", URL: srv.URL + "/disk.raw", SHA256: sha(data), Format: "raw"}

	uploader, trU := testCache(t, k, pool.Name, "h1")
	uploader.stale = 2 * time.Second
	started := make(chan struct{})
	var once sync.Once
	uploader.trace = func(ev, vol string) {
		trU.add(ev, vol)
		if ev == "direct" {
			once.Do(func() { close(started) })
		}
	}
	var upErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, upErr = uploader.ensure(context.Background(), img)
	}()
	select {
	case <-started:
	case <-done:
		t.Fatalf("uploader ended before its direct upload: %v (%s)", upErr, trU)
	}
	waiter, trW := testCache(t, k, pool.Name, "h1")
	waiter.stale = 2 * time.Second
	vols, err := waiter.ensure(context.Background(), img)
	<-done
	t.Logf("uploader: %v (%s); waiter: %v (%s)", upErr, trU, err, trW)
	if upErr != nil || err != nil {
		t.Fatalf("uploader %v, waiter %v: want both to succeed", upErr, err)
	}
	if trW.count("wait") != 1 || trW.count("takeover") != 0 || trW.count("upload") != 0 {
		t.Fatalf("waiter's trace %s, want it to wait for the live upload", trW)
	}
	checkVolume(t, vols.Base, data)
}

func TestChooseDirect(t *testing.T) {
	for _, tc := range []struct {
		name, xml, vol string
		want           *directTarget
	}{
		{"dir", `<pool type="dir"><name>p</name><target><path>/var/lib/p/</path></target></pool>`, "/var/lib/p/pf-base-h-0123456789abcdef.raw",
			&directTarget{dir: "/var/lib/p", file: "pf-base-h-0123456789abcdef.raw"}},
		{"dir, volume elsewhere", `<pool type="dir"><name>p</name><target><path>/var/lib/p</path></target></pool>`, "/var/lib/q/v.raw", nil},
		{"dir, no target", `<pool type="dir"><name>p</name></pool>`, "/var/lib/p/v.raw", nil},
		{"fs", `<pool type="fs"><name>p</name><source><device path="/dev/vdb"/></source><target><path>/mnt/p</path></target></pool>`, "/mnt/p/v.raw", nil},
		{"netfs", `<pool type="netfs"><name>p</name><source><host name="nfs"/><dir path="/x"/></source><target><path>/mnt/p</path></target></pool>`, "/mnt/p/v.raw", nil},
		{"logical", `<pool type="logical"><name>vg</name><target><path>/dev/vg</path></target></pool>`, "/dev/vg/v", nil},
		{"bad xml", `<pool`, "/var/lib/p/v.raw", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := chooseDirect(tc.xml, tc.vol)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("chooseDirect = %+v (%s), want %+v", got, why, tc.want)
			}
			if got == nil && why == "" {
				t.Fatal("no reason given for the stream")
			}
		})
	}
}

func TestSSHConfig_ciphers(t *testing.T) {
	set := []string{"aes256-ctr"}
	if got := (SSHConfig{Ciphers: set}).ciphers(); !slices.Equal(got, set) {
		t.Fatalf("ciphers = %v, want the configured %v", got, set)
	}
	want := "chacha20-poly1305@openssh.com"
	if cpu.X86.HasAES || cpu.ARM64.HasAES {
		want = "aes128-gcm@openssh.com"
	}
	if got := (SSHConfig{}).ciphers(); len(got) == 0 || got[0] != want {
		t.Fatalf("default ciphers = %v, want %s first", got, want)
	}
	supported := ssh.SupportedAlgorithms().Ciphers
	for _, c := range append(slices.Clone(aesGCMFirst), chachaFirst...) {
		if !slices.Contains(supported, c) {
			t.Errorf("cipher %s is not supported by x/crypto/ssh", c)
		}
	}
}
