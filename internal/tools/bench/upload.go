package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"proxyfleet/kvm"
)

// The upload section: one 512 MiB file, uploaded into the test host's
// directory pool b.runs times by each of proxyfleet (the image cache of a
// kvm provider, as a create's first step), `virsh vol-upload` over
// qemu+ssh:// and `scp`, all to the same sshd.

const (
	uploadSize     = 512 << 20
	uploadHost     = "bench-up" // the provider's host entry: its cached volumes are pf-base-bench-up-*
	uploadImage    = "bench-upload"
	uploadVirshVol = "bench-virsh-upload.raw"
	uploadScpFile  = ".bench-scp-upload"
)

// uploadEnv is what the section reads from .testhost/env.
type uploadEnv struct {
	addr, user, key, knownHosts, socket, pool string
	uri                                       string // qemu+ssh:// to the same sshd, for virsh
	sshWrapper                                string // the ssh that virsh runs: known_hosts checked
	poolDir                                   string
}

func runUpload(ctx context.Context, b *bench) (sectionResult, error) {
	env, err := newUploadEnv(ctx, b)
	if err != nil {
		return sectionResult{}, err
	}
	file, sum, err := writeUploadFile(b.dir)
	if err != nil {
		return sectionResult{}, err
	}
	defer os.Remove(file)
	defer env.cleanup(context.WithoutCancel(ctx), b)

	var ours, virsh, scp, cat, vsVirsh, vsScp []float64
	mib := float64(uploadSize) / (1 << 20)
	for i := range b.runs {
		if err := env.cleanup(ctx, b); err != nil {
			return sectionResult{}, err
		}
		o, err := env.oursOnce(ctx, file, sum)
		if err != nil {
			return sectionResult{}, fmt.Errorf("proxyfleet upload: %w", err)
		}
		v, err := env.virshOnce(ctx, file)
		if err != nil {
			return sectionResult{}, fmt.Errorf("virsh vol-upload: %w", err)
		}
		s, err := env.scpOnce(ctx, file)
		if err != nil {
			return sectionResult{}, fmt.Errorf("scp: %w", err)
		}
		c, err := env.catOnce(ctx, file)
		if err != nil {
			return sectionResult{}, fmt.Errorf("ssh cat: %w", err)
		}
		or, vr, sr, cr := mib/o.Seconds(), mib/v.Seconds(), mib/s.Seconds(), mib/c.Seconds()
		ours, virsh, scp, cat = append(ours, or), append(virsh, vr), append(scp, sr), append(cat, cr)
		vsVirsh, vsScp = append(vsVirsh, or/vr), append(vsScp, or/sr)
		b.log.Printf("upload run %d: proxyfleet %.1f MiB/s, virsh %.1f MiB/s, scp %.1f MiB/s, ssh cat %.1f MiB/s", i+1, or, vr, sr, cr)
	}
	// What an upload over SSH costs with nothing else around it:
	// OpenSSH's ssh itself piping the file into a file of the pool, in
	// the same runs (the bound of a missed target; otherwise a note).
	bound := fmt.Sprintf("`ssh host 'cat > file'` (OpenSSH, its default cipher order) of the same file into the pool directory, in the same runs: %.1f MiB/s (median of %v); proxyfleet reached %.2f of it.",
		median(cat), rounded(cat), median(ours)/median(cat))
	how := fmt.Sprintf("the same %d MiB file of pseudo-random bytes, in page cache on this machine, uploaded %d times by each side into the test host's directory pool %s (%s) through its sshd at %s, one after another within each run; wall time of each whole command. proxyfleet: a fresh kvm provider per run (host entry %s, image %s at a file:// URL with its sha256), EnsureImage, the first step of a create: connect, claim the volume, transfer, verify length and sha256, mark, read back. ",
		uploadSize>>20, b.runs, env.pool, env.poolDir, env.addr, uploadHost, uploadImage)
	fs := []figure{{
		Key: "upload_vs_virsh", Value: median(vsVirsh), Unit: "ratio", Target: atLeast(1.0), Runs: vsVirsh,
		Ours:  fmt.Sprintf("%.1f MiB/s (median of %v)", median(ours), rounded(ours)),
		Peer:  fmt.Sprintf("virsh vol-upload %.1f MiB/s (median of %v)", median(virsh), rounded(virsh)),
		How:   how + "virsh: `virsh -c qemu+ssh://... vol-upload` into a volume of the same size made before (vol-create-as, not timed), OpenSSH's ssh with the same key and known_hosts (StrictHostKeyChecking yes) as its transport; ratio = proxyfleet MiB/s / virsh MiB/s, per run.",
		Bound: bound,
	}, {
		Key: "upload_vs_scp", Value: median(vsScp), Unit: "ratio", Target: atLeast(0.85), Runs: vsScp,
		Ours:  fmt.Sprintf("%.1f MiB/s (median of %v)", median(ours), rounded(ours)),
		Peer:  fmt.Sprintf("scp %.1f MiB/s (median of %v)", median(scp), rounded(scp)),
		How:   how + "scp: OpenSSH scp (its default cipher order) of the same file into the pool directory, same key and known_hosts (StrictHostKeyChecking yes); ratio = proxyfleet MiB/s / scp MiB/s, per run.",
		Bound: bound,
	}}
	for i := range fs {
		if fs[i].check(); fs[i].Met {
			fs[i].Bound = "" // only a missed target needs its bound
		}
	}
	notes := "Uploads over SSH with nothing else: " + bound + "\n"
	return sectionResult{figures: fs, notes: notes}, nil
}

func rounded(vs []float64) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = float64(int(v*10+0.5)) / 10
	}
	return out
}

func newUploadEnv(ctx context.Context, b *bench) (*uploadEnv, error) {
	e := &uploadEnv{
		addr: os.Getenv("TESTHOST_SSH_ADDR"), user: os.Getenv("TESTHOST_SSH_USER"),
		key: os.Getenv("TESTHOST_SSH_KEY"), knownHosts: os.Getenv("TESTHOST_KNOWN_HOSTS"),
		socket: os.Getenv("TESTHOST_LIBVIRT_SOCKET"), pool: os.Getenv("TESTHOST_POOL"),
	}
	for k, v := range map[string]string{"TESTHOST_SSH_ADDR": e.addr, "TESTHOST_SSH_USER": e.user, "TESTHOST_SSH_KEY": e.key, "TESTHOST_KNOWN_HOSTS": e.knownHosts, "TESTHOST_POOL": e.pool} {
		if v == "" {
			return nil, fmt.Errorf("%s is not set (source .testhost/env)", k)
		}
	}
	host, port, err := net.SplitHostPort(e.addr)
	if err != nil {
		return nil, fmt.Errorf("TESTHOST_SSH_ADDR: %w", err)
	}
	// virsh runs ssh itself; this wrapper makes it check the test host's
	// key against the test known_hosts, as our side and scp do.
	e.sshWrapper = filepath.Join(b.dir, "bench-ssh")
	wrapper := fmt.Sprintf("#!/bin/sh\nexec ssh -o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o BatchMode=yes \"$@\"\n", shellQuote(e.knownHosts))
	if err := os.WriteFile(e.sshWrapper, []byte(wrapper), 0o755); err != nil {
		return nil, err
	}
	e.uri = fmt.Sprintf("qemu+ssh://%s@%s:%s/system?keyfile=%s&command=%s", e.user, host, port, e.key, e.sshWrapper)
	x, err := e.virsh(ctx, "pool-dumpxml", e.pool)
	if err != nil {
		return nil, err
	}
	var def libvirtxml.StoragePool
	if err := def.Unmarshal(x); err != nil {
		return nil, fmt.Errorf("pool %s xml: %w", e.pool, err)
	}
	if def.Type != "dir" || def.Target == nil || def.Target.Path == "" {
		return nil, fmt.Errorf("pool %s is not a directory pool (type %q)", e.pool, def.Type)
	}
	e.poolDir = def.Target.Path
	return e, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// writeUploadFile writes the upload's file once: pseudo-random bytes (a
// fast generator; no compression anywhere could shrink them).
func writeUploadFile(dir string) (path, sum string, err error) {
	path = filepath.Join(dir, "upload.raw")
	f, err := os.Create(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	r := rand.NewChaCha8([32]byte{'p', 'f'})
	if _, err := io.CopyN(w, r, uploadSize); err != nil {
		return "", "", err
	}
	if err := w.Flush(); err != nil {
		return "", "", err
	}
	return path, hex.EncodeToString(h.Sum(nil)), f.Close()
}

func (e *uploadEnv) virsh(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", e.uri}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// oursOnce uploads file through a fresh provider's image cache.
func (e *uploadEnv) oursOnce(ctx context.Context, file, sum string) (time.Duration, error) {
	p, err := kvm.New(kvm.Options{
		Host: kvm.HostOptions{
			Name: uploadHost, Address: e.addr, User: e.user, KeyFile: e.key, KnownHosts: e.knownHosts,
			Socket: e.socket, Pool: e.pool, DomainType: kvm.DomainQEMU,
		},
		Images: []kvm.ImageSource{{Name: uploadImage, URL: "file://" + file, SHA256: sum, Format: "raw"}},
		// Only an image is uploaded: no proxy is made.
		Proxy:  kvm.GuestProxy{Open: true},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return 0, err
	}
	defer p.Close()
	start := time.Now()
	if err := p.EnsureImage(ctx, uploadImage); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// virshOnce uploads file with virsh vol-upload into a volume made first.
func (e *uploadEnv) virshOnce(ctx context.Context, file string) (time.Duration, error) {
	if _, err := e.virsh(ctx, "vol-create-as", e.pool, uploadVirshVol, fmt.Sprint(uploadSize), "--format", "raw"); err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := e.virsh(ctx, "vol-upload", "--pool", e.pool, uploadVirshVol, file); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (e *uploadEnv) sshArgs() []string {
	return []string{"-i", e.key, "-o", "UserKnownHostsFile=" + e.knownHosts, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"}
}

// scpOnce copies file with scp into the pool directory.
func (e *uploadEnv) scpOnce(ctx context.Context, file string) (time.Duration, error) {
	host, port, _ := net.SplitHostPort(e.addr)
	args := append(e.sshArgs(), "-q", "-P", port, file, e.user+"@"+host+":"+filepath.Join(e.poolDir, uploadScpFile))
	start := time.Now()
	if out, err := exec.CommandContext(ctx, "scp", args...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return time.Since(start), nil
}

// catOnce pipes file through OpenSSH's ssh into `cat` writing a file in
// the pool directory: what any upload over SSH costs, with nothing else.
func (e *uploadEnv) catOnce(ctx context.Context, file string) (time.Duration, error) {
	host, port, _ := net.SplitHostPort(e.addr)
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	args := append(e.sshArgs(), "-p", port, e.user+"@"+host, "cat > "+shellQuote(filepath.Join(e.poolDir, uploadScpFile)))
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Stdin = f
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return time.Since(start), nil
}

// cleanup removes what the section made on the test host: the provider's
// cached volumes and marks, virsh's volume and scp's file.
func (e *uploadEnv) cleanup(ctx context.Context, b *bench) error {
	host, port, _ := net.SplitHostPort(e.addr)
	args := append(e.sshArgs(), "-p", port, e.user+"@"+host, "rm -f -- "+shellQuote(filepath.Join(e.poolDir, uploadScpFile)))
	if out, err := exec.CommandContext(ctx, "ssh", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("remove scp's file: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if _, err := e.virsh(ctx, "pool-refresh", e.pool); err != nil {
		return err
	}
	out, err := e.virsh(ctx, "vol-list", e.pool) // "name path" lines (-q: no header)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		if name == uploadVirshVol || strings.HasPrefix(name, "pf-base-"+uploadHost+"-") {
			if _, err := e.virsh(ctx, "vol-delete", "--pool", e.pool, name); err != nil {
				return err
			}
			b.log.Printf("upload: removed volume %s", name)
		}
	}
	return nil
}
