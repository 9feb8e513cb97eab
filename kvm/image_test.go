package kvm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
)

// The image cache tests run against the real libvirtd through a real sshd
// (host_test.go), each in a temporary dir pool of its own, whose directory is
// on this machine: the tests read the volumes' files to check what landed.

// traceLog records an imageCache's decisions.
type traceLog struct {
	mu     sync.Mutex
	events []string    // "event volume"
	at     []time.Time // when each came
}

func (r *traceLog) add(ev, vol string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev+" "+vol)
	r.at = append(r.at, time.Now())
}

// first returns when the first event ev came, and whether one did.
func (r *traceLog) first(ev string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.events {
		if strings.HasPrefix(e, ev+" ") {
			return r.at[i], true
		}
	}
	return time.Time{}, false
}

func (r *traceLog) count(ev string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if strings.HasPrefix(e, ev+" ") {
			n++
		}
	}
	return n
}

func (r *traceLog) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, ", ")
}

// testCache is an imageCache on pool for host entry host, with short
// timings, its decisions traced.
func testCache(t *testing.T, k *Link, pool, host string) (*imageCache, *traceLog) {
	t.Helper()
	tr := &traceLog{}
	return &imageCache{
		host:          host,
		pool:          pool,
		link:          k,
		budgets:       k.cfg.Budgets,
		httpClient:    testHTTPClient(t),
		log:           slog.New(slog.NewTextHandler(newTestWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug})),
		stale:         30 * time.Second,
		poll:          50 * time.Millisecond,
		progressEvery: 50 * time.Millisecond,
		discardWait:   5 * time.Second,
		trace:         tr.add,
	}, tr
}

// testHTTPClient keeps no idle connections, whose goroutines goleak would
// count.
func testHTTPClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// testWriter logs to t until the test ends and drops what comes later (a
// cut transfer's goroutine may still report after ensure returned).
type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func newTestWriter(t *testing.T) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// writeArtifact writes size random bytes to a file and returns its file://
// URL, its content and its sha256.
func writeArtifact(t *testing.T, dir, name string, size int) (string, []byte, string) {
	t.Helper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return "file://" + p, b, sha(b)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// poolVolumes lists the names of pool's volumes, sorted.
func poolVolumes(t *testing.T, k *Link, pool libvirt.StoragePool) []string {
	t.Helper()
	var names []string
	err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		if err := l.StoragePoolRefresh(pool, 0); err != nil {
			return err
		}
		vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
		for _, v := range vols {
			names = append(names, v.Name)
		}
		return err
	})
	if err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	slices.Sort(names)
	return names
}

// checkVolume fails unless ref's file holds want.
func checkVolume(t *testing.T, ref volRef, want []byte) {
	t.Helper()
	got, err := os.ReadFile(ref.Path)
	if err != nil {
		t.Fatalf("volume %s: %v", ref.Name, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("volume %s: %d bytes, not the %d uploaded", ref.Name, len(got), len(want))
	}
}

func TestImage_uploadsOnceAndReusesAcrossInstances(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	src := t.TempDir()
	diskURL, disk, diskSHA := writeArtifact(t, src, "disk.raw", 6<<20+123)
	kernelURL, kernel, kernelSHA := writeArtifact(t, src, "vmlinuz", 300<<10)
	initrdURL, initrd, initrdSHA := writeArtifact(t, src, "initrd", 700<<10)
	img := ImageSource{
		Name: "tiny", URL: diskURL, SHA256: diskSHA, Format: "raw",
		Kernel: &ArtifactSource{URL: kernelURL, SHA256: kernelSHA},
		Initrd: &ArtifactSource{URL: initrdURL, SHA256: initrdSHA},
	}

	c1, tr1 := testCache(t, k, pool.Name, "h1")
	var mu sync.Mutex
	var reports []Progress
	c1.onProgress = func(p Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() }
	start := time.Now()
	vols, err := c1.ensure(context.Background(), img)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	t.Logf("first ensure (3 uploads) took %s: %s", time.Since(start), tr1)
	if n := tr1.count("upload"); n != 3 {
		t.Fatalf("%d uploads, want 3 (%s)", n, tr1)
	}
	wantBase, _ := baseVolumeName("h1", diskSHA, "raw")
	if vols.Base.Name != wantBase || vols.Base.Format != "raw" || vols.Base.Capacity != uint64(len(disk)) {
		t.Fatalf("base = %+v, want %s, raw, %d bytes", vols.Base, wantBase, len(disk))
	}
	if vols.Kernel == nil || vols.Initrd == nil {
		t.Fatalf("kernel %v initrd %v, want both", vols.Kernel, vols.Initrd)
	}
	checkVolume(t, vols.Base, disk)
	checkVolume(t, *vols.Kernel, kernel)
	checkVolume(t, *vols.Initrd, initrd)

	// Progress: a start and an end per volume, the end with all bytes.
	mu.Lock()
	ends := map[string]bool{}
	for _, p := range reports {
		if p.Done == p.Total && p.Rate > 0 {
			ends[p.Volume] = true
		}
		if p.Image != "tiny" || p.Done > p.Total {
			t.Errorf("bad progress report %+v", p)
		}
	}
	mu.Unlock()
	if len(ends) != 3 {
		t.Fatalf("final progress reports for %v, want 3 volumes", ends)
	}

	// Another instance, as another process would have: nothing to upload.
	c2, tr2 := testCache(t, k, pool.Name, "h1")
	start = time.Now()
	vols2, err := c2.ensure(context.Background(), img)
	if err != nil {
		t.Fatalf("second ensure: %v", err)
	}
	t.Logf("second ensure took %s", time.Since(start))
	if n := tr2.count("upload"); n != 0 {
		t.Fatalf("second ensure uploaded %d times (%s)", n, tr2)
	}
	if vols2.Base != vols.Base || *vols2.Kernel != *vols.Kernel || *vols2.Initrd != *vols.Initrd {
		t.Fatalf("second ensure = %+v, want %+v", vols2, vols)
	}

	// Without kernel and initrd, only the base is returned.
	img.Kernel, img.Initrd = nil, nil
	vols3, err := c2.ensure(context.Background(), img)
	if err != nil || vols3.Kernel != nil || vols3.Initrd != nil || vols3.Base != vols.Base {
		t.Fatalf("ensure without kernel = %+v, %v", vols3, err)
	}
	got := poolVolumes(t, k, pool)
	want := []string{
		vols.Base.Name, markName(artifact{name: vols.Base.Name, sha: diskSHA}),
		vols.Kernel.Name, markName(artifact{name: vols.Kernel.Name, sha: kernelSHA}),
		vols.Initrd.Name, markName(artifact{name: vols.Initrd.Name, sha: initrdSHA}),
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("pool holds %v, want %v", got, want)
	}
}

// A qcow2 image's volume reports its virtual size as capacity, the floor an
// overlay's capacity needs.
func TestImage_qcow2CapacityIsVirtualSize(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	p := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	// Make it bigger than the file libvirt's own qcow2 create leaves, so
	// the upload overwrites all of it.
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 1M", p).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := testCache(t, k, pool.Name, "h1")
	vols, err := c.ensure(context.Background(), ImageSource{Name: "q", URL: "file://" + p, SHA256: sha(b), Format: "qcow2"})
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if vols.Base.Format != "qcow2" || vols.Base.Capacity != 64<<20 || !strings.HasSuffix(vols.Base.Name, ".qcow2") {
		t.Fatalf("base = %+v, want qcow2 of 64 MiB capacity", vols.Base)
	}
	checkVolume(t, vols.Base, b)
}

// Two host entries on one libvirt pool never share a cached volume.
func TestImage_H4_hostEntriesGetTheirOwnVolumes(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 2<<20)
	img := ImageSource{Name: "debian-12", URL: u, SHA256: digest, Format: "raw"}

	c1, tr1 := testCache(t, k, pool.Name, "beelink")
	c2, tr2 := testCache(t, k, pool.Name, "beelink-2")
	v1, err := c1.ensure(context.Background(), img)
	if err != nil {
		t.Fatalf("ensure on beelink: %v", err)
	}
	v2, err := c2.ensure(context.Background(), img)
	if err != nil {
		t.Fatalf("ensure on beelink-2: %v", err)
	}
	if v1.Base.Name == v2.Base.Name || v1.Base.Path == v2.Base.Path {
		t.Fatalf("two host entries share a volume: %+v and %+v", v1.Base, v2.Base)
	}
	if tr1.count("upload") != 1 || tr2.count("upload") != 1 {
		t.Fatalf("uploads: beelink %s; beelink-2 %s; want one each", tr1, tr2)
	}
	checkVolume(t, v1.Base, data)
	checkVolume(t, v2.Base, data)
}

// A volume is used only with a completion
// mark that vouches for it as it is now.
func TestImage_H4_unmarkedVolumeIsNotUsed(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, dir := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 1<<20)
	img := ImageSource{Name: "debian-12", URL: u, SHA256: digest, Format: "raw"}
	name, _ := baseVolumeName("h1", digest, "raw")

	notUsed := func(t *testing.T, why string) {
		t.Helper()
		c, tr := testCache(t, k, pool.Name, "h1")
		c.stale = time.Minute // never taken over here
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		vols, err := c.ensure(ctx, img)
		if err == nil {
			t.Fatalf("%s: ensure returned %+v, want it to wait for a mark", why, vols.Base)
		}
		if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: ensure = %v (class %q), want a transient wait that ran out", why, err, fleet.ClassOf(err))
		}
		if tr.count("wait") != 1 || tr.count("upload") != 0 {
			t.Fatalf("%s: trace %s, want one wait and no upload", why, tr)
		}
	}

	t.Run("volume without mark", func(t *testing.T) {
		vol := testVolume(t, k, pool, name, uint64(len(data)))
		notUsed(t, "a volume made by hand")
		deleteVol(t, k, vol)
	})
	t.Run("volume written after its mark", func(t *testing.T) {
		c, _ := testCache(t, k, pool.Name, "h1")
		vols, err := c.ensure(context.Background(), img)
		if err != nil {
			t.Fatal(err)
		}
		// Someone writes into the verified volume behind the cache's
		// back (its mark stays).
		vol := lookupVol(t, k, pool, vols.Base.Name)
		if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
			return l.StorageVolUpload(vol, bytes.NewReader([]byte("rewritten")), 0, 9, 0)
		}); err != nil {
			t.Fatal(err)
		}
		stampAfter(t, filepath.Join(dir, name), filepath.Join(dir, markName(artifact{name: name, sha: digest})))
		notUsed(t, "a volume written after its verification")
		deleteVol(t, k, vol)
	})
	t.Run("mark without its volume", func(t *testing.T) {
		// The previous subtest left the mark of a volume now gone (as a
		// sweep might leave it): it vouches for nothing, the next upload
		// replaces it.
		if v := poolVolumes(t, k, pool); !slices.Equal(v, []string{markName(artifact{name: name, sha: digest})}) {
			t.Fatalf("pool holds %v, want only the mark", v)
		}
		c, tr := testCache(t, k, pool.Name, "h1")
		vols, err := c.ensure(context.Background(), img)
		if err != nil {
			t.Fatal(err)
		}
		if tr.count("upload") != 1 {
			t.Fatalf("trace %s, want an upload", tr)
		}
		checkVolume(t, vols.Base, data)
	})
}

// stampAfter sets the mtime of the file at path to a second after that of
// the file at earlier: a write to path made after earlier was stamped
// shows as later, whatever the clock's grain (within one tick of a
// coarse clock both would have the same mtime).
func stampAfter(t *testing.T, path, earlier string) {
	t.Helper()
	fi, err := os.Stat(earlier)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, time.Time{}, fi.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
}

func lookupVol(t *testing.T, k *Link, pool libvirt.StoragePool, name string) libvirt.StorageVol {
	t.Helper()
	var vol libvirt.StorageVol
	if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		var err error
		vol, err = l.StorageVolLookupByName(pool, name)
		return err
	}); err != nil {
		t.Fatalf("look up %s: %v", name, err)
	}
	return vol
}

func deleteVol(t *testing.T, k *Link, vol libvirt.StorageVol) {
	t.Helper()
	if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		return l.StorageVolDelete(vol, 0)
	}); err != nil {
		t.Fatalf("delete %s: %v", vol.Name, err)
	}
}

// Goroutines of one process wanting one image share one upload.
func TestImage_goroutinesShareOneUpload(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 4<<20)
	img := ImageSource{Name: "i", URL: u, SHA256: digest, Format: "raw"}
	c, tr := testCache(t, k, pool.Name, "h1")
	var wg sync.WaitGroup
	refs := make([]volRef, 4)
	errs := make([]error, 4)
	for i := range refs {
		wg.Go(func() {
			v, err := c.ensure(context.Background(), img)
			refs[i], errs[i] = v.Base, err
		})
	}
	wg.Wait()
	for i := range refs {
		if errs[i] != nil || refs[i] != refs[0] {
			t.Fatalf("ensure %d = %+v, %v; ensure 0 = %+v", i, refs[i], errs[i], refs[0])
		}
	}
	if n := tr.count("upload"); n != 1 {
		t.Fatalf("%d uploads, want 1 (%s)", n, tr)
	}
	checkVolume(t, refs[0], data)
}

// helperConfig tells TestHelperProcessEnsure what to do.
type helperConfig struct {
	SSH   SSHConfig
	Pool  string
	Host  string
	Image ImageSource
}

// helperResult is what a helper process prints, on a line of its own after
// "RESULT ".
type helperResult struct {
	Uploaded bool
	Waited   bool
	Path     string
	Err      string
}

const helperEnv = "PROXYFLEET_IMAGE_HELPER"

// helperReady is the line a helper process prints once it is up, before
// it waits for the go on its stdin.
const helperReady = "HELPER READY"

// TestHelperProcessEnsure is not a test: TestImage_twoProcessesOneUpload
// runs the test binary as child processes that run only this, with
// PROXYFLEET_IMAGE_HELPER set to a helperConfig. It returns at once
// otherwise.
func TestHelperProcessEnsure(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return
	}
	var cfg helperConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	k := newTestLink(t, LinkConfig{SSH: cfg.SSH})
	c, tr := testCache(t, k, cfg.Pool, cfg.Host)
	// Both processes start when the parent says so, to overlap; it waits
	// for both to say they are up.
	fmt.Printf("\n%s\n", helperReady)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("waiting for the go: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vols, err := c.ensure(ctx, cfg.Image)
	res := helperResult{Uploaded: tr.count("upload") > 0, Waited: tr.count("wait") > 0, Path: vols.Base.Path}
	if err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Printf("\nRESULT %s\n", b)
	t.Logf("trace: %s", tr)
}

// Two processes ensure one image on one host entry at the same time: one
// uploads, the other waits for its mark, and both get the same volume.
func TestImage_twoProcessesOneUpload(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)

	// A slow mirror (about 1.5s per download), so that the two overlap
	// whoever starts first; it counts the bodies it served in full.
	var mu sync.Mutex
	served, started := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		started++
		mu.Unlock()
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		const chunk = 256 << 10
		for off := 0; off < len(data); off += chunk {
			if _, err := w.Write(data[off : off+chunk]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			if off+chunk == len(data) {
				mu.Lock()
				served++
				mu.Unlock()
				return
			}
			select {
			case <-time.After(45 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(srv.Close)

	b, err := json.Marshal(helperConfig{
		SSH: s.sshConfig(t, s.addr), Pool: pool.Name, Host: "h1",
		Image: ImageSource{Name: "slow", URL: srv.URL + "/disk.raw", SHA256: sha(data), Format: "raw"},
	})
	if err != nil {
		t.Fatal(err)
	}
	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout lockedBuffer // read while the child runs
		stderr bytes.Buffer
	}
	children := make([]*child, 2)
	for i := range children {
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestHelperProcessEnsure$", "-test.count=1", "-test.v")}
		ch.cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.stdout, &ch.stderr
		if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[i] = ch
	}
	// Both up (they dial nothing before the go).
	for i, ch := range children {
		poll.Until(t, fmt.Sprintf("child %d to be up", i), time.Minute, func() bool {
			return strings.Contains(ch.stdout.String(), "\n"+helperReady+"\n")
		})
	}
	start := time.Now()
	for _, ch := range children {
		_, _ = io.WriteString(ch.stdin, "go\n")
		ch.stdin.Close()
	}
	results := make([]helperResult, 2)
	for i, ch := range children {
		err := ch.cmd.Wait()
		out := ch.stdout.String()
		t.Logf("child %d after %s: exit %v\n%s%s", i, time.Since(start), err, out, ch.stderr.String())
		_, line, ok := strings.Cut(out, "\nRESULT ")
		if !ok {
			t.Fatalf("child %d printed no result", i)
		}
		line, _, _ = strings.Cut(line, "\n")
		if err := json.Unmarshal([]byte(line), &results[i]); err != nil {
			t.Fatalf("child %d result %q: %v", i, line, err)
		}
		if err != nil || results[i].Err != "" {
			t.Fatalf("child %d failed: %v %s", i, err, results[i].Err)
		}
	}
	uploaders := 0
	for _, r := range results {
		if r.Uploaded {
			uploaders++
		} else if !r.Waited {
			t.Errorf("a child neither uploaded nor waited for the upload: %+v", r)
		}
	}
	if uploaders != 1 || results[0].Path != results[1].Path || results[0].Path == "" {
		t.Fatalf("results %+v: want exactly one uploader and one path", results)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("mirror: %d downloads started, %d served in full", started, served)
	if served != 1 {
		t.Fatalf("the mirror served the image in full %d times, want 1", served)
	}
	got, err := os.ReadFile(results[0].Path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the cached volume does not hold the image (%v)", err)
	}
}

// A digest mismatch fails permanent (the config or the mirror is wrong) and
// leaves neither volume nor mark.
func TestImage_digestMismatchIsPermanentAndLeavesNothing(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	u, _, _ := writeArtifact(t, t.TempDir(), "disk.raw", 3<<20)
	wrong := sha([]byte("something else"))
	c, tr := testCache(t, k, pool.Name, "h1")
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: u, SHA256: wrong, Format: "raw"})
	t.Logf("ensure: %v", err)
	if fleet.ClassOf(err) != fleet.ClassPermanent || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("ensure = %v (class %q), want a permanent sha256 mismatch", err, fleet.ClassOf(err))
	}
	if tr.count("upload") != 1 || tr.count("discard") != 1 {
		t.Fatalf("trace %s, want one upload and one discard", tr)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v after a mismatch, want nothing", v)
	}
}

// Through the cache, a source that fails mid-upload ends
// the upload promptly with a transient error, its volume is discarded, no
// goroutine is left (goleak, TestMain) and the link still answers.
func TestImage_sourceErrorMidUploadIsTransientAndPrompt(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr), Budgets: Budgets{TransferStall: 10 * time.Second}})
	pool, _ := testPool(t, k)
	const size = 16 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(make([]byte, 2<<20))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the mirror drops the connection
	}))
	t.Cleanup(srv.Close)
	c, tr := testCache(t, k, pool.Name, "h1")
	digest := sha(make([]byte, size))
	start := time.Now()
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: srv.URL + "/disk.raw", SHA256: digest, Format: "raw"})
	took := time.Since(start)
	t.Logf("ensure with a failing mirror: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ensure = %v (class %q), want transient with the body's unexpected EOF", err, fleet.ClassOf(err))
	}
	if took > 3*time.Second {
		t.Fatalf("ensure with a failing mirror took %s, want prompt", took)
	}
	if tr.count("upload") != 1 || tr.count("discard") != 1 {
		t.Fatalf("trace %s, want one upload and one discard", tr)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v after a failed upload, want nothing", v)
	}
	if err := k.call(context.Background(), 2*time.Second, version); err != nil {
		t.Fatalf("shared link after a failed upload: %v", err)
	}
}

// A mirror that stalls ends the upload through the download's own
// deadline, inside the transfer's, not through a killed connection; the
// volume is discarded.
func TestImage_downloadDeadlineInsideTransferBudget(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr), Budgets: Budgets{TransferStall: 30 * time.Second}})
	pool, _ := testPool(t, k)
	const size = 16 << 20
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(make([]byte, 1<<20))
		w.(http.Flusher).Flush()
		select { // the mirror stalls
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	c, tr := testCache(t, k, pool.Name, "h1")
	c.transferLimit = 2 * time.Second
	c.downloadMargin = time.Second // capped at a quarter: the download ends at 1.5s
	start := time.Now()
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: srv.URL + "/disk.raw", SHA256: sha(make([]byte, size)), Format: "raw"})
	took := time.Since(start)
	t.Logf("ensure with a stalled mirror: %v after %s", err, took)
	if fleet.ClassOf(err) != fleet.ClassTransient || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "download") {
		t.Fatalf("ensure = %v (class %q), want a transient download deadline", err, fleet.ClassOf(err))
	}
	if errors.Is(err, ErrLinkDead) {
		t.Fatalf("ensure = %v: the transfer was cut, want it ended by the download's deadline", err)
	}
	if took < 1400*time.Millisecond || took > 2*time.Second+500*time.Millisecond {
		t.Fatalf("ended after %s, want the download deadline at about 1.5s", took)
	}
	if tr.count("discard") != 1 {
		t.Fatalf("trace %s, want a discard", tr)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v, want nothing", v)
	}
}

// An upload abandoned by its uploader (a volume, no mark, not changing) is
// taken over once it has not changed for the stale period.
func TestImage_staleUploadIsTakenOver(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, dir := testPool(t, k)
	u, data, digest := writeArtifact(t, t.TempDir(), "disk.raw", 2<<20)
	name, _ := baseVolumeName("h1", digest, "raw")
	// A mark left from an earlier upload, then the dead uploader's
	// volume, newer than that mark, with half the bytes.
	mark := markName(artifact{name: name, sha: digest})
	testVolume(t, k, pool, mark, uint64(len(data)))
	vol := testVolume(t, k, pool, name, uint64(len(data)))
	if err := k.call(context.Background(), 10*time.Second, func(l *libvirt.Libvirt) error {
		return l.StorageVolUpload(vol, bytes.NewReader(data[:1<<20]), 0, 1<<20, 0)
	}); err != nil {
		t.Fatal(err)
	}
	stampAfter(t, filepath.Join(dir, name), filepath.Join(dir, mark))
	c, tr := testCache(t, k, pool.Name, "h1")
	c.stale = time.Second
	start := time.Now()
	vols, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: u, SHA256: digest, Format: "raw"})
	took := time.Since(start)
	t.Logf("ensure over an abandoned upload: %v after %s (%s)", err, took, tr)
	if err != nil {
		t.Fatal(err)
	}
	// The takeover comes once the volume has not changed for the stale
	// period (not later, as after the default 30s); the upload after it
	// takes what the machine gives it (CI saw 2 MiB take 6 s while
	// guests booted), so only the takeover is timed, with a bound for a
	// hang.
	at, ok := tr.first("takeover")
	if !ok {
		t.Fatalf("trace %s, want a takeover", tr)
	}
	if wait := at.Sub(start); wait < c.stale || wait > c.stale+15*time.Second {
		t.Fatalf("took over after %s, want after the %s stale period (and well before the default 30s)", wait, c.stale)
	}
	if tr.count("wait") != 1 || tr.count("takeover") != 1 || tr.count("upload") != 1 {
		t.Fatalf("trace %s, want wait, takeover, upload", tr)
	}
	checkVolume(t, vols.Base, data)
}

// A mirror that sends no Content-Length is refused before any volume is
// made: the volume's size must be known when it is created.
func TestImage_noContentLengthIsPermanent(t *testing.T) {
	s := startSSHD(t)
	k := newTestLink(t, LinkConfig{SSH: s.sshConfig(t, s.addr)})
	pool, _ := testPool(t, k)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush() // chunked: no length
		_, _ = w.Write([]byte("data"))
	}))
	t.Cleanup(srv.Close)
	c, tr := testCache(t, k, pool.Name, "h1")
	_, err := c.ensure(context.Background(), ImageSource{Name: "i", URL: srv.URL + "/x", SHA256: sha([]byte("data")), Format: "raw"})
	if fleet.ClassOf(err) != fleet.ClassPermanent || !strings.Contains(err.Error(), "Content-Length") {
		t.Fatalf("ensure = %v (class %q), want permanent, no Content-Length", err, fleet.ClassOf(err))
	}
	if tr.count("upload") != 0 {
		t.Fatalf("trace %s, want no upload", tr)
	}
	if v := poolVolumes(t, k, pool); len(v) != 0 {
		t.Fatalf("pool holds %v, want nothing", v)
	}
}

// eofReader hands go-libvirt io.EOF for any source error and keeps the
// error.
func TestImage_eofReader(t *testing.T) {
	boom := errors.New("boom")
	r := &eofReader{r: io.MultiReader(strings.NewReader("abc"), errReader{boom})}
	b, err := io.ReadAll(r)
	if err != nil || string(b) != "abc" {
		t.Fatalf("ReadAll = %q, %v; want abc, nil", b, err)
	}
	if !errors.Is(r.Err(), boom) {
		t.Fatalf("Err = %v, want boom", r.Err())
	}
	if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the error = %d, %v; want 0, EOF", n, err)
	}
	clean := &eofReader{r: strings.NewReader("x")}
	if _, err := io.ReadAll(clean); err != nil || clean.Err() != nil {
		t.Fatalf("clean source: %v, %v", err, clean.Err())
	}
}
