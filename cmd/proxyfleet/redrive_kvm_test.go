package main

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"proxyfleet/config"
	"proxyfleet/messages"
)

// Re-drive and sweeps on the test host: a worker of this process
// runs a host entry of its own, whose pool is a directory of the test's (so
// the sweep sees only what the test put there). A proxy whose domain is
// destroyed and undefined behind the system's back runs again with a new
// domain; a volume of ours with no domain and a base image of a digest no
// image uses are removed after the grace; another entry's cached volume,
// a domain without our mark and its volume, and a volume without our
// prefix are left alone.
func TestRedriveAndSweepsOnTheTestHost(t *testing.T) {
	const entry, grace = "th-redrive", 3 * time.Second
	pool, dir := privatePool(t, "pftest-redrive")
	f := newKVMFault(t, func(c *config.Config) {
		hostEntry(c, entry, func(h *config.Host) { h.Pool = pool })
		c.Worker.SweepGrace = grace
	})
	id := "rd-1"
	f.cleanupProxies(id, "rd-orphan")

	digest := func() string {
		var b [32]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	unused, other := digest(), digest()
	orphan := "pf-rd-orphan-disk.qcow2"
	unusedBase := "pf-base-" + entry + "-" + unused[:16] + ".qcow2"
	unusedMark := unusedBase + "." + unused + ".ok"
	otherBase := "pf-base-th-elsewhere-" + other[:16] + ".qcow2"
	unmarkedDisk := "pf-rd-unmarked-disk.qcow2"
	notOurs := "rd-not-ours.qcow2"
	for _, v := range []string{orphan, unusedBase, unusedMark, otherBase, unmarkedDisk, notOurs} {
		virsh(t, "vol-create-as", pool, v, "1M", "--format", "raw")
	}
	// A domain with one of our names and no mark, never started.
	unmarked := filepath.Join(f.dir, "unmarked.xml")
	writeFile(t, unmarked, `<domain type='qemu'><name>pf-rd-unmarked</name><memory unit='MiB'>64</memory>`+
		`<os><type arch='x86_64'>hvm</type></os><devices><disk type='file' device='disk'>`+
		`<source file='`+filepath.Join(dir, unmarkedDisk)+`'/><target dev='vda' bus='virtio'/></disk></devices></domain>`)
	virsh(t, "define", unmarked)
	t.Cleanup(func() { _ = exec.Command("virsh", "-c", "qemu:///system", "undefine", "pf-rd-unmarked").Run() })

	start := time.Now()
	f.startWorker()
	waitUntil(t, "the unused volumes swept", time.Minute, func() bool {
		vols := poolVolumeNames(t, pool)
		return !vols[orphan] && !vols[unusedBase] && !vols[unusedMark]
	})
	t.Logf("orphan volume and unused base swept %s after the worker started (grace %s, observe interval %s)",
		time.Since(start).Round(time.Millisecond), grace, f.cfg.Worker.ObserveInterval)

	start = time.Now()
	c := f.command(messages.OpCreate, id)
	f.waitDone(3*time.Minute, c)
	first := f.lastEvent(id)
	if first.State != messages.StateRunning || first.IP == "" {
		t.Fatalf("%s: %+v, want running", id, first)
	}
	t.Logf("%s running at %s after %s", id, first.IP, time.Since(start).Round(time.Millisecond))

	// Twice: undefined while it runs, then destroyed (it goes from
	// running to gone); and destroyed, then undefined (a pass in between
	// may see it shut off and report it failed first).
	last := first
	for _, order := range [][]string{{"undefine", "destroy"}, {"destroy", "undefine"}} {
		uuid := strings.TrimSpace(virsh(t, "domuuid", "pf-"+id))
		gone := time.Now()
		for _, verb := range order {
			virsh(t, verb, "pf-"+id)
		}
		waitUntil(t, id+" running again", 3*time.Minute, func() bool {
			ev := f.lastEvent(id)
			return ev.State == messages.StateRunning && ev.Seq > last.Seq
		})
		again := f.lastEvent(id)
		t.Logf("%s then %s: %s running again at %s, %s after its domain went", order[0], order[1], id, again.IP,
			time.Since(gone).Round(time.Millisecond))
		if again.CommandID != c || again.Host != entry || again.IP == "" {
			t.Errorf("running again as %+v, want command %s on %s with an address", again, c, entry)
		}
		if u := strings.TrimSpace(virsh(t, "domuuid", "pf-"+id)); u == uuid {
			t.Errorf("domain pf-%s has its old uuid %s: not made again", id, u)
		}
		f.e2e.mu.Lock()
		var said bool
		for _, ev := range f.events[id] {
			if ev.Seq <= last.Seq {
				continue
			}
			if ev.State == messages.StateFailed && said {
				t.Errorf("reported failed while it is re-created: %+v", ev)
			}
			if ev.State == messages.StateFailed {
				t.Logf("an observation saw the domain shut off before it was undefined: %s", ev.Reason)
			}
			said = said || (ev.State == messages.StateProvisioning && ev.Reason == "re-creating: domain gone")
		}
		f.e2e.mu.Unlock()
		if !said {
			t.Error("no provisioning event saying it is re-created because its domain was gone")
		}
		last = again
	}

	vols := poolVolumeNames(t, pool)
	for _, v := range []string{otherBase, unmarkedDisk, notOurs, "pf-" + id + "-disk.qcow2", "pf-" + id + "-seed.iso"} {
		if !vols[v] {
			t.Errorf("%s was removed", v)
		}
	}
	if n := len(cacheOf(vols, entry)); n != 6 {
		t.Errorf("%s's cache: %d volumes, want the configured image's three and their marks", entry, n)
	}
	if !strings.Contains(virsh(t, "list", "--all", "--name"), "pf-rd-unmarked") {
		t.Error("the domain without our mark is gone")
	}
}

// privatePool makes a transient dir pool of a directory of the test's on
// the test host's file system, and removes both when the test ends (after
// its proxies' clean-up, which the test registers later).
func privatePool(t *testing.T, name string) (pool, dir string) {
	t.Helper()
	removeStalePool(t, name, "/var/lib/proxyfleet-testhost/redrive-pool-", nil)
	if err := os.MkdirAll("/var/lib/proxyfleet-testhost", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/lib/proxyfleet-testhost", "redrive-pool-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	virsh(t, "pool-create-as", name, "dir", "--target", dir)
	t.Cleanup(func() {
		if out, err := exec.Command("virsh", "-c", "qemu:///system", "pool-destroy", name).CombinedOutput(); err != nil {
			t.Errorf("destroy pool %s: %v: %s", name, err, out)
		}
	})
	return name, dir
}

// poolVolumeNames lists a pool's volumes.
func poolVolumeNames(t *testing.T, pool string) map[string]bool {
	t.Helper()
	// Best effort: libvirtd refuses while a volume is being built.
	_ = exec.Command("virsh", "-c", "qemu:///system", "pool-refresh", pool).Run()
	out := map[string]bool{}
	for _, line := range strings.Split(virsh(t, "vol-list", pool), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] != "Name" && !strings.HasPrefix(f[0], "---") {
			out[f[0]] = true
		}
	}
	return out
}

// cacheOf are the cached image volumes (and marks) of host entry in vols.
func cacheOf(vols map[string]bool, entry string) []string {
	var out []string
	for v := range vols {
		for _, k := range []string{"base", "kernel", "initrd"} {
			if strings.HasPrefix(v, "pf-"+k+"-"+entry+"-") {
				out = append(out, v)
			}
		}
	}
	return out
}
