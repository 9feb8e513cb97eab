package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"proxyfleet/config"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// TestClusterLosesANodeAndAWorker runs the fleet on a three-node JetStream
// cluster with every stream and bucket replicated three times: three worker
// processes and a health process of the built binary, each given all three
// nodes' URLs, and six sim hosts. While 300 commands for 100 proxies
// arrive, the worker owning the most hosts is SIGKILLed and the node leading
// PROXY_WORK is stopped; both come back. Every proxy ends in the state of
// its last command (in PROXY_EVENTS and on the sim hosts) and in the
// rotation if it runs, no command creates twice, no two calls for one proxy
// overlap, no proxy's event seq goes back, nothing is dead-lettered, and
// the streams are whole again on three current replicas.
func TestClusterLosesANodeAndAWorker(t *testing.T) {
	const (
		proxies  = 100
		commands = 300
		killAt   = 60  // commands stored when the owner is SIGKILLed,
		stopAt   = 120 // ... the node stopped,
		backAt   = 210 // ... the worker started again,
		nodeAt   = 270 // ... and the node started again.
	)
	bin := buildBinary(t)
	cl := natstest.StartCluster(t, 3)
	dir := t.TempDir()
	// A failed run says what each process warned of (and leaves its
	// logs and sim hosts in $PROXYFLEET_KEEP_FAILED when that is set).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		if keep := os.Getenv("PROXYFLEET_KEEP_FAILED"); keep != "" {
			_ = os.CopyFS(keep, os.DirFS(dir))
		}
		for _, l := range logs {
			if sum := logSummary(l); sum != "" {
				t.Logf("%s: %s", filepath.Base(l), sum)
			}
		}
	})
	hosts := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	var hostYAML strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hostYAML, "  - {name: %s, driver: sim, sim: {dir: %q, delay: 50ms, boot_delay: 100ms}}\n", h, filepath.Join(dir, h))
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	writeFile(t, cfgPath, fmt.Sprintf(`nats: {url: %q, replicas: 3}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {ack_wait: 6s, pinned_ttl: 4s, poll_interval: 50ms, backoff_initial: 50ms, backoff_max: 500ms, max_attempts: 30, drain_timeout: 2s, check_interval: 500ms, observe_interval: 3s}
health: {lease_ttl: 2s}
`, cl.URLs(), hostYAML.String()))
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}

	// Set-up through the CLI, over the three URLs, makes everything R3.
	setupTopology(t, bin, cfgPath)
	nc, js := cl.Connect(t)
	checkReplicas(t, js, cfg, false)

	// The workers get the nodes in different orders on --nats-url.
	urls := strings.Split(cl.URLs(), ",")
	workers := make([]*proc, 3)
	startWorker := func(i int, name string) {
		order := append(slices.Clone(urls[i:]), urls[:i]...)
		workers[i] = startProc(t, bin, filepath.Join(dir, name+".log"),
			"worker", "--config", cfgPath, "--nats-url", strings.Join(order, ","), "--debug")
	}
	for i := range workers {
		startWorker(i, fmt.Sprintf("worker%d", i))
	}
	health := startProc(t, bin, filepath.Join(dir, "health.log"), "health", "--config", cfgPath, "--http", freePort(t))
	waitUntil(t, "the workers and health to start", 30*time.Second, func() bool {
		for _, w := range workers {
			if !logHas(w.log, "worker started") {
				return false
			}
		}
		return logHas(health.log, "health started")
	})

	// Every event of a proxy must carry a higher seq than the one before,
	// in the order PROXY_EVENTS stored them: an ordered consumer reads
	// them as they are stored (it misses one replaced before it came to
	// it, and resumes by itself across the node's stop). A core
	// subscription on proxy.state.> sees every publish, also those the
	// stream refused (a worker's compare-and-set that lost, after reading
	// a replica that was behind): its seqs going back are counted, not
	// failed (see docs/ARCHITECTURE.md, "State events and their seq").
	var mu sync.Mutex
	storedSeq, coreSeq := map[string]uint64{}, map[string]uint64{}
	var backwards, failed []string
	stored, arrived, coreBack := 0, 0, 0
	events, err := js.OrderedConsumer(context.Background(), messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"proxy.state.>"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := events.Consume(func(m jetstream.Msg) {
		var ev messages.StateEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		stored++
		if ev.Seq <= storedSeq[ev.ID] {
			backwards = append(backwards, fmt.Sprintf("%s: seq %d (%s %s) stored after %d", ev.ID, ev.Seq, ev.State, ev.CommandID, storedSeq[ev.ID]))
		}
		storedSeq[ev.ID] = ev.Seq
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	sub, err := nc.Subscribe("proxy.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, "proxy.state."):
			var ev messages.StateEvent
			if json.Unmarshal(m.Data, &ev) != nil {
				return
			}
			arrived++
			if ev.Seq <= coreSeq[ev.ID] {
				coreBack++
			}
			coreSeq[ev.ID] = max(coreSeq[ev.ID], ev.Seq)
		case strings.HasPrefix(m.Subject, "proxy.result."):
			var r messages.Result
			if json.Unmarshal(m.Data, &r) == nil && r.Outcome == messages.OutcomeFailed {
				failed = append(failed, fmt.Sprintf("%s %s: %s", r.ID, r.CommandID, r.Reason))
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// The node to stop leads PROXY_WORK, whose leader must be elected
	// anew (and, as placed, some of the host consumers').
	stopped := workLeader(t, cl, js)

	// Commands: one for each proxy first, then a random mix; half the
	// creates name a host (moving the proxy if it ran elsewhere). They are
	// published by four clients at once, one every 20ms in all; the last
	// command of a proxy is the one with the highest stream sequence.
	type sent struct {
		seq       uint64
		op, cmdID string
		host      string
		id, body  string
	}
	rng := rand.New(rand.NewPCG(8, 3))
	cmds := make([]sent, commands)
	for n := range cmds {
		s := sent{op: messages.OpCreate, cmdID: fmt.Sprintf("cmd-%d", n), id: fmt.Sprintf("c%03d", n%proxies)}
		if n >= proxies {
			s.id = fmt.Sprintf("c%03d", rng.IntN(proxies))
		}
		s.body = fmt.Sprintf(`{"v":1,"id":%q}`, s.id)
		if rng.IntN(3) == 0 {
			s.op = messages.OpDelete
		} else if rng.IntN(2) == 0 {
			s.host = hosts[rng.IntN(len(hosts))]
			s.body = fmt.Sprintf(`{"v":1,"id":%q,"host":%q}`, s.id, s.host)
		}
		cmds[n] = s
	}
	var (
		pmu        sync.Mutex
		last       = map[string]sent{}
		nPublished int
		pubRetries int
		pubStall   time.Duration
	)
	// publish stores one command, retrying with the same message id (the
	// stream keeps one) while the cluster cannot take it.
	publish := func(s sent) error {
		began := time.Now()
		for {
			m := nats.NewMsg(fmt.Sprintf("proxy.cmd.%s.%s", s.op, s.id))
			m.Data = []byte(s.body)
			m.Header.Set(jetstream.MsgIDHeader, s.cmdID)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ack, err := js.PublishMsg(ctx, m)
			cancel()
			pmu.Lock()
			if err == nil {
				s.seq = ack.Sequence
				if s.seq > last[s.id].seq {
					last[s.id] = s
				}
				nPublished++
				pubStall = max(pubStall, time.Since(began))
				pmu.Unlock()
				return nil
			}
			pubRetries++
			pmu.Unlock()
			if time.Since(began) > time.Minute {
				return fmt.Errorf("publish %s: the cluster took no command for a minute: %w", s.cmdID, err)
			}
			<-time.After(100 * time.Millisecond) // a pause before the next try
		}
	}
	queue := make(chan sent)
	var pubs errgroup.Group
	for range 4 {
		pubs.Go(func() error {
			for s := range queue {
				if err := publish(s); err != nil {
					return err
				}
			}
			return nil
		})
	}
	published := func() int {
		pmu.Lock()
		defer pmu.Unlock()
		return nPublished
	}

	started := time.Now()
	var (
		victim                         int
		killedAt, stoppedAt, nodeUpAt  time.Time
		nodeCurrentAt, workerRestarted time.Time
	)
	// The disruptions come as the commands are stored.
	disrupt := func(at int, what string, do func()) {
		waitUntil(t, fmt.Sprintf("%d commands stored, to %s", at, what), 2*time.Minute, func() bool { return published() >= at })
		do()
	}
	feed, quit := make(chan struct{}), make(chan struct{})
	defer close(quit) // a failed test stops feeding
	go func() {
		defer close(feed)
		defer close(queue)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for _, s := range cmds {
			<-tick.C
			select {
			case queue <- s:
			case <-quit:
				return
			}
		}
	}()
	disrupt(killAt, "kill the worker owning the most hosts", func() {
		own := owners(t, workers, hosts)
		victim = mostHosts(own, len(workers))
		t.Logf("hosts owned before the kill (host: worker): %v; killing worker%d", own, victim)
		killedAt = time.Now()
		workers[victim].kill()
	})
	disrupt(stopAt, "stop a node", func() {
		t.Logf("stopping %s; %s", stopped.Name(), leaders(t, js, hosts))
		stoppedAt = time.Now()
		stopped.Stop()
	})
	disrupt(backAt, "start the worker again", func() { startWorker(victim, fmt.Sprintf("worker%d-again", victim)) })
	disrupt(nodeAt, "start the node again", func() {
		stopped.Start(t)
		nodeUpAt = time.Now()
	})
	<-feed
	if err := pubs.Wait(); err != nil {
		t.Fatal(err)
	}
	publishedAt := time.Now()
	cl.WaitReady(t)
	nodeCurrentAt = time.Now()

	// Every proxy ends in the state of its last command, as PROXY_EVENTS
	// has it.
	eventStream, err := js.Stream(context.Background(), messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	lastEvent := func(id string) (messages.StateEvent, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		raw, err := eventStream.GetLastMsgForSubject(ctx, "proxy.state."+id)
		var ev messages.StateEvent
		if err != nil || json.Unmarshal(raw.Data, &ev) != nil {
			return ev, false
		}
		return ev, true
	}
	settled := func(id string, s sent) bool {
		ev, ok := lastEvent(id)
		want := map[string]string{messages.OpCreate: messages.StateRunning, messages.OpDelete: messages.StateDeleted}[s.op]
		return ok && ev.CommandID == s.cmdID && ev.State == want
	}
	pending := func() []string {
		var out []string
		for id, s := range last {
			if !settled(id, s) {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	if !poll.WaitEvery(90*time.Second, 200*time.Millisecond, func() bool { return len(pending()) == 0 }) {
		for _, id := range pending() {
			ev, _ := lastEvent(id)
			t.Errorf("%s: last event %s for %s (seq %d), want the outcome of %s %s", id, ev.State, ev.CommandID, ev.Seq, last[id].op, last[id].cmdID)
		}
		dumpQueues(t, js, hosts)
		t.FailNow()
	}
	settledAt := time.Now()
	// The ordered consumer came through the node's stop: it has read
	// every proxy's last event, so the order check covers the whole run.
	waitUntil(t, "the ordered consumer to read every proxy's last event", 30*time.Second, func() bool {
		for id := range last {
			ev, ok := lastEvent(id)
			mu.Lock()
			seen := storedSeq[id]
			mu.Unlock()
			if !ok || seen != ev.Seq {
				return false
			}
		}
		return true
	})

	// On the hosts: one domain for a proxy that runs, on the host its
	// create named, none for a deleted one (a proxy moved away is removed
	// from its old host by a work item of its own: waited for, bounded).
	domains := func(id string) []string {
		var on []string
		for _, h := range hosts {
			if _, err := os.Stat(filepath.Join(dir, h, "domains", id+".json")); err == nil {
				on = append(on, h)
			}
		}
		return on
	}
	hostsRight := func(id string, s sent) bool {
		on := domains(id)
		if s.op == messages.OpDelete {
			return len(on) == 0
		}
		return len(on) == 1 && (s.host == "" || on[0] == s.host)
	}
	waitUntil(t, "the sim hosts to match the last commands", 30*time.Second, func() bool {
		for id, s := range last {
			if !hostsRight(id, s) {
				return false
			}
		}
		return true
	})
	checkSimLogs(t, dir, hosts)

	// The health process folded it all into the rotation: exactly the
	// proxies whose last command is a create.
	rotation, err := js.KeyValue(context.Background(), messages.BucketRotation)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for id, s := range last {
		if s.op == messages.OpCreate {
			want = append(want, id)
		}
	}
	slices.Sort(want)
	var inRotation []string
	if !poll.WaitEvery(30*time.Second, 200*time.Millisecond, func() bool {
		inRotation = kvKeys(rotation)
		return slices.Equal(inRotation, want)
	}) {
		t.Errorf("rotation %v, want %v", inRotation, want)
	}

	// Nothing gave up, every process still runs, and the cluster is whole:
	// every stream and consumer on three current replicas.
	dead, err := js.Stream(context.Background(), messages.StreamDead)
	if err != nil {
		t.Fatal(err)
	}
	if n := dead.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("%d commands dead-lettered", n)
	}
	for i, w := range append(slices.Clone(workers), health) {
		if w.exited() {
			t.Errorf("process %d (%s) exited", i, w.log)
		}
	}
	checkReplicas(t, js, cfg, true)

	mu.Lock()
	for _, b := range backwards {
		t.Error("event seq went back:", b)
	}
	for _, f := range failed {
		t.Error("command failed:", f)
	}
	storedEvents, arrivedEvents, coreBackwards := stored, arrived, coreBack
	mu.Unlock()

	if back, ok := logTime(workers[victim].log, "worker started"); ok {
		workerRestarted = back
	}
	redelivered := 0
	logs, _ := filepath.Glob(filepath.Join(dir, "worker*.log"))
	for _, l := range logs {
		redelivered += strings.Count(readFile(l), `"msg":"work redelivered"`)
	}
	t.Logf("figures: %d commands for %d proxies published in %s (%d publish retries, longest publish %s); all settled %s after the first",
		commands, len(last), publishedAt.Sub(started).Round(time.Millisecond), pubRetries, pubStall.Round(time.Millisecond),
		settledAt.Sub(started).Round(time.Millisecond))
	t.Logf("figures: worker%d SIGKILLed for %s (until its successor started); node %s down %s, current again %s after its stop",
		victim, workerRestarted.Sub(killedAt).Round(time.Millisecond), stopped.Name(),
		nodeUpAt.Sub(stoppedAt).Round(time.Millisecond), nodeCurrentAt.Sub(stoppedAt).Round(time.Millisecond))
	t.Logf("figures: %d work items redelivered; %d state events read as stored, %d seen on the core subscription, of which %d went back (publishes the stream refused)",
		redelivered, storedEvents, arrivedEvents, coreBackwards)

	var ids []string
	for _, w := range workers {
		ids = append(ids, strconv.Itoa(w.cmd.Process.Pid))
	}
	ownershipFair(t, js, ids, hosts, cfg.Worker.PinnedTTL)
}

// ownershipFair waits until the hosts are shared fairly over the live
// workers, named by their pids (a worker's id is hostname-pid): each live
// worker's heartbeat in PROXY_WORKERS is active and owns at most
// ceil(hosts/workers) hosts, every host is owned by exactly one live worker,
// and every host's work consumer has a pinned client. It allows the
// membership 30s to settle after the last change, plus the pin TTL and 5s.
func ownershipFair(t *testing.T, js jetstream.JetStream, pids, hosts []string, pinnedTTL time.Duration) {
	t.Helper()
	share := (len(hosts) + len(pids) - 1) / len(pids)
	var why string
	fair := func() bool {
		why = ""
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, messages.BucketWorkers)
		if err != nil {
			why = err.Error()
			return false
		}
		owner := map[string]string{}
		for _, pid := range pids {
			rec, err := workerRecord(ctx, kv, pid)
			if err != nil {
				why = err.Error()
				return false
			}
			if rec.State != messages.WorkerActive {
				why = fmt.Sprintf("worker %s is %s", rec.ID, rec.State)
				return false
			}
			if len(rec.Owned) > share {
				why = fmt.Sprintf("worker %s owns %v, more than its share of %d", rec.ID, rec.Owned, share)
				return false
			}
			for _, h := range rec.Owned {
				if !slices.Contains(hosts, h) {
					why = fmt.Sprintf("worker %s owns unknown host %s", rec.ID, h)
					return false
				}
				if o, ok := owner[h]; ok {
					why = fmt.Sprintf("host %s owned by %s and %s", h, o, rec.ID)
					return false
				}
				owner[h] = rec.ID
			}
		}
		for _, h := range hosts {
			if owner[h] == "" {
				why = "host " + h + " is owned by no live worker"
				return false
			}
			cons, err := js.Consumer(ctx, messages.StreamWork, topology.WorkConsumer(h))
			if err != nil {
				why = err.Error()
				return false
			}
			pinned := false
			for _, g := range cons.CachedInfo().PriorityGroups {
				pinned = pinned || (g.Group == topology.PriorityGroup && g.PinnedClientID != "")
			}
			if !pinned {
				why = "the work consumer of " + h + " has no pinned client"
				return false
			}
		}
		return true
	}
	if !poll.WaitEvery(30*time.Second+pinnedTTL+5*time.Second, 200*time.Millisecond, fair) {
		t.Errorf("ownership not fair (share %d of %d hosts over %d workers): %s", share, len(hosts), len(pids), why)
	}
}

// workerRecord is the heartbeat of the live worker with process id pid.
func workerRecord(ctx context.Context, kv jetstream.KeyValue, pid string) (messages.WorkerRecord, error) {
	var rec messages.WorkerRecord
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return rec, err
	}
	for _, k := range keys {
		if !strings.HasSuffix(k, "-"+pid) {
			continue
		}
		e, err := kv.Get(ctx, k)
		if err != nil {
			return rec, err
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return rec, fmt.Errorf("worker record %s: %w", k, err)
		}
		return rec, nil
	}
	return rec, fmt.Errorf("no heartbeat of the worker with pid %s in %s (keys %v)", pid, messages.BucketWorkers, keys)
}

// checkReplicas checks that every stream and bucket of cfg, and (once
// workers made them) every consumer, is replicated three times; with
// healed, it waits until every replica is current again.
func checkReplicas(t *testing.T, js jetstream.JetStream, cfg *config.Config, healed bool) {
	t.Helper()
	topo := topologyOf(cfg)
	var names []string
	for _, sc := range topo.Streams() {
		names = append(names, sc.Name)
	}
	for _, kc := range topo.Buckets() {
		names = append(names, topology.BucketStream(kc.Bucket))
	}
	var why string
	whole := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, name := range names {
			st, err := js.Stream(ctx, name)
			if err != nil {
				why = fmt.Sprintf("stream %s: %v", name, err)
				return false
			}
			info := st.CachedInfo()
			if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				why = fmt.Sprintf("stream %s: %d replicas configured, cluster %+v", name, info.Config.Replicas, info.Cluster)
				return false
			}
			if healed {
				if why = notCurrent("stream "+name, info.Cluster); why != "" {
					return false
				}
			}
		}
		if !healed {
			return true
		}
		consumers := []string{topology.IntakeConsumer}
		for _, h := range cfg.HostNames() {
			consumers = append(consumers, topology.WorkConsumer(h))
		}
		for _, c := range consumers {
			stream := messages.StreamWork
			if c == topology.IntakeConsumer {
				stream = messages.StreamCommands
			}
			cons, err := js.Consumer(ctx, stream, c)
			if err != nil {
				why = fmt.Sprintf("consumer %s: %v", c, err)
				return false
			}
			info := cons.CachedInfo()
			if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				why = fmt.Sprintf("consumer %s: cluster %+v", c, info.Cluster)
				return false
			}
			if why = notCurrent("consumer "+c, info.Cluster); why != "" {
				return false
			}
		}
		return true
	}
	if !poll.WaitEvery(30*time.Second, 200*time.Millisecond, whole) {
		t.Fatalf("not replicated three times: %s", why)
	}
}

// notCurrent says which replica of what is behind or offline ("" if none).
func notCurrent(what string, ci *jetstream.ClusterInfo) string {
	if ci.Leader == "" {
		return what + ": no leader"
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return fmt.Sprintf("%s: replica %s current %v offline %v", what, r.Name, r.Current, r.Offline)
		}
	}
	return ""
}

// dumpQueues logs what is left in the command and work queues and where
// their consumers stand, for a test that did not settle.
func dumpQueues(t *testing.T, js jetstream.JetStream, hosts []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{messages.StreamCommands, messages.StreamWork} {
		if st, err := js.Stream(ctx, name); err == nil {
			t.Logf("stream %s: %d messages, first %d last %d; cluster %+v", name, st.CachedInfo().State.Msgs,
				st.CachedInfo().State.FirstSeq, st.CachedInfo().State.LastSeq, st.CachedInfo().Cluster)
		}
	}
	cons := map[string]string{topology.IntakeConsumer: messages.StreamCommands}
	for _, h := range hosts {
		cons[topology.WorkConsumer(h)] = messages.StreamWork
	}
	for _, name := range slices.Sorted(maps.Keys(cons)) {
		c, err := js.Consumer(ctx, cons[name], name)
		if err != nil {
			t.Logf("consumer %s: %v", name, err)
			continue
		}
		i := c.CachedInfo()
		t.Logf("consumer %s: pending %d, ack pending %d, redelivered %d, waiting %d, delivered %+v, ack floor %+v, groups %+v, leader %s",
			name, i.NumPending, i.NumAckPending, i.NumRedelivered, i.NumWaiting, i.Delivered, i.AckFloor, i.PriorityGroups, i.Cluster.Leader)
	}
}

// leaders says which node leads PROXY_WORK and each host's consumer.
func leaders(t *testing.T, js jetstream.JetStream, hosts []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var parts []string
	if st, err := js.Stream(ctx, messages.StreamWork); err == nil && st.CachedInfo().Cluster != nil {
		parts = append(parts, messages.StreamWork+" "+st.CachedInfo().Cluster.Leader)
	}
	for _, h := range hosts {
		if c, err := js.Consumer(ctx, messages.StreamWork, topology.WorkConsumer(h)); err == nil && c.CachedInfo().Cluster != nil {
			parts = append(parts, topology.WorkConsumer(h)+" "+c.CachedInfo().Cluster.Leader)
		}
	}
	return "leaders: " + strings.Join(parts, ", ")
}

// workLeader is the node leading PROXY_WORK.
func workLeader(t *testing.T, cl *natstest.Cluster, js jetstream.JetStream) *natstest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, messages.StreamWork)
	if err != nil {
		t.Fatal(err)
	}
	s := cl.Node(st.CachedInfo().Cluster.Leader)
	if s == nil {
		t.Fatalf("%s is led by %q, no node of ours", messages.StreamWork, st.CachedInfo().Cluster.Leader)
	}
	return s
}

// owners reads, from the workers' debug logs, which worker was handed the
// latest work item or observation pass of each host: only the host's
// pinned owner is.
func owners(t *testing.T, workers []*proc, hosts []string) map[string]int {
	t.Helper()
	own := map[string]int{}
	latest := map[string]time.Time{}
	for i, w := range workers {
		for _, line := range readLogLines(w.log) {
			var l struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
				Host string    `json:"host"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || (l.Msg != "work" && l.Msg != "observation pass") || !slices.Contains(hosts, l.Host) {
				continue
			}
			if l.Time.After(latest[l.Host]) {
				latest[l.Host], own[l.Host] = l.Time, i
			}
		}
	}
	return own
}

// mostHosts is the worker owning the most hosts in own.
func mostHosts(own map[string]int, workers int) int {
	n := make([]int, workers)
	for _, w := range own {
		n[w]++
	}
	best := 0
	for i := range n {
		if n[i] > n[best] {
			best = i
		}
	}
	return best
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// checkSimLogs fails t if a command created a domain twice on the sim
// hosts under dir (creates.log, across hosts) or two calls for one id
// overlapped (overlaps.log).
func checkSimLogs(t *testing.T, dir string, hosts []string) {
	t.Helper()
	seen := map[string]string{}
	for _, h := range hosts {
		for _, line := range readLogLines(filepath.Join(dir, h, "creates.log")) {
			if _, cmdID, ok := strings.Cut(line, " "); ok {
				if seen[cmdID] != "" {
					t.Errorf("command %s created twice: on %s and %s", cmdID, seen[cmdID], h)
				}
				seen[cmdID] = h
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, h, "overlaps.log")); err == nil {
			t.Errorf("%s: calls for one id overlapped:\n%s", h, b)
		}
	}
}

func readLogLines(path string) []string {
	var out []string
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// logHas reports whether a JSON log has a line whose message begins
// with msg.
func logHas(path, msg string) bool {
	_, ok := logTime(path, msg)
	return ok
}

// logTime is the time of the first line of a JSON log whose message begins
// with msg.
func logTime(path, msg string) (time.Time, bool) {
	for _, line := range readLogLines(path) {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, msg) {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// logSummary counts the warnings and errors of a JSON log by message.
func logSummary(path string) string {
	n := map[string]int{}
	for _, line := range readLogLines(path) {
		var l struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &l) == nil && (l.Level == "WARN" || l.Level == "ERROR") {
			n[l.Level+" "+l.Msg]++
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		parts = append(parts, fmt.Sprintf("%dx %s", n[k], k))
	}
	return strings.Join(parts, "; ")
}

// kvKeys lists a bucket's keys, sorted (nil if it has none or cannot be
// read).
func kvKeys(kv jetstream.KeyValue) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := kv.Keys(ctx)
	if err != nil {
		return nil
	}
	slices.Sort(keys)
	return keys
}
