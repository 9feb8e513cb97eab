package kvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// The volume sweep on the test host, in a pool of the test's own (so the
// shared pool's volumes are neither touched nor in the way), with a clock
// of the test's (the grace is first-seen, by the provider's clock):
// what nothing uses goes after the grace, with its marks; what is young,
// wanted, used, another entry's or not ours stays.
func TestSweepVolumes_removesWhatNothingUsesAfterTheGrace(t *testing.T) {
	env := testhostAll(t)
	pool, poolDir := testPool(t, newTestProvider(t, env, nil).link)
	poolName := pool.Name
	src := t.TempDir()
	diskURL, _, diskSHA := writeArtifact(t, src, "disk.raw", 1<<20)
	kernelURL, _, kernelSHA := writeArtifact(t, src, "vmlinuz", 300<<10)
	initrdURL, _, initrdSHA := writeArtifact(t, src, "initrd", 700<<10)
	tiny := ImageSource{Name: "testguest", URL: diskURL, SHA256: diskSHA, Format: "raw",
		Kernel: &ArtifactSource{URL: kernelURL, SHA256: kernelSHA},
		Initrd: &ArtifactSource{URL: initrdURL, SHA256: initrdSHA}}
	entry := func(name string) func(*Options) {
		return func(o *Options) { o.Host.Name, o.Host.Pool, o.Images = name, poolName, []ImageSource{tiny} }
	}
	// A proxy of the sweeping entry whose image is no longer configured:
	// its domain refers to the cached kernel and initrd, its overlay is
	// backed by the cached base. And another entry's proxy on the daemon.
	maker, usedID := definedProxy(t, env, "swu", entry("th-sweep"))
	_, foreignID := definedProxy(t, env, "swo", entry("th-other"))

	var (
		mu  sync.Mutex
		now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	p := newTestProvider(t, env, func(o *Options) {
		o.Host.Name, o.Host.Pool, o.Images, o.Now = "th-sweep", poolName, nil, clock
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	orphanID, keptID, freshID := testID("swr"), testID("swk"), testID("swf")
	d16 := randomSHA()
	ourBase, _ := baseVolumeName("th-sweep", d16, "qcow2")
	ourMark := ourBase + "." + d16 + markSuffix
	// The base the wanted proxy's leftover overlay is backed by stays
	// as long as that overlay does.
	keptBase, _ := baseVolumeName("th-sweep", randomSHA(), "raw")
	otherBase, _ := baseVolumeName("th-other2", randomSHA(), "qcow2")
	otherKernel, _ := kernelVolumeName("th-other2", randomSHA())
	for _, name := range []string{
		overlayVolumeName(orphanID), seedVolumeName(orphanID), keptBase,
		ourBase, ourMark, otherBase, otherKernel,
		"sweeptest-not-ours.qcow2", "pf-base-th-sweep-nothex.qcow2",
	} {
		plantVolume(t, p, name, "")
	}
	plantVolume(t, p, overlayVolumeName(keptID), filepath.Join(poolDir, keptBase))

	var claimed []string
	claim := func(_ context.Context, id string) (func(), bool) {
		mu.Lock()
		defer mu.Unlock()
		claimed = append(claimed, id)
		return func() {}, id != keptID
	}
	const grace = 10 * time.Minute
	sweep := func(pass string) []string {
		t.Helper()
		got, err := p.SweepVolumes(ctx, grace, claim)
		if err != nil {
			t.Fatalf("%s: %v", pass, err)
		}
		sort.Strings(got)
		t.Logf("%s removed %v", pass, got)
		return got
	}

	if got := sweep("first pass"); len(got) != 0 {
		t.Fatalf("first pass removed %v: nothing had been seen unused for the grace", got)
	}
	advance(grace)
	plantVolume(t, p, overlayVolumeName(freshID), "")
	want := []string{ourBase, overlayVolumeName(orphanID), seedVolumeName(orphanID)}
	sort.Strings(want)
	if got := sweep("second pass"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("second pass removed %v, want %v", got, want)
	}
	vols := poolVolumes(t, p.link, pool)
	for _, gone := range append(want, ourMark) {
		if contains(vols, gone) {
			t.Errorf("%s is still there", gone)
		}
	}
	ourCache := slices.DeleteFunc(cachedOf(vols, "th-sweep"), func(n string) bool { return n == keptBase })
	if len(ourCache) != 6 {
		t.Fatalf("th-sweep's cache %v, want the base, kernel and initrd its proxy uses, with their marks", ourCache)
	}
	otherCache := cachedOf(vols, "th-other")
	if len(otherCache) != 6 {
		t.Fatalf("th-other's cache %v, want its base, kernel and initrd with their marks", otherCache)
	}
	// Kept to the end: wanted, another entry's, not ours.
	always := append([]string{overlayVolumeName(keptID), keptBase, otherBase, otherKernel,
		"sweeptest-not-ours.qcow2", "pf-base-th-sweep-nothex.qcow2",
		overlayVolumeName(foreignID), seedVolumeName(foreignID)}, otherCache...)
	// Kept for now: young, or used.
	for _, k := range append(append([]string{overlayVolumeName(freshID), overlayVolumeName(usedID), seedVolumeName(usedID)},
		ourCache...), always...) {
		if !contains(vols, k) {
			t.Errorf("%s was removed", k)
		}
	}
	mu.Lock()
	for _, id := range claimed {
		if id == usedID || id == foreignID {
			t.Errorf("claimed %s, which has a domain", id)
		}
	}
	mu.Unlock()

	// Once the proxy is gone, nothing uses th-sweep's cache.
	if err := maker.Delete(ctx, usedID); err != nil {
		t.Fatal(err)
	}
	if got := sweep("third pass"); len(got) != 0 {
		t.Fatalf("third pass removed %v: the cache was in use until now, the fresh overlay young", got)
	}
	advance(grace)
	want = []string{overlayVolumeName(freshID)}
	for _, n := range ourCache {
		if !strings.HasSuffix(n, markSuffix) {
			want = append(want, n)
		}
	}
	sort.Strings(want)
	if got := sweep("fourth pass"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("fourth pass removed %v, want %v", got, want)
	}
	vols = poolVolumes(t, p.link, pool)
	if c := cachedOf(vols, "th-sweep"); len(c) != 1 || c[0] != keptBase {
		t.Errorf("th-sweep's cache left: %v, want only %s (marks go with their volumes)", c, keptBase)
	}
	for _, k := range always {
		if !contains(vols, k) {
			t.Errorf("%s was removed", k)
		}
	}
}

func randomSHA() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// plantVolume makes an empty volume in p's pool behind its back, a qcow2
// overlay of the raw file at backing if that is set.
func plantVolume(t *testing.T, p *Provider, name, backing string) {
	t.Helper()
	v := libvirtxml.StorageVolume{
		Name:       name,
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 1 << 20},
		Target:     &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}
	if backing != "" {
		v.Target.Format.Type = "qcow2"
		v.BackingStore = &libvirtxml.StorageVolumeBackingStore{Path: backing, Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}}
	}
	x, err := v.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(p.opts.Host.Pool)
		if err != nil {
			return err
		}
		_, err = l.StorageVolCreateXML(sp, x, 0)
		return err
	})
	if err != nil {
		t.Fatalf("plant %s: %v", name, err)
	}
}

// cachedOf are the cached volumes (and marks) of host entry host in vols.
func cachedOf(vols []string, host string) []string {
	var out []string
	for _, v := range vols {
		for _, prefix := range []string{basePrefix, kernelPrefix, initrdPrefix} {
			if rest, ok := strings.CutPrefix(v, prefix+host+"-"); ok && len(rest) >= digestLen && isHex(rest[:digestLen]) {
				out = append(out, v)
			}
		}
	}
	sort.Strings(out)
	return out
}
