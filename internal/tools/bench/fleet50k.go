package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// The fleet50k section: the fleet at internet scale. For each size of
// -fleet-sizes, on a fresh embedded nats-server, -fleet-workers `proxyfleet
// worker` and -fleet-healths `proxyfleet health` processes over
// -fleet-hosts sim hosts with the fleet section's delays take that many
// creates published at once; then each figure is measured against its
// bound (the consts below): the time until all are in the rotation, the peak RSS of
// each process, the largest message and the bytes per change on the
// rotation subjects, the warnings logged once the burst has settled, and
// the client verbs at that size.

// fleet50kOpts are the section's flags (main.go).
type fleet50kOpts struct {
	sizes      []int
	hosts      int
	noPlans    bool // no address plans (every host has one otherwise)
	peer       bool // with plans: the largest size once more without, as the peer figure
	workers    int
	healths    int
	deadline   time.Duration // all in the rotation within this, or the size fails
	settle     time.Duration // after the last entry, before warnings count
	quiet      time.Duration // the window warnings are looked for in
	syncAlways bool
	profileDir string // worker profiles (CPU during the burst, heap after), if set
	profileFor time.Duration
	hold       time.Duration // keep the fleet up after measuring, for a look by hand
	runs       int           // runs of the largest size; its figures are the median run's
	maxProcs   int           // GOMAXPROCS of each worker and health process: 0 their share of the cores, -1 Go's default
}

// procsMaxProcs is the GOMAXPROCS each worker and health process runs
// with: o.maxProcs, or for 0 the process's share of the machine's cores
// (at least 1), as an operator gives each of several processes packed on
// one machine (docs/OPERATIONS.md, "CPU: several processes on one machine"); for
// -1, none (Go's default, every core). With Go's default, 12 processes of
// 2 each on 2 cores kept their idle threads spinning for work the others
// were waiting to run: the 50,000 burst took 125 s and 238 s of CPU, 76 s
// and 145 s with 1 each (two runs one after the other; identical runs
// move by up to half on this machine, the median of three went from 164 s
// to 106 s).
func procsMaxProcs(o fleet50kOpts, cores int) int {
	switch {
	case o.maxProcs > 0:
		return o.maxProcs
	case o.maxProcs < 0:
		return 0
	}
	return max(1, cores/max(1, o.workers+o.healths))
}

// The bounds every size must meet: a fleet of 50,000 proxies over 500
// hosts on two cores.
const (
	boundInRotationS  = 60
	boundWorkerRSSMiB = 64
	boundHealthRSSMiB = 160
	boundMaxMsgKiB    = 64
	boundBytesChange  = 1024
	boundVerbS        = 3
)

// sizeName is 2k, 12k, 50k, or the count.
func sizeName(n int) string {
	if n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// parseSizes reads "2000,12000,50000".
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-fleet-sizes: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// fleet50kResult is what one size measured.
type fleet50kResult struct {
	n                    int
	inRotation           time.Duration
	runs                 []float64 // the largest size: every run's seconds into the rotation
	stages               string
	workerHWM, healthHWM []float64 // MiB, per process
	cpuTotal             float64   // CPU seconds of every process over the burst
	workerFile           []float64 // MiB of each worker's RSS mapped from files (the binary) at the end
	maxMsg, rotBytes     int64     // on the rotation subjects (maxMsg: the feed's)
	maxSnap, snapBytes   int64     // the largest on the v1 snapshot subject, and its bytes
	rotMsgs              int64
	changes              int64 // entries put or deleted in PROXY_ROTATION
	meterLost            string
	warnings             []string // WARN and ERROR lines after the settle, by process
	verbs                map[string]float64
	verbErrs             []string
	workerStats          string
	cpu                  string // where the CPU went during the burst
	fill                 string // how the proxies spread over the hosts (hostFill)
}

func runFleet50k(ctx context.Context, b *bench) (sectionResult, error) {
	o := b.fleet50k
	raiseNoFile(b)
	bin := filepath.Join(b.dir, "proxyfleet")
	if err := buildBinary(ctx, bin); err != nil {
		return sectionResult{}, err
	}
	var results []fleet50kResult
	var errs []error
	largest := slices.Max(o.sizes)
	for _, n := range o.sizes {
		runs := 1
		if n == largest {
			runs = max(o.runs, 1)
		}
		var rs []fleet50kResult
		for i := range runs {
			start := time.Now()
			r, err := fleet50kRun(ctx, b, bin, n)
			if err != nil {
				errs = append(errs, fmt.Errorf("%d proxies (run %d): %w", n, i+1, err))
				if ctx.Err() != nil {
					break
				}
				continue
			}
			b.log.Printf("fleet50k %d: run %d of %d done in %s", n, i+1, runs, time.Since(start).Round(time.Second))
			rs = append(rs, r)
		}
		if len(rs) == 0 {
			continue
		}
		// The machine's speed moves by a tenth and more between runs
		// minutes apart: the largest size, the one the bounds are
		// about, is the run of the median time, every run listed.
		slices.SortFunc(rs, func(a, b fleet50kResult) int { return cmp.Compare(a.inRotation, b.inRotation) })
		med := rs[len(rs)/2]
		if len(rs) > 1 {
			for _, r := range rs {
				med.runs = append(med.runs, r.inRotation.Seconds())
			}
		}
		results = append(results, med)
	}
	// The peer of the same run: the largest size once more with no
	// address plan, so the cost of the plans is read against the
	// machine as it is now.
	var peer *fleet50kResult
	if o.peer && !o.noPlans && len(results) > 0 && ctx.Err() == nil {
		b.fleet50k.noPlans = true
		r, err := fleet50kRun(ctx, b, bin, largest)
		b.fleet50k.noPlans = false
		if err != nil {
			errs = append(errs, fmt.Errorf("%d proxies without plans (the peer): %w", largest, err))
		} else {
			peer = &r
		}
	}
	res := fleet50kFigures(o, results, peer)
	return res, errors.Join(errs...)
}

// buildBinary builds proxyfleet once for the section.
func buildBinary(ctx context.Context, bin string) error {
	if _, err := os.Stat(bin); err == nil {
		return nil
	}
	return goBuild(ctx, bin)
}

// raiseNoFile lifts the soft limit of open files to the hard one: the
// processes the section starts inherit it.
func raiseNoFile(b *bench) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			b.log.Printf("fleet50k: raising RLIMIT_NOFILE: %v", err)
			return
		}
	}
	b.log.Printf("fleet50k: RLIMIT_NOFILE %d", l.Cur)
}

// fleet50kRun is one size on its own server, store and sim directories.
func fleet50kRun(ctx context.Context, b *bench, bin string, n int) (res fleet50kResult, err error) {
	o := b.fleet50k
	res.n = n
	dir := filepath.Join(b.dir, "fleet50k-"+sizeName(n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	defer func() {
		if o.profileDir != "" {
			copyLogs(dir, o.profileDir, sizeName(n))
		}
		if err != nil {
			keepLogs(dir, &err)
		}
		os.RemoveAll(dir)
	}()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir + "/js", NoLog: true, NoSigs: true,
		SyncAlways: o.syncAlways, // max_payload stays the default, 1 MiB
	})
	if err != nil {
		return res, err
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		return res, errors.New("nats-server not ready")
	}
	simDir, err := simRoot(n)
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(simDir)
	cfg, err := fleet50kConfig(dir, simDir, s.ClientURL(), n, o.hosts, !o.noPlans)
	if err != nil {
		return res, err
	}
	if out, err := runCmd(ctx, time.Minute, bin, "setup", "--config", cfg); err != nil {
		return res, fmt.Errorf("proxyfleet setup: %w: %s", err, out)
	}
	procs, err := startFleetProcs(ctx, b, bin, dir, cfg, o)
	if err != nil {
		return res, err
	}
	defer procs.stop(b)
	b.log.Printf("fleet50k %d: %d workers and %d health processes ready", n, len(procs.workers), len(procs.healths))

	nc, js := connect(s.ClientURL())
	defer nc.Close()
	meter, err := newRotationMeter(s.ClientURL(), messages.NewSubjects(""))
	if err != nil {
		return res, err
	}
	defer meter.close()
	kv, err := js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		return res, err
	}
	watch, err := kv.WatchAll(ctx)
	if err != nil {
		return res, err
	}
	defer watch.Stop()
	subj := messages.NewSubjects("")
	stages := newStages(n)
	for _, sub := range []string{subj.ResultAll(), subj.StateAll()} {
		sb, err := nc.Subscribe(sub, stages.observe)
		if err != nil {
			return res, err
		}
		_ = sb.SetPendingLimits(-1, -1)
		defer sb.Unsubscribe()
	}

	cpu0 := procs.cpu()
	start := time.Now()
	stages.start = start
	var profiles sync.WaitGroup
	if o.profileDir != "" {
		profiles.Add(2)
		go func() {
			defer profiles.Done()
			procs.profileCPU(b, o, n)
		}()
		go func() {
			defer profiles.Done()
			profileSelf(ctx, b, o, n)
		}()
	}
	if err := publishCreates(ctx, js, subj, n); err != nil {
		return res, err
	}
	b.log.Printf("fleet50k %d: %d creates stored after %.1fs", n, n, time.Since(start).Seconds())
	in, changes, err := awaitRotation(ctx, watch, n, o.deadline, start, procs, b)
	res.changes = changes
	if err != nil {
		b.log.Printf("fleet50k %d: %s", n, stages)
		return res, err
	}
	lastEntry := time.Now()
	res.inRotation = lastEntry.Sub(start)
	res.cpu, res.cpuTotal = cpuSummary(cpu0, procs.cpu(), res.inRotation)
	res.stages = stages.String()
	b.log.Printf("fleet50k %d: all %d in the rotation after %.1fs; %s; %s", n, in, res.inRotation.Seconds(), res.stages, res.cpu)
	profiles.Wait()

	// The burst has settled once the last proxy entered and settle
	// passed; warnings from then on, over quiet, count.
	quietFrom := lastEntry.Add(o.settle)
	if err := sleepCtx(ctx, time.Until(quietFrom.Add(o.quiet))); err != nil {
		return res, err
	}
	res.changes += drainChanges(watch)
	res.stages = stages.String() // the results that came after the last entry too
	res.maxMsg, res.maxSnap, res.rotBytes, res.snapBytes, res.rotMsgs, res.meterLost = meter.read()
	if res.fill, err = hostFill(ctx, js, fleetRoom(n, o.hosts)); err != nil {
		return res, fmt.Errorf("read the host records: %w", err)
	}
	res.verbs, res.verbErrs = timeVerbs(ctx, bin, cfg, n)
	res.warnings = procs.warningsSince(quietFrom)
	for _, p := range procs.workers {
		res.workerHWM = append(res.workerHWM, hwmMiB(p.cmd.Process.Pid))
		res.workerFile = append(res.workerFile, rssMiB(p.cmd.Process.Pid, "RssFile:"))
	}
	for _, p := range procs.healths {
		res.healthHWM = append(res.healthHWM, hwmMiB(p.cmd.Process.Pid))
	}
	res.workerStats = scrapeStats("http://" + procs.workerAddrs[0] + "/metrics")
	if o.profileDir != "" {
		procs.profileHeaps(b, o, n)
	}
	b.log.Printf("fleet50k %d: worker peak RSS %v MiB, health %v MiB; rotation subjects: %d messages, %d bytes, largest %d on the feed, %d on the snapshot subject; %d changes; %d warnings; verbs %v; %s",
		n, res.workerHWM, res.healthHWM, res.rotMsgs, res.rotBytes, res.maxMsg, res.maxSnap, res.changes, len(res.warnings), res.verbs, res.fill)
	if o.hold > 0 {
		b.log.Printf("fleet50k %d: holding the fleet for %s: proxyfleet --config %s", n, o.hold, cfg)
		if err := sleepCtx(ctx, o.hold); err != nil {
			return res, err
		}
	}
	return res, nil
}

// fleet50kConfig writes the config of n proxies over hosts sim hosts:
// the fleet section's delays, room for all with a tenth to spare, every
// worker and health setting at its default, and every host an address
// plan (fleet50kPlan).
func fleet50kConfig(dir, simDir, url string, n, hosts int, plans bool) (string, error) {
	room := fleetRoom(n, hosts)
	var b strings.Builder
	fmt.Fprintf(&b, "nats: {url: %q}\nhosts:\n", url)
	for h := range hosts {
		plan := ""
		if plans {
			plan = ", addresses: " + fleet50kPlan(h, room)
		}
		fmt.Fprintf(&b, "  - {name: h%03d, driver: sim, max_proxies: %d, sim: {dir: %q, delay: %s, boot_delay: %s}%s}\n",
			h+1, room, filepath.Join(simDir, fmt.Sprintf("h%03d", h+1)), fleetCallDelay, fleetBootDelay, plan)
	}
	b.WriteString(`images:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
`)
	path := filepath.Join(dir, "config.yaml")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// fleetRoom is each host's max_proxies in the config of n proxies over
// hosts: its share with a tenth to spare.
func fleetRoom(n, hosts int) int {
	room := (n + hosts - 1) / hosts
	return room + max(room/10, 1)
}

// hostFill says how the proxies spread over the hosts, from their
// records in PROXY_HOSTS: the fewest, the median and the most any holds,
// and how many are full (hold room proxies).
func hostFill(ctx context.Context, js jetstream.JetStream, room int) (string, error) {
	kv, err := js.KeyValue(ctx, messages.BucketHosts)
	if err != nil {
		return "", err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return "", err
	}
	var counts []int
	for h := range keys.Keys() {
		e, err := kv.Get(ctx, h)
		if err != nil {
			return "", fmt.Errorf("host %s: %w", h, err)
		}
		r, err := messages.DecodeHostRoom(e.Value())
		if err != nil {
			return "", fmt.Errorf("host %s: %w", h, err)
		}
		counts = append(counts, len(r.Proxies))
	}
	if len(counts) == 0 {
		return "", errors.New("no host records")
	}
	slices.Sort(counts)
	full := len(counts) - sort.SearchInts(counts, room)
	return fmt.Sprintf("the hosts hold %d to %d proxies (median %d), %d of %d full (%d)",
		counts[0], counts[len(counts)-1], counts[len(counts)/2], full, len(counts), room), nil
}

// fleet50kPlan is host h's address plan in the fleet50k config: an IPv4
// block of 198.18.0.0/15 with room for its proxies (a /25 for up to 126,
// a /24 for up to 254, ...) and an IPv6 /64 of the documentation prefix,
// 16 addresses a proxy. The sim hosts send nothing to them.
func fleet50kPlan(h, room int) string {
	bits := 32 - 1
	for (1<<(32-bits))-2 < room {
		bits--
	}
	size := 1 << (32 - bits)
	base := netip.MustParseAddr("198.18.0.0").As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 + uint32(h*size)
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return fmt.Sprintf("{ipv4: [%s], ipv6: ['2001:db8:%x::/64'], ipv6_per_proxy: 16}", netip.PrefixFrom(a, bits), h+1)
}

// publishCreates publishes n creates at once (async, each with its
// Nats-Msg-Id), waiting out the client's stalls, until the server stored
// every one.
func publishCreates(ctx context.Context, js jetstream.JetStream, subj messages.Subjects, n int) error {
	for i := 0; i < n; {
		id := fmt.Sprintf("f%05d", i)
		m := nats.NewMsg(subj.Command(messages.OpCreate, id))
		m.Data = []byte(`{"v":1,"id":"` + id + `"}`)
		m.Header.Set(jetstream.MsgIDHeader, "fleet50k-"+id)
		if _, err := js.PublishMsgAsync(m); errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				return fmt.Errorf("%d commands not acknowledged within a minute", js.PublishAsyncPending())
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		} else if err != nil {
			return err
		}
		i++
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("%d of %d commands not acknowledged after 5 minutes", js.PublishAsyncPending(), n)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// awaitRotation follows PROXY_ROTATION until n keys are in it, within
// deadline of start, or a process exits. It returns the keys in and the
// puts and deletes seen.
func awaitRotation(ctx context.Context, watch jetstream.KeyWatcher, n int, deadline time.Duration, start time.Time, procs *fleetProcs, b *bench) (int, int64, error) {
	in := map[string]bool{}
	var changes int64
	limit := time.NewTimer(time.Until(start.Add(deadline)))
	defer limit.Stop()
	progress := time.NewTicker(15 * time.Second)
	defer progress.Stop()
	look := time.NewTicker(time.Second)
	defer look.Stop()
	for len(in) < n {
		select {
		case e := <-watch.Updates():
			if e == nil {
				continue
			}
			changes++
			if e.Operation() == jetstream.KeyValuePut {
				in[e.Key()] = true
			} else {
				delete(in, e.Key())
			}
		case <-progress.C:
			b.log.Printf("fleet50k %d: %d in the rotation after %.0fs", n, len(in), time.Since(start).Seconds())
		case <-look.C:
			if err := procs.exited(); err != nil {
				return len(in), changes, err
			}
		case <-limit.C:
			return len(in), changes, fmt.Errorf("%d of %d proxies in the rotation after %s: aborted", len(in), n, deadline)
		case <-ctx.Done():
			return len(in), changes, ctx.Err()
		}
	}
	return len(in), changes, nil
}

// drainChanges counts the watch's updates already delivered.
func drainChanges(watch jetstream.KeyWatcher) int64 {
	var n int64
	for {
		select {
		case e := <-watch.Updates():
			if e != nil {
				n++
			}
		default:
			return n
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// keepLogs moves the logs and config of a failed run to a directory that
// stays, and says where in *err.
func keepLogs(dir string, err *error) {
	keep, kerr := os.MkdirTemp("", "proxyfleet-bench-fleet50k")
	if kerr != nil {
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".log") || e.Name() == "config.yaml" {
			_ = os.Rename(filepath.Join(dir, e.Name()), filepath.Join(keep, e.Name()))
		}
	}
	*err = fmt.Errorf("%w (logs in %s)", *err, keep)
}

// copyLogs copies the roles' logs of a run into the profile directory,
// named after the run's size (a worker run with GODEBUG=gctrace=1 logs each
// collection's heap there).
func copyLogs(dir, to, size string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(to, "fleet50k-"+size+"-"+e.Name()), b, 0o644)
		}
	}
}

// maxOf is the largest of vs (0 for none).
func maxOf(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	return slices.Max(vs)
}

// simRoot is a new directory for the sim hosts' files of a run of n: in
// memory (/dev/shm) where the machine has it. The sim stands in for
// libvirt, whose domains live in the hypervisor's memory; on a disk, the
// sim's file creates (journalled by ext4 on this machine's virtual disk)
// cost the workers a fifth of their CPU, a cost no real host puts on them.
func simRoot(n int) (string, error) {
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	return os.MkdirTemp(base, "proxyfleet-bench-sim-"+sizeName(n)+"-")
}
