package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"proxyfleet/config"
	"proxyfleet/messages"
)

// The lifecycle section: real guests on the test host, through the whole
// system (an embedded nats-server, the proxyfleet binary's worker and
// health processes, as the cmd/proxyfleet end-to-end tests run them),
// beside a virsh script doing the same work over qemu+libssh:// to the
// same sshd.

const lifecycleGuests = 10

// realGuestCreate is what a create of the real guest adds to the body.
const realGuestCreate = `"image":"proxy-debian","memory_mib":512`

// debianImage is the real guest's image entry from the test host's env
// (make testhost builds it), if there is one.
func debianImage() (config.Image, bool) {
	disk := os.Getenv("TESTHOST_DEBIAN_DISK")
	if disk == "" {
		return config.Image{}, false
	}
	return config.Image{
		Name: "proxy-debian", URL: "file://" + disk, SHA256: os.Getenv("TESTHOST_DEBIAN_DISK_SHA256"), Format: "qcow2",
		Kernel:  &config.Artifact{URL: "file://" + os.Getenv("TESTHOST_DEBIAN_KERNEL"), SHA256: os.Getenv("TESTHOST_DEBIAN_KERNEL_SHA256")},
		Initrd:  &config.Artifact{URL: "file://" + os.Getenv("TESTHOST_DEBIAN_INITRD"), SHA256: os.Getenv("TESTHOST_DEBIAN_INITRD_SHA256")},
		Cmdline: os.Getenv("TESTHOST_DEBIAN_CMDLINE"),
	}, true
}

func runLifecycle(ctx context.Context, b *bench) (sectionResult, error) {
	f, err := startFleet(ctx, b)
	if err != nil {
		return sectionResult{}, err
	}
	defer f.stop()
	var made []string // proxy ids, for the clean-up
	defer func() { f.removeProxies(made) }()

	// A first proxy uploads the base image, kernel and initrd to the pool
	// if they are not there yet: that is not the lifecycle's time.
	made = append(made, "bw")
	if err := f.warmUp(ctx, "bw"); err != nil {
		return sectionResult{}, fmt.Errorf("warm-up: %w", err)
	}
	var ours, serial, parallel, vsSerial, vsParallel []float64
	var peer *virshPeer
	defer func() {
		if peer != nil {
			peer.cleanup()
		}
	}()
	var steps, cpus []string
	var minWall []float64
	for run := range b.runs {
		ids := make([]string, lifecycleGuests)
		for i := range ids {
			ids[i] = fmt.Sprintf("bl%d-%02d", run, i)
		}
		made = append(made, ids...)
		d, st, cpu, err := f.lifecycle(ctx, ids, peer == nil)
		if err != nil {
			return sectionResult{}, fmt.Errorf("proxyfleet run %d: %w", run+1, err)
		}
		steps = append(steps, st)
		if peer == nil {
			// The peer defines what proxyfleet defined: its XML and
			// seed were kept by the first run.
			if peer, err = newVirshPeer(b, f.cfg, f.peerXML, f.peerSeed, f.peerOverlay); err != nil {
				return sectionResult{}, err
			}
		}
		s, sCPU, sAgain, err := peer.run(ctx, run, false)
		if err != nil {
			return sectionResult{}, fmt.Errorf("virsh serial run %d: %w", run+1, err)
		}
		p, pCPU, pAgain, err := peer.run(ctx, run, true)
		if err != nil {
			return sectionResult{}, fmt.Errorf("virsh parallel run %d: %w", run+1, err)
		}
		ours, serial, parallel = append(ours, d.Seconds()), append(serial, s.Seconds()), append(parallel, p.Seconds())
		vsSerial, vsParallel = append(vsSerial, d.Seconds()/s.Seconds()), append(vsParallel, d.Seconds()/p.Seconds())
		again := ""
		if sAgain || pAgain {
			again = fmt.Sprintf(" (virsh %s run repeated: a guest got no lease within %s)", map[bool]string{true: "serial", false: "parallel"}[sAgain], peerLeaseWait)
		}
		cpus = append(cpus, fmt.Sprintf("run %d: proxyfleet %.0f s wall, guests' CPU %.0f s (%.2f cores on average); virsh serial %.0f s wall, guests' CPU %.0f s (%.2f cores); virsh parallel %.0f s wall, guests' CPU %.0f s (%.2f cores); load average at the end %s%s",
			run+1, d.Seconds(), cpu, cpu/d.Seconds(), s.Seconds(), sCPU, sCPU/s.Seconds(), p.Seconds(), pCPU, pCPU/p.Seconds(), loadAvg(), again))
		minWall = append(minWall, cpu/float64(machineInfo().Cores))
		b.log.Printf("lifecycle run %d: proxyfleet %.1fs (guests' CPU %.1fs), virsh serial %.1fs (%.1fs), virsh parallel %.1fs (%.1fs)", run+1, d.Seconds(), cpu, s.Seconds(), sCPU, p.Seconds(), pCPU)
	}

	if err := f.waitHolder(ctx); err != nil {
		return sectionResult{}, err
	}
	var rot, rotTotal, rotBoot []float64
	var rotSteps []string
	for run := range b.runs {
		id := fmt.Sprintf("br%d", run)
		made = append(made, id)
		r, err := f.rotation(ctx, id, "")
		if err != nil {
			return sectionResult{}, fmt.Errorf("rotation run %d: %w", run+1, err)
		}
		rot = append(rot, r.overhead().Seconds())
		rotTotal = append(rotTotal, r.rotation.Sub(r.sent).Seconds())
		rotBoot = append(rotBoot, r.lease.Sub(r.started).Seconds())
		rotSteps = append(rotSteps, r.String())
		b.log.Printf("rotation run %d: %s", run+1, r)
	}

	how := fmt.Sprintf("proxyfleet: one embedded nats-server (file store, sync_always), `proxyfleet setup`, one `proxyfleet worker` and one `proxyfleet health` process built from this tree, with the test host's config (.testhost/proxyfleet.yaml, worker and health settings at their defaults); %d create commands published at once, waited for until every one's result is `done` (each proxy `running` with an address), then %d deletes at once until every one is `done` (`deleted`); the wall time from the first publish to the last result. ", lifecycleGuests, lifecycleGuests)
	peerHow := fmt.Sprintf("virsh: one bash script running `virsh -c %s` (a new SSH connection per command, host key verified), per guest: vol-create-as of a qcow2 overlay on the same base volume (same capacity), vol-create-as and vol-upload of a seed volume with the seed ISO proxyfleet made, define of the domain XML proxyfleet defined (dumped with `virsh dumpxml --inactive`; only the name, UUID, MAC, mark and volume names changed: same kernel, initrd, cmdline, TCG, memory, NIC on the test network), start, a poll of `domifaddr --source lease` every %s until it shows an IPv4 address, destroy, undefine, two vol-deletes. ", peerURIDisplay, leasePoll)
	figs := []figure{
		{
			Key: "lifecycle_vs_virsh_serial", Value: median(vsSerial), Unit: "ratio", Target: atMost(0.3), Runs: vsSerial,
			Ours: fmt.Sprintf("%.1f s (median)", median(ours)), Peer: fmt.Sprintf("virsh, guests one after another: %.1f s (median)", median(serial)),
			How: how + peerHow + "Serial: the 10 guests one after another.",
		},
		{
			Key: "lifecycle_vs_virsh_parallel", Value: median(vsParallel), Unit: "ratio", Target: atMost(0.7), Runs: vsParallel,
			Ours: fmt.Sprintf("%.1f s (median)", median(ours)), Peer: fmt.Sprintf("virsh, all 10 at once: %.1f s (median)", median(parallel)),
			How: how + peerHow + "Parallel: each guest's steps in its own background process, all started at once, all waited for.",
		},
		{
			Key: "create_to_rotation_overhead_s", Value: median(rot), Unit: "s", Target: atMost(2), Runs: rot,
			Ours: fmt.Sprintf("create to rotation %.1f s, of which the guest's boot-to-lease %.1f s (medians)", median(rotTotal), median(rotBoot)),
			Peer: "the guest's own boot-to-lease time",
			How:  fmt.Sprintf("the same processes; one create command for a real guest, timed from its publish to the first message of the rotation's feed (proxy.rotation.changes) that holds it, minus the guest's own boot-to-lease time: from the domain first seen running to its DHCP lease first seen (both polled in the bench every %s through libvirt's local socket).", observePoll),
		},
	}
	// The real guest (make guest-image: Debian's cloud-init, agent and
	// squid) the same way, beside the test guest's figure of this run.
	if _, ok := debianImage(); ok {
		made = append(made, "bdw")
		if err := f.warmUpWith(ctx, "bdw", realGuestCreate); err != nil {
			return sectionResult{}, fmt.Errorf("real guest warm-up: %w", err)
		}
		var real, realBoot []float64
		var realSteps []string
		for run := range b.runs {
			id := fmt.Sprintf("bd%d", run)
			made = append(made, id)
			r, err := f.rotation(ctx, id, realGuestCreate)
			if err != nil {
				return sectionResult{}, fmt.Errorf("real guest rotation run %d: %w", run+1, err)
			}
			real = append(real, r.rotation.Sub(r.sent).Seconds())
			realBoot = append(realBoot, r.lease.Sub(r.started).Seconds())
			realSteps = append(realSteps, r.String())
			b.log.Printf("real guest rotation run %d: %s", run+1, r)
		}
		figs = append(figs, figure{
			Key: "real_guest_create_to_rotation_s", Value: median(real), Unit: "s", Target: atMost(90), Runs: real,
			Ours:  fmt.Sprintf("real guest: create to rotation %.1f s, of which its boot-to-lease %.1f s (medians)", median(real), median(realBoot)),
			Peer:  fmt.Sprintf("the test guest, same run: create to rotation %.1f s, boot-to-lease %.1f s (medians)", median(rotTotal), median(rotBoot)),
			How:   "as create_to_rotation_overhead_s, with the Debian 12 guest of `make guest-image` (cloud-init 22.4, qemu-guest-agent 7.2, squid 5.7 configured by the default user-data with the credential and allow-list; 1 vCPU, 512 MiB, TCG) instead of the test guest; its base image uploaded by a warm-up proxy first. A proxy enters after two probes through squid with the credential, and a request without it refused (407).",
			Bound: "per run: " + strings.Join(realSteps, "; ") + ". The guest's own boot under TCG (kernel, systemd, cloud-init's stages; squid starts from cloud-init's last stage, runcmd) is most of it.",
		})
	}
	for i := range figs[:2] {
		figs[i].Bound = lifecycleBound(median(minWall), median(serial), median(parallel), cpus)
	}
	figs[2].Bound = "per run (create publish → domain running → lease → `running` event → first probe → rotation): " + strings.Join(rotSteps, "; ")
	notes := "Per-step timings of each proxyfleet lifecycle run (from the worker's state events):\n\n" + strings.Join(steps, "\n") + "\n"
	return sectionResult{figures: figs, notes: notes}, nil
}

// lifecycleBound names what bounds the lifecycle figures: the guests' own
// boots, whose CPU time (of their qemu processes, sampled from /proc) both
// sides pay on the same cores.
func lifecycleBound(minWall, serial, parallel float64, runs []string) string {
	return fmt.Sprintf("the 10 TCG guests' own CPU time: the qemu processes of proxyfleet's guests used %.0f s of CPU per run divided by %d cores (median), a wall time no control plane can go below here even with every core for the guests (other work on the machine takes its share: see the cores the guests got on average per run); against virsh one by one (%.0f s) that floor alone is a ratio of %.2f, against virsh all at once (%.0f s) %.2f. Per run: %s.",
		minWall*float64(machineInfo().Cores), machineInfo().Cores, serial, minWall/serial, parallel, minWall/parallel, strings.Join(runs, "; "))
}

// fleet is the embedded server and the proxyfleet processes.
type fleet struct {
	b     *bench
	srv   *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	cfg   *config.Config
	path  string
	procs []*exec.Cmd

	mu         sync.Mutex
	results    map[string]messages.Result // by command id, final ones
	events     map[string][]timedEvent
	inRotation map[string]time.Time // id -> first feed message that held it

	peerXML, peerOverlay string // from the first run, for the virsh peer
	peerSeed             string // path of the seed ISO proxyfleet made
	healthAddr           string // the health process's /healthz
	workerAddr           string // the worker's /metrics
}

type timedEvent struct {
	at time.Time
	ev messages.StateEvent
}

func startFleet(ctx context.Context, b *bench) (_ *fleet, err error) {
	f := &fleet{b: b, results: map[string]messages.Result{}, events: map[string][]timedEvent{}, inRotation: map[string]time.Time{}}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	bin := filepath.Join(b.dir, "proxyfleet")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/proxyfleet").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	dir := filepath.Join(b.dir, "lifecycle")
	if f.srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true, SyncAlways: true}); err != nil {
		return nil, err
	}
	go f.srv.Start()
	if !f.srv.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("nats-server not ready")
	}
	cpath := os.Getenv("PROXYFLEET_CONFIG")
	if cpath == "" {
		cpath = ".testhost/proxyfleet.yaml"
	}
	if f.cfg, err = config.Load(cpath); err != nil {
		return nil, fmt.Errorf("test host config: %w", err)
	}
	if err := f.cfg.LoadSecrets(nil); err != nil {
		return nil, fmt.Errorf("test host config: %w", err)
	}
	if img, ok := debianImage(); ok {
		f.cfg.Images = append(f.cfg.Images, img)
	}
	rootIP := cmp.Or(os.Getenv("TESTHOST_ROOT_IP"), "198.18.0.1")
	f.cfg.NATS.URL = f.srv.ClientURL()
	// Probes leave from the root namespace's test address, where the
	// guests are reached; everything else stays at its default.
	f.cfg.Health.HTTP = "127.0.0.1:0"
	f.cfg.Health.ProbeListen = rootIP + ":0"
	y, err := yaml.Marshal(f.cfg)
	if err != nil {
		return nil, err
	}
	f.path = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(f.path, y, 0o600); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, bin, "setup", "--config", f.path).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("proxyfleet setup: %v\n%s", err, out)
	}
	f.nc, f.js = connect(f.srv.ClientURL())
	if _, err := f.nc.Subscribe("proxy.>", f.record); err != nil {
		return nil, err
	}
	if err := f.nc.Flush(); err != nil {
		return nil, err
	}
	f.healthAddr, f.workerAddr = freeAddr(), freeAddr()
	for _, args := range [][]string{
		{"worker", "--config", f.path, "--debug", "--http", f.workerAddr},
		{"health", "--config", f.path, "--http", f.healthAddr},
	} {
		logf, err := os.Create(filepath.Join(dir, args[0]+".log"))
		if err != nil {
			return nil, err
		}
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = logf, logf
		if err := c.Start(); err != nil {
			logf.Close()
			return nil, err
		}
		logf.Close()
		f.procs = append(f.procs, c)
	}
	b.log.Printf("lifecycle: worker and health running, logs in %s", dir)
	return f, nil
}

func (f *fleet) stop() {
	for _, c := range f.procs {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	f.procs = nil
	if f.nc != nil {
		f.nc.Close()
	}
	if f.srv != nil {
		f.srv.Shutdown()
	}
}

func (f *fleet) record(m *nats.Msg) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.HasPrefix(m.Subject, "proxy.state."):
		var ev messages.StateEvent
		if json.Unmarshal(m.Data, &ev) == nil {
			f.events[ev.ID] = append(f.events[ev.ID], timedEvent{now, ev})
		}
	case strings.HasPrefix(m.Subject, "proxy.result."):
		var r messages.Result
		if json.Unmarshal(m.Data, &r) == nil && r.Outcome != messages.OutcomeAccepted {
			f.results[r.CommandID] = r
		}
	case m.Subject == "proxy.rotation.changes":
		// The feed carries each change as it is published (the
		// snapshot, on proxy.rotation, at most one a second).
		var feed messages.RotationChanges
		if json.Unmarshal(m.Data, &feed) == nil {
			for _, c := range feed.Changes {
				if _, ok := f.inRotation[c.ID]; !ok && c.Proxy != nil {
					f.inRotation[c.ID] = now
				}
			}
		}
	}
}

// command publishes a create or delete of id and returns its command id.
func (f *fleet) command(ctx context.Context, op, id string) (string, error) {
	return f.commandWith(ctx, op, id, "")
}

// commandWith is command with more fields in the body (extra: `"k":v,…`).
func (f *fleet) commandWith(ctx context.Context, op, id, extra string) (string, error) {
	cmdID := fmt.Sprintf("%s-%s-%d", op, id, time.Now().UnixNano())
	m := nats.NewMsg(fmt.Sprintf("proxy.cmd.%s.%s", op, id))
	if extra != "" {
		extra = "," + extra
	}
	m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q%s}`, id, extra))
	m.Header.Set(jetstream.MsgIDHeader, cmdID)
	if _, err := f.js.PublishMsg(ctx, m); err != nil {
		return "", fmt.Errorf("publish %s %s: %w", op, id, err)
	}
	return cmdID, nil
}

// waitDone waits until every command has a final result, and fails on
// any other outcome than done.
func (f *fleet) waitDone(ctx context.Context, bound time.Duration, cmdIDs []string) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		f.mu.Lock()
		left := 0
		for _, c := range cmdIDs {
			r, ok := f.results[c]
			switch {
			case !ok:
				left++
			case r.Outcome != messages.OutcomeDone:
				f.mu.Unlock()
				return fmt.Errorf("command %s: %s: %s", c, r.Outcome, r.Reason)
			}
		}
		f.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d commands not done: %w", left, len(cmdIDs), ctx.Err())
		case <-t.C:
		}
	}
}

// lifecycle creates ids at once, waits until all run, deletes them at
// once and waits until all are deleted. keep: save the first guest's
// domain XML, overlay XML and seed for the virsh peer before the deletes.
func (f *fleet) lifecycle(ctx context.Context, ids []string, keep bool) (time.Duration, string, float64, error) {
	calls0, _ := scrapeCalls(f.workerAddr)
	cpu := sampleGuestCPU("pf-" + strings.TrimSuffix(ids[0], "00"))
	defer func() {
		if cpu != nil {
			cpu.seconds()
		}
	}()
	start := time.Now()
	var cmds []string
	for _, id := range ids {
		c, err := f.command(ctx, messages.OpCreate, id)
		if err != nil {
			return 0, "", 0, err
		}
		cmds = append(cmds, c)
	}
	if err := f.waitDone(ctx, 10*time.Minute, cmds); err != nil {
		return 0, "", 0, fmt.Errorf("creates: %w", err)
	}
	created := time.Now()
	var pause time.Duration
	if keep {
		if err := f.keepForPeer(ctx, ids[0]); err != nil {
			return 0, "", 0, err
		}
		pause = time.Since(created) // not the system's time: left out
	}
	cmds = cmds[:0]
	for _, id := range ids {
		c, err := f.command(ctx, messages.OpDelete, id)
		if err != nil {
			return 0, "", 0, err
		}
		cmds = append(cmds, c)
	}
	if err := f.waitDone(ctx, 5*time.Minute, cmds); err != nil {
		return 0, "", 0, fmt.Errorf("deletes: %w", err)
	}
	total := time.Since(start) - pause
	secs := cpu.seconds()
	cpu = nil
	st := f.steps(start, created, ids)
	if calls, err := scrapeCalls(f.workerAddr); err == nil {
		st += "; " + calls.since(calls0)
	}
	return total, st, secs, nil
}

// warmUp creates and deletes one proxy.
func (f *fleet) warmUp(ctx context.Context, id string) error {
	return f.warmUpWith(ctx, id, "")
}

// warmUpWith is warmUp with more fields in the create (commandWith).
func (f *fleet) warmUpWith(ctx context.Context, id, extra string) error {
	start := time.Now()
	c, err := f.commandWith(ctx, messages.OpCreate, id, extra)
	if err != nil {
		return err
	}
	if err := f.waitDone(ctx, 10*time.Minute, []string{c}); err != nil {
		return err
	}
	d, err := f.command(ctx, messages.OpDelete, id)
	if err != nil {
		return err
	}
	if err := f.waitDone(ctx, 5*time.Minute, []string{d}); err != nil {
		return err
	}
	f.b.log.Printf("lifecycle: warm-up proxy created and deleted in %.1fs", time.Since(start).Seconds())
	return nil
}

// steps summarises the state events of ids: when the first and last
// provisioning, running and deleted events came, after start.
func (f *fleet) steps(start, created time.Time, ids []string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	first, last := map[string]time.Duration{}, map[string]time.Duration{}
	for _, id := range ids {
		seen := map[string]bool{}
		for _, te := range f.events[id] {
			if te.at.Before(start) || seen[te.ev.State] {
				continue
			}
			seen[te.ev.State] = true
			d := te.at.Sub(start)
			if v, ok := first[te.ev.State]; !ok || d < v {
				first[te.ev.State] = d
			}
			last[te.ev.State] = max(last[te.ev.State], d)
		}
	}
	var parts []string
	for _, s := range []string{messages.StateProvisioning, messages.StateRunning, messages.StateDeleting, messages.StateDeleted} {
		if _, ok := first[s]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f–%.1f s", s, first[s].Seconds(), last[s].Seconds()))
		}
	}
	return fmt.Sprintf("- %s…: all created at %.1f s; first–last event: %s", ids[0], created.Sub(start).Seconds(), strings.Join(parts, ", "))
}

// waitHolder waits until the health process holds the lease (it publishes
// the rotation).
func (f *fleet) waitHolder(ctx context.Context) error {
	c := &http.Client{Timeout: 2 * time.Second}
	for range 120 {
		if resp, err := c.Get("http://" + f.healthAddr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.Header.Get("X-Proxyfleet-Lease") == "holder" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return errors.New("the health process does not hold the lease after a minute")
}
