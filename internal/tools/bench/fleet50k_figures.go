package main

import (
	"fmt"
	"runtime"
	"strings"
)

// fleet50kFigures turns each size's measurements into figures, each with
// its bound, and a note with how every figure grows with the fleet.
func fleet50kFigures(o fleet50kOpts, results []fleet50kResult, peer *fleet50kResult) sectionResult {
	sync := "at the server's default sync interval, as a 3-node cluster runs it (nats.conf's `sync_interval: always` is for a single node: with it every stored write waits for its own fsync, which is what bounds `fleet_2000_s`)"
	if o.syncAlways {
		sync = "with sync_always, as nats.conf"
	}
	how := fmt.Sprintf("one embedded nats-server in the bench process (not a 3-node cluster; file store %s, default limits: max_payload 1 MiB), `proxyfleet setup`, then %d `proxyfleet worker` and %d `proxyfleet health` processes (the binary built once)%s, all started at once, on a config of %d hosts of driver `sim` (%s per call, %s from create to an address; max_proxies the fleet's share of each host plus a tenth; %s; the sim hosts' files in /dev/shm, as a hypervisor keeps its domains in memory) with every worker and health setting at its default (health probes nothing on sim hosts: a `running` event with an address puts a proxy in the rotation). The size's create commands (no host named) are published at once (async, each with a Nats-Msg-Id) from the first publish on; RLIMIT_NOFILE raised to its hard limit for every process; one run per size, but %d of the largest, whose figures are those of the run of the median time into the rotation (every run's time is listed beside that figure).",
		sync, o.workers, o.healths, maxProcsNote(o), o.hosts, fleetCallDelay, fleetBootDelay, plansNote(o), max(o.runs, 1))
	var figs []figure
	type row struct {
		key, label, unit string
		vals             map[int]string
	}
	var rows []*row
	rowOf := map[string]*row{}
	add := func(f figure, label string, n int) {
		figs = append(figs, f)
		suffix := strings.TrimPrefix(f.Key, "fleet_"+sizeName(n)+"_")
		r := rowOf[suffix]
		if r == nil {
			r = &row{key: suffix, label: label, unit: f.Unit, vals: map[int]string{}}
			rowOf[suffix] = r
			rows = append(rows, r)
		}
		f.check()
		mark := ""
		if !f.Met {
			mark = " (over)"
		}
		r.vals[n] = fmt.Sprintf("%.3g%s", f.Value, mark)
	}
	var notes strings.Builder
	for _, r := range results {
		n, k := r.n, "fleet_"+sizeName(r.n)+"_"
		secs := r.inRotation.Seconds()
		f := figure{Key: k + "in_rotation_s", Value: secs, Unit: "s", Target: atMost(boundInRotationS),
			Ours: fmt.Sprintf("%.0f proxies/s into the rotation; %s", float64(n)/secs, r.fill),
			Peer: fmt.Sprintf("%d × (%s boot + 2 calls of %s) over %d hosts", n, fleetBootDelay, fleetCallDelay, o.hosts),
			How:  how + " The time from the first publish until a watcher of PROXY_ROTATION has seen every proxy put.",
			Runs: r.runs}
		if !f.met() {
			f.Bound = "when every proxy had reached each stage: " + r.stages + "."
			if r.cpuTotal > 0 {
				cores := runtime.NumCPU()
				f.Bound = fmt.Sprintf("the machine's CPU. Every process of the run (the nats-server, %d workers, %d health processes, the sim hosts' files in the workers) used %.0f s of CPU over the %.0f s, %.1f of the %d cores on average: %.1f ms a create, at which the %d cores cannot bring %d proxies in under %.0f s whatever the order of the work. %s. When every proxy had reached each stage: %s.",
					o.workers, o.healths, r.cpuTotal, secs, r.cpuTotal/secs, cores, 1000*r.cpuTotal/float64(n), cores, n, r.cpuTotal/float64(cores), r.cpu, r.stages)
			}
		}
		add(f, "all in the rotation (s)", n)
		rf := figure{Key: k + "worker_rss_mib", Value: maxOf(r.workerHWM), Unit: "MiB", Target: atMost(boundWorkerRSSMiB),
			Ours: fmt.Sprintf("the largest of %d workers (%s MiB), %d proxies each; of which mapped from the binary's file at the end: %s MiB", len(r.workerHWM), mibs(r.workerHWM), n/max(o.workers, 1), mibs(r.workerFile)),
			How:  how + " Each worker process's VmHWM (/proc/PID/status) once the burst has settled; the largest. Its RssFile at the end is given beside it: the pages of the binary (its code and read-only data, 43 MB of file, one binary for every role) the process touched, which every process of the binary shares in the page cache but each counts in its RSS."}
		if !rf.met() && len(r.workerFile) > 0 {
			rf.Bound = fmt.Sprintf("%.0f MiB of each worker's RSS are the binary's pages it maps (RssFile, counted by every process, held once by the machine), so the process's own memory, heap and stacks, peaked near %.0f MiB: its Go heap holds every host's record (the placement ranks them all) and the NATS client's buffers, and, for the time of an observation pass, the last events and desired records of that host's proxies, with GOGC 50 on top; the goroutines of the hosts it pulls and of every proxy booting at once (20 a host) add their stacks.",
				median(r.workerFile), maxOf(r.workerHWM)-median(r.workerFile))
		}
		add(rf, "worker peak RSS (MiB)", n)
		add(figure{Key: k + "health_rss_mib", Value: maxOf(r.healthHWM), Unit: "MiB", Target: atMost(boundHealthRSSMiB),
			Ours: fmt.Sprintf("the largest of %d health processes (%s MiB)", len(r.healthHWM), mibs(r.healthHWM)),
			How:  how + " Each health process's VmHWM once the burst has settled; the largest."}, "health peak RSS (MiB)", n)
		lost := ""
		if r.meterLost != "" {
			lost = " (" + r.meterLost + ": the figures are a floor)"
		}
		add(figure{Key: k + "rotation_max_msg_kib", Value: float64(r.maxMsg) / 1024, Unit: "KiB", Target: atMost(boundMaxMsgKiB),
			Ours: fmt.Sprintf("%d messages on the rotation subjects, %.1f MiB in all%s; the largest on the v1 snapshot subject %.0f KiB", r.rotMsgs, float64(r.rotBytes)/(1<<20), lost, float64(r.maxSnap)/1024),
			How:  how + " A core subscriber of `<prefix>.rotation` and `<prefix>.rotation.>` on a connection of its own, from before the first publish until the end of the quiet window: the largest message (payload and headers) of the feed (`<prefix>.rotation.>`: its changes and heartbeats). The v1 snapshot subject `<prefix>.rotation` is kept for fleets where the whole rotation fits in one message and is O(fleet) by what it is: its largest message is `health.snapshot_max_bytes` at most (default the server's max_payload, 1 MiB; an operator whose subscribers all follow the feed sets 65536), and beyond that it carries a notice (truncated) of a few hundred bytes; its largest is given beside the figure, and its bytes count in the bytes per change."}, "largest feed message (KiB)", n)
		perChange := 0.0
		if r.changes > 0 {
			perChange = float64(r.rotBytes) / float64(r.changes)
		}
		bf := figure{Key: k + "rotation_bytes_per_change", Value: perChange, Unit: "B", Target: atMost(boundBytesChange),
			Ours: fmt.Sprintf("%.1f MiB over %d changes%s, of which %.1f MiB on the v1 snapshot subject", float64(r.rotBytes)/(1<<20), r.changes, lost, float64(r.snapBytes)/(1<<20)),
			How:  how + " The bytes on the rotation subjects (as above, the v1 snapshot subject's included) divided by the changes of the rotation: the puts and deletes a watcher of PROXY_ROTATION saw over the same time (each proxy entering or leaving, or changing address)."}
		if !bf.met() && r.changes > 0 {
			bf.Bound = fmt.Sprintf("the v1 snapshot subject, kept for fleets where the whole rotation fits in one message: it carried %.1f MiB of the %.1f, a whole snapshot at most once a second for as long as the rotation fit in max_payload (1 MiB, about 10,800 proxies here) and a notice of a few hundred bytes after; the feed alone carried %.0f B a change. A fleet that has outgrown the snapshot pays for it only during the burst that outgrows it; `health.snapshot_max_bytes` lowers its ceiling.",
				float64(r.snapBytes)/(1<<20), float64(r.rotBytes)/(1<<20), float64(r.rotBytes-r.snapBytes)/float64(r.changes))
		}
		add(bf, "rotation bytes per change (B)", n)
		wf := figure{Key: k + "warnings", Value: float64(len(r.warnings)), Unit: "lines", Target: atMost(0),
			Ours: fmt.Sprintf("WARN or ERROR records in the %d processes' logs", o.workers+o.healths),
			How:  how + fmt.Sprintf(" Every process's log (JSON) from %s after the last proxy entered the rotation until %s later: the records at level WARN or ERROR.", o.settle, o.quiet)}
		if len(r.warnings) > 0 {
			wf.Bound = "the first of them: " + strings.Join(r.warnings[:min(len(r.warnings), 5)], "; ")
		}
		add(wf, "warnings after the burst settled", n)
		for _, v := range []struct{ name, what string }{
			{"list", "`proxyfleet list` (every proxy)"}, {"get", "`proxyfleet get ID`"}, {"hosts", "`proxyfleet hosts`"},
			{"rotation", "`proxyfleet rotation` (from PROXY_ROTATION)"}, {"watch", "`proxyfleet watch` until its first output"},
		} {
			add(figure{Key: k + v.name + "_s", Value: r.verbs[v.name], Unit: "s", Target: atMost(boundVerbS),
				Ours: v.what + " as a process, wall time (median of 3)",
				How:  how + " Once the burst has settled, " + v.what + " run as a process with `--config` and `--timeout 2m`, from its start until it exited (watch: until its first byte of output), 3 times one after another, the median; the fleet goes on with its observation passes meanwhile (every host every 30s). The bound of `list` (3s) for all."},
				"`"+v.name+"` (s)", n)
		}
		fmt.Fprintf(&notes, "At %d proxies: %s. %s. The first worker at the end: %s.", n, r.stages, r.cpu, r.workerStats)
		if len(r.verbErrs) > 0 {
			fmt.Fprintf(&notes, " Verbs that failed or printed too little: %s.", strings.Join(r.verbErrs, "; "))
		}
		if len(r.warnings) > 0 {
			fmt.Fprintf(&notes, " %d warnings after the burst settled, the first: %s.", len(r.warnings), strings.Join(r.warnings[:min(len(r.warnings), 10)], "; "))
		}
		notes.WriteString("\n\n")
	}
	if peer != nil {
		fmt.Fprintf(&notes, "The peer of the same run, %d proxies once more with no address plan on any host (the network's DHCP): all in the rotation after %.1f s, worker peak RSS %.1f MiB, health peak RSS %.0f MiB. %s.\n\n",
			peer.n, peer.inRotation.Seconds(), maxOf(peer.workerHWM), maxOf(peer.healthHWM), peer.cpu)
	}
	if len(results) > 0 {
		notes.WriteString("How each figure grows with the fleet (one run per size, the median of 3 at the largest):\n\n| figure |")
		for _, r := range results {
			fmt.Fprintf(&notes, " %d |", r.n)
		}
		notes.WriteString("\n|---|" + strings.Repeat("---|", len(results)) + "\n")
		for _, rw := range rows {
			fmt.Fprintf(&notes, "| %s |", rw.label)
			for _, r := range results {
				fmt.Fprintf(&notes, " %s |", rw.vals[r.n])
			}
			notes.WriteString("\n")
		}
	}
	return sectionResult{figures: figs, notes: notes.String()}
}

func mibs(vs []float64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(s, ", ")
}

// maxProcsNote says what GOMAXPROCS the workers and health processes ran
// with, for the figures' descriptions.
func maxProcsNote(o fleet50kOpts) string {
	cores := runtime.NumCPU()
	mp := procsMaxProcs(o, cores)
	if mp == 0 {
		return fmt.Sprintf(", each with Go's default GOMAXPROCS (%d, every core)", cores)
	}
	if o.maxProcs > 0 {
		return fmt.Sprintf(", each with GOMAXPROCS %d", mp)
	}
	return fmt.Sprintf(", each with GOMAXPROCS %d, its share of the %d cores, as docs/OPERATIONS.md says for processes packed on one machine", mp, cores)
}

// plansNote says which address plans the hosts have.
func plansNote(o fleet50kOpts) string {
	if o.noPlans {
		return "no address plan (the network's DHCP)"
	}
	return "each host with an address plan (fleet50kPlan: an IPv4 block of 198.18.0.0/15 with room for its proxies and an IPv6 /64 of 2001:db8::/32, 16 addresses a proxy)"
}
