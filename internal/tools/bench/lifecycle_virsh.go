package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"libvirt.org/go/libvirtxml"

	"proxyfleet/config"
)

// The virsh peer: one bash script over qemu+ssh:// to the test host's sshd
// (the ssh binary, the test key, the host key checked against the test
// host's known_hosts), doing for each guest what proxyfleet does.

const (
	leasePoll      = "1s" // the script's pause between two lease reads
	peerURIDisplay = "qemu+ssh://root@$TESTHOST_NS_IP/system"
)

// localVirsh runs virsh on the test host's daemon through its local socket,
// for the bench's own set-up and clean-up (not timed).
func localVirsh(ctx context.Context, args ...string) (string, error) {
	uri := cmp.Or(os.Getenv("TESTHOST_URI"), "qemu:///system")
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", uri}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// keepForPeer saves what proxyfleet made for proxy id: its domain XML, its
// overlay's definition and its seed ISO.
func (f *fleet) keepForPeer(ctx context.Context, id string) error {
	pool := f.cfg.Hosts[0].Pool
	x, err := localVirsh(ctx, "dumpxml", "--inactive", "pf-"+id)
	if err != nil {
		return err
	}
	v, err := localVirsh(ctx, "vol-dumpxml", "--pool", pool, "pf-"+id+"-disk.qcow2")
	if err != nil {
		return err
	}
	seed := filepath.Join(f.b.dir, "seed.iso")
	if _, err := localVirsh(ctx, "vol-download", "--pool", pool, "pf-"+id+"-seed.iso", seed); err != nil {
		return err
	}
	f.peerXML, f.peerOverlay, f.peerSeed = x, v, seed
	return nil
}

type virshPeer struct {
	b      *bench
	dir    string
	script string
	env    []string
	names  []string
	pool   string
}

// newVirshPeer writes the peer's domain definitions and its script.
func newVirshPeer(b *bench, cfg *config.Config, domXML, seed, overlayXML string) (*virshPeer, error) {
	pool := cfg.Hosts[0].Pool
	var vol libvirtxml.StorageVolume
	if err := vol.Unmarshal(overlayXML); err != nil {
		return nil, fmt.Errorf("overlay xml: %w", err)
	}
	if vol.BackingStore == nil || vol.BackingStore.Format == nil || vol.Capacity == nil {
		return nil, errors.New("overlay xml: no backing store or capacity")
	}
	capacity, err := bytesOf(vol.Capacity)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(seed)
	if err != nil {
		return nil, err
	}
	p := &virshPeer{b: b, dir: filepath.Join(b.dir, "virsh"), pool: pool}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	for i := range lifecycleGuests {
		name := fmt.Sprintf("vb-%02d", i)
		p.names = append(p.names, name)
		var d libvirtxml.Domain
		if err := d.Unmarshal(domXML); err != nil {
			return nil, fmt.Errorf("domain xml: %w", err)
		}
		d.Name, d.UUID, d.Metadata = name, "", nil
		for j := range d.Devices.Disks {
			s := d.Devices.Disks[j].Source
			if s == nil || s.Volume == nil {
				return nil, errors.New("domain xml: a disk without a pool volume")
			}
			if strings.HasSuffix(s.Volume.Volume, "-disk.qcow2") {
				s.Volume.Volume = name + "-disk.qcow2"
			} else {
				s.Volume.Volume = name + "-seed.iso"
			}
		}
		for j := range d.Devices.Interfaces {
			d.Devices.Interfaces[j].MAC = nil // a new one, as for a new proxy
		}
		for j := range d.Devices.Channels {
			if s := d.Devices.Channels[j].Source; s != nil && s.UNIX != nil {
				s.UNIX.Path = ""
			}
		}
		x, err := d.Marshal()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(p.dir, name+".xml"), []byte(x), 0o644); err != nil {
			return nil, err
		}
	}
	ssh := filepath.Join(p.dir, "ssh")
	sshScript := fmt.Sprintf("#!/bin/sh\nexec ssh -o UserKnownHostsFile=%q -o StrictHostKeyChecking=yes -o BatchMode=yes -i %q \"$@\"\n",
		os.Getenv("TESTHOST_KNOWN_HOSTS"), os.Getenv("TESTHOST_SSH_KEY"))
	if err := os.WriteFile(ssh, []byte(sshScript), 0o755); err != nil {
		return nil, err
	}
	user := cmp.Or(os.Getenv("TESTHOST_SSH_USER"), "root")
	host := cmp.Or(os.Getenv("TESTHOST_NS_IP"), "198.18.0.2")
	p.script = filepath.Join(p.dir, "lifecycle.sh")
	if err := os.WriteFile(p.script, []byte(virshScript), 0o755); err != nil {
		return nil, err
	}
	p.env = append(os.Environ(),
		"URI="+fmt.Sprintf("qemu+ssh://%s@%s/system?command=%s&no_tty=1", user, host, ssh),
		"POOL="+pool, "DIR="+p.dir, "CAP="+strconv.FormatUint(capacity, 10),
		"BASE="+vol.BackingStore.Path, "BFMT="+vol.BackingStore.Format.Type,
		"SEED="+seed, "SEEDSIZE="+strconv.FormatInt(st.Size(), 10), "POLL="+strings.TrimSuffix(leasePoll, "s"),
		"LEASE_WAIT="+strconv.Itoa(int(peerLeaseWait.Seconds())))
	return p, nil
}

func bytesOf(s *libvirtxml.StorageVolumeSize) (uint64, error) {
	switch s.Unit {
	case "", "bytes", "B", "b":
		return s.Value, nil
	}
	return 0, fmt.Errorf("volume size in %q", s.Unit)
}

// virshScript does each guest's lifecycle: serially, or with "parallel"
// as its first argument each guest in its own background process.
const virshScript = `#!/bin/bash
set -euo pipefail
v() { virsh -q -c "$URI" "$@"; }
guest() {
	local n=$1
	v vol-create-as "$POOL" "$n-disk.qcow2" "$CAP" --format qcow2 --backing-vol "$BASE" --backing-vol-format "$BFMT" >/dev/null
	v vol-create-as "$POOL" "$n-seed.iso" "$SEEDSIZE" --format raw >/dev/null
	v vol-upload --pool "$POOL" "$n-seed.iso" "$SEED"
	v define "$DIR/$n.xml" >/dev/null
	v start "$n" >/dev/null
	local deadline=$((SECONDS + LEASE_WAIT))
	until v domifaddr "$n" --source lease | grep -q 'ipv4'; do
		[ "$SECONDS" -lt "$deadline" ] || { echo "$n: no lease within ${LEASE_WAIT}s" >&2; return 1; }
		sleep "$POLL"
	done
	v destroy "$n" >/dev/null
	v undefine "$n" >/dev/null
	v vol-delete --pool "$POOL" "$n-disk.qcow2" >/dev/null
	v vol-delete --pool "$POOL" "$n-seed.iso" >/dev/null
}
mode=$1; shift
if [ "$mode" = serial ]; then
	for n in "$@"; do guest "$n"; done
	exit 0
fi
pids=()
for n in "$@"; do guest "$n" & pids+=($!); done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
exit $fail
`

// peerLeaseWait bounds the peer's wait for one guest's lease. A test guest
// boots to its lease in seconds; one now and then hangs in its boot on a
// loaded machine and never gets one, on either side (it did in a bench run
// of the virsh peer: 15 minutes idle, no agent, no lease), which is the
// guest's, not the peer's, so that run is repeated once (retried).
const peerLeaseWait = 5 * time.Minute

// run times one run of the script, once more if the first fails (see
// peerLeaseWait; retried says so); whatever happens, it removes what the
// script made before it returns.
func (p *virshPeer) run(ctx context.Context, run int, parallel bool) (d time.Duration, cpu float64, retried bool, err error) {
	d, cpu, err = p.runOnce(ctx, run, parallel, "")
	if err == nil || ctx.Err() != nil {
		return d, cpu, false, err
	}
	p.b.log.Printf("lifecycle: %v; running it again", err)
	d, cpu, err = p.runOnce(ctx, run, parallel, "-again")
	return d, cpu, true, err
}

func (p *virshPeer) runOnce(ctx context.Context, run int, parallel bool, suffix string) (time.Duration, float64, error) {
	mode := "serial"
	if parallel {
		mode = "parallel"
	}
	defer p.cleanup()
	logPath := filepath.Join(p.dir, fmt.Sprintf("%s-%d%s.log", mode, run, suffix))
	logf, err := os.Create(logPath)
	if err != nil {
		return 0, 0, err
	}
	defer logf.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	c := exec.CommandContext(rctx, "bash", append([]string{p.script, mode}, p.names...)...)
	c.Env, c.Stdout, c.Stderr = p.env, logf, logf
	// Its own process group: a timeout or a signal ends every guest's
	// background process, not only the script.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	cpu := sampleGuestCPU("vb-")
	start := time.Now()
	err = c.Run()
	d, secs := time.Since(start), cpu.seconds()
	if err != nil {
		return 0, 0, fmt.Errorf("virsh %s script: %w (log %s)", mode, err, logPath)
	}
	return d, secs, nil
}

// cleanup removes every domain and volume the peer may have made.
func (p *virshPeer) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range p.names {
		_, _ = localVirsh(ctx, "destroy", n)
		_, _ = localVirsh(ctx, "undefine", n)
		_, _ = localVirsh(ctx, "vol-delete", "--pool", p.pool, n+"-disk.qcow2")
		_, _ = localVirsh(ctx, "vol-delete", "--pool", p.pool, n+"-seed.iso")
	}
}

// removeProxies deletes proxyfleet's domains and volumes of ids from the
// host, whatever happened to the commands (the section made them all).
func (f *fleet) removeProxies(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := f.cfg.Hosts[0].Pool
	doms, _ := localVirsh(ctx, "list", "--all", "--name")
	vols, _ := localVirsh(ctx, "vol-list", "--pool", pool)
	there := map[string]bool{}
	for _, l := range strings.Split(doms+"\n"+vols, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			there[f[0]] = true
		}
	}
	for _, id := range ids {
		n := "pf-" + id
		if there[n] {
			f.b.log.Printf("lifecycle: removing leftover domain %s", n)
			_, _ = localVirsh(ctx, "destroy", n)
			_, _ = localVirsh(ctx, "undefine", n, "--nvram")
		}
		for _, v := range []string{n + "-disk.qcow2", n + "-seed.iso"} {
			if there[v] {
				f.b.log.Printf("lifecycle: removing leftover volume %s", v)
				_, _ = localVirsh(ctx, "vol-delete", "--pool", pool, v)
			}
		}
	}
}
