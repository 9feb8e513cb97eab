package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
	"proxyfleet/sim"
)

// TestAddressesUnderKills runs three worker processes of the built binary
// on three sim hosts with small address plans, publishes 300 creates at
// once with no host named, SIGKILLs and restarts the workers while they
// run (work is redelivered), then deletes every proxy, killing workers
// again. It checks:
//
//   - in every write of a host record to PROXY_HOSTS (every revision, and
//     every compare-and-set that lost) and every revision a watch of the
//     bucket delivers, no two proxies hold the same IPv4 or IPv6 slot,
//     every slot is one of the plan's, and every proxy holding slots holds
//     room;
//   - in every sample of the hosts' domain files taken while it runs, no
//     two domains anywhere have an egress address in common;
//   - once the creates are answered, no more are done than the plans have
//     IPv4 addresses, the others rejected for want of one; every proxy
//     done runs on one host, its domain made with the addresses of the
//     slots its host's record gives it, and its last state event carries
//     those addresses; a rejected one holds no slot and has no domain;
//   - once the deletes are done, no proxy holds room or a slot on any host
//     and no domain is left.
func TestAddressesUnderKills(t *testing.T) {
	bin := buildBinary(t)
	srv := natstest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	hosts := []string{"a1", "a2", "a3"}
	// 62 IPv4 addresses a host and room for 100 proxies: 186 addresses
	// for 300 creates, so the plans run out while creates still come, and
	// from then on a free slot is picked among held ones. reuse_after is
	// short, so a slot freed during the run (a reservation a kill left,
	// released) may be given again while the others are held.
	plans := []string{
		"{ipv4: [198.18.101.0/26], ipv6: ['2001:db8:101:1::/64'], ipv6_per_proxy: 4, reuse_after: 1s}",
		"{ipv4: [198.18.101.128/26], ipv6: ['2001:db8:101:2::/64'], ipv6_per_proxy: 4, reuse_after: 1s}",
		"{ipv4: [198.18.102.0/26], ipv6: ['2001:db8:101:3::/64'], ipv6_per_proxy: 4, reuse_after: 1s}",
	}
	const supply = 3 * 62
	var hostYAML strings.Builder
	for i, h := range hosts {
		fmt.Fprintf(&hostYAML, "  - {name: %s, driver: sim, max_proxies: 100, sim: {dir: %q, delay: 50ms, boot_delay: 300ms}, addresses: %s}\n",
			h, filepath.Join(dir, h), plans[i])
	}
	writeFile(t, cfg, fmt.Sprintf(`nats: {url: %q}
hosts:
%simages:
  - {name: img, url: "file:///dev/null", sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", format: raw}
worker: {concurrency: 4, ack_wait: 2s, pinned_ttl: 2s, poll_interval: 50ms, backoff_initial: 50ms, backoff_max: 500ms, max_attempts: 30, drain_timeout: 2s, observe_interval: 1s}
`, srv.ClientURL(), hostYAML.String()))
	// concurrency 4 keeps each host's work queued while the kills land
	// (see TestWorkersKilledMidCommand).
	setupTopology(t, bin, cfg)
	nc, js := srv.Connect(t)

	// Watch the host records from before the first write. The bucket
	// keeps one revision a record, and a revision replaced before the
	// server delivered it to the watch is not delivered at all; so the
	// test also subscribes to the bucket's subjects, on which every write
	// (every revision, and every compare-and-set that lost) is published.
	// Both only keep what arrives, to keep up.
	kv, err := js.KeyValue(context.Background(), messages.BucketHosts)
	if err != nil {
		t.Fatal(err)
	}
	recs := &recordLog{}
	writes, err := nc.Subscribe("$KV."+messages.BucketHosts+".>", recs.write)
	if err != nil {
		t.Fatal(err)
	}
	defer writes.Unsubscribe()
	if err := writes.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	w, err := kv.WatchAll(watchCtx, jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for e := range w.Updates() {
			if e != nil {
				recs.add(e)
			}
		}
	}()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Sample the domains on the hosts while the workers run.
	samples := &domainSampler{dir: dir, hosts: hosts}
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		samples.run(sampleCtx, 20*time.Millisecond)
	}()
	defer func() { stopSampling(); <-sampled }()

	// No write the subscription saw, no revision the watch delivered and
	// no sample of the domains held an address twice. Checked however the
	// test ends, so that a failure found first does not hide these.
	defer func() {
		lastRev, err := kvStreamLastSeq(js)
		if err != nil {
			t.Error(err)
			return
		}
		if !poll.Wait(30*time.Second, func() bool { return recs.max() >= lastRev }) {
			t.Errorf("the watch did not reach the bucket's last revision, %d (at %d)", lastRev, recs.max())
		}
		stopWatch()
		// Every revision delivered is among the writes, once the
		// subscription has caught up: it is not missing writes, those of
		// the revisions the watch was not delivered among them.
		if !poll.Wait(30*time.Second, recs.covered) {
			t.Error("some revisions the watch delivered are none of the writes the subscription saw: it saw only some")
		}
		if n, err := writes.Dropped(); n > 0 || err != nil {
			t.Errorf("the subscription to the bucket's writes dropped %d (%v): it saw only some", n, err)
		}
		nWrites, nRevs, notDelivered, bad := recs.check()
		for i, b := range bad {
			if i == 20 {
				t.Errorf("and %d more", len(bad)-i)
				break
			}
			t.Error(b)
		}
		if nRevs < int(lastRev)/2 {
			t.Errorf("the watch delivered %d of the bucket's %d revisions", nRevs, lastRev)
		}
		stopSampling()
		<-sampled
		nSamples, overlaps, nOverlaps := samples.result()
		for _, o := range overlaps {
			t.Error(o)
		}
		if nOverlaps > len(overlaps) {
			t.Errorf("and %d more pairs of domains with an address in common", nOverlaps-len(overlaps))
		}
		if nSamples < 10 {
			t.Errorf("only %d samples of the domains were taken", nSamples)
		}
		t.Logf("checked %d writes of host records and %d revisions (%d revisions replaced before the watch got them), %d samples of the domains",
			nWrites, nRevs, notDelivered, nSamples)
	}()

	// Results, by command id: the final outcome and reason.
	var mu sync.Mutex
	done := map[string]messages.Result{}
	sub, err := nc.Subscribe("proxy.result.>", func(m *nats.Msg) {
		var r messages.Result
		if json.Unmarshal(m.Data, &r) != nil || r.Outcome == messages.OutcomeAccepted {
			return
		}
		mu.Lock()
		done[r.CommandID] = r
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	workers := make([]*proc, 3)
	starts := make([]int, len(workers))
	logOf := func(i int) string { return filepath.Join(dir, fmt.Sprintf("worker%d.log", i)) }
	start := func(i int) {
		workers[i] = startProc(t, bin, logOf(i), "worker", "--config", cfg, "--debug")
		starts[i]++
	}
	up := func(i int) {
		waitUntil(t, fmt.Sprintf("worker %d started (start %d)", i, starts[i]), 60*time.Second, func() bool {
			b, _ := os.ReadFile(logOf(i))
			return strings.Count(string(b), `"worker started"`) >= starts[i]
		})
	}
	redelivered := func() int {
		n := 0
		for i := range workers {
			b, _ := os.ReadFile(logOf(i))
			n += strings.Count(string(b), `"work redelivered"`)
		}
		return n
	}
	for i := range workers {
		start(i)
	}
	for i := range workers {
		up(i)
	}

	const n = 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("e%03d", i)
	}
	// publish publishes op for each of ids at once (asynchronously, then
	// waits for every ack), command ids name-id, and returns them.
	publish := func(op, name string, ids []string) map[string]string {
		cmds := map[string]string{} // command id -> proxy id
		for _, id := range ids {
			m := nats.NewMsg(fmt.Sprintf("proxy.cmd.%s.%s", op, id))
			m.Data = []byte(fmt.Sprintf(`{"v":1,"id":%q}`, id))
			m.Header.Set(jetstream.MsgIDHeader, name+"-"+id)
			if _, err := js.PublishMsgAsync(m); err != nil {
				t.Fatalf("publish %s %s: %v", op, id, err)
			}
			cmds[name+"-"+id] = id
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatalf("%d %s commands not acked after 30s", js.PublishAsyncPending(), op)
		}
		return cmds
	}
	// pending are the proxies of cmds whose command has no final result
	// yet, in order.
	pending := func(cmds ...map[string]string) []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, c := range cmds {
			for cmd, id := range c {
				if _, ok := done[cmd]; !ok {
					out = append(out, id)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	result := func(cmd string) messages.Result {
		mu.Lock()
		defer mu.Unlock()
		return done[cmd]
	}
	// killDuring kills a worker at a time, restarting it at once, each
	// time a call of a pending command holds its proxy's lock on a host
	// (sim.Busy): the worker that owns that host as the logs say (see
	// owners), or the next in turn. It stops after rounds kills or once
	// no command is left, and returns how many kills it made.
	next := 0
	killDuring := func(what string, rounds int, left func() []string) int {
		kills := 0
		for round := range rounds {
			for i := range workers {
				up(i)
			}
			busyHost := ""
			waitUntil(t, fmt.Sprintf("%s in flight on the hosts (round %d)", what, round), 60*time.Second, func() bool {
				ids := left()
				if len(ids) == 0 {
					return true
				}
				for _, id := range ids {
					for _, h := range hosts {
						if b, err := sim.Busy(filepath.Join(dir, h), id); err == nil && b {
							busyHost = h
							return true
						}
					}
				}
				return false
			})
			if busyHost == "" {
				break
			}
			i := next % len(workers)
			if o, ok := owners(t, workers, []string{busyHost})[busyHost]; ok {
				i = o
			}
			workers[i].kill()
			start(i)
			next++
			kills++
		}
		return kills
	}

	// The creates, no host named: placement spreads them. Midway, 30
	// proxies already running are created again (new commands): each
	// keeps its place and its addresses.
	began := time.Now()
	creates := publish(messages.OpCreate, "create", ids)
	createKills := killDuring("a create", 3, func() []string { return pending(creates) })
	var ran []string
	waitUntil(t, "30 creates done", 60*time.Second, func() bool {
		ran = ran[:0]
		for _, id := range ids {
			if result("create-"+id).Outcome == messages.OutcomeDone {
				ran = append(ran, id)
			}
		}
		return len(ran) >= 30
	})
	again := publish(messages.OpCreate, "again", ran[:30])
	createKills += killDuring("a create", 3, func() []string { return pending(creates, again) })
	waitUntil(t, "every create to be answered", 120*time.Second, func() bool { return len(pending(creates, again)) == 0 })
	createRedelivered := redelivered()
	created := time.Since(began)
	for cmd, id := range again {
		if r := result(cmd); r.Outcome != messages.OutcomeDone {
			t.Errorf("create %s again: %s (field %q, %s)", id, r.Outcome, r.Field, r.Reason)
		}
	}
	// A create is done, or rejected for want of an address on every
	// host; no more are done than the plans have addresses.
	var running, rejected []string
	for _, id := range ids {
		r := result("create-" + id)
		switch {
		case r.Outcome == messages.OutcomeDone:
			running = append(running, id)
		case r.Outcome == messages.OutcomeRejected && r.Field == "host" && strings.Contains(r.Reason, "no free address"):
			rejected = append(rejected, id)
		default:
			t.Errorf("create %s: %s (field %q, %s)", id, r.Outcome, r.Field, r.Reason)
		}
	}
	if len(running) > supply {
		t.Errorf("%d creates done, more than the plans' %d IPv4 addresses", len(running), supply)
	}
	if len(running) < supply/2 {
		t.Errorf("only %d creates done of the plans' %d IPv4 addresses", len(running), supply)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Each proxy runs on one host, made with its slots' addresses, and
	// its last state event (once it says running) carries them. A
	// rejected one holds no slot and has no domain.
	var lastRecs map[string]messages.HostRecord
	waitUntil(t, "every proxy held on one host and the rejected on none (reservations kills left released)", 60*time.Second, func() bool {
		lastRecs = readHostRecords(t, kv, hosts)
		return heldOnce(lastRecs, running, 1) == nil && heldOnce(lastRecs, rejected, 0) == nil
	})
	placed := map[string]string{} // id -> host
	perHost := map[string]int{}
	for _, h := range hosts {
		rec := lastRecs[h]
		if rec.Plan == nil {
			t.Fatalf("%s: the record has no plan", h)
		}
		plan, err := addrplan.New(h, *rec.Plan)
		if err != nil {
			t.Fatalf("%s: the record's plan: %v", h, err)
		}
		held := recSlots(rec)
		doms := readDomains(filepath.Join(dir, h))
		for id, s := range held {
			placed[id] = h
			perHost[h]++
			want := slotAddrs(plan, s)
			if got, ok := doms[id]; !ok {
				t.Errorf("%s holds slots %+v on %s and has no domain there", id, s, h)
			} else if !slices.Equal(got, want) {
				t.Errorf("%s on %s: domain egress %v, its slots %+v give %v", id, h, got, s, want)
			}
		}
		for id := range doms {
			if _, ok := held[id]; !ok {
				t.Errorf("%s has a domain on %s and holds no slot there", id, h)
			}
		}
	}
	var last map[string]messages.StateEvent
	waitUntil(t, "every proxy's last state event to say running", 60*time.Second, func() bool {
		last = lastEvents(t, js, running)
		for _, id := range running {
			if last[id].State != messages.StateRunning {
				return false
			}
		}
		return true
	})
	for _, id := range running {
		h := placed[id]
		ev := last[id]
		plan, _ := addrplan.New(h, *lastRecs[h].Plan)
		want := slotAddrs(plan, recSlots(lastRecs[h])[id])
		got, err := messages.ExpandEgress(ev.Egress)
		if ev.Host != h || err != nil || joinAddrs(got) != joinAddrs(want) {
			t.Errorf("%s: last event on %s with egress %v (%v); its slots on %s give %v", id, ev.Host, ev.Egress, err, h, want)
		}
	}
	t.Logf("creates answered %s after they were published (%d kills, %d work items redelivered): %d done (%d created again), %d rejected; proxies a host: %v",
		created.Round(100*time.Millisecond), createKills, createRedelivered, len(running), len(again), len(rejected), perHost)

	// The deletes.
	deletesBegan := time.Now()
	deletes := publish(messages.OpDelete, "delete", ids)
	deleteKills := killDuring("a delete", 2, func() []string { return pending(deletes) })
	waitUntil(t, "every delete to be done", 120*time.Second, func() bool { return len(pending(deletes)) == 0 })
	for _, id := range ids {
		if r := result("delete-" + id); r.Outcome != messages.OutcomeDone {
			t.Errorf("delete %s: %s (%s)", id, r.Outcome, r.Reason)
		}
	}
	// Every address freed: no proxy holds a slot or room anywhere, and
	// no domain is left.
	freed := poll.Wait(60*time.Second, func() bool {
		lastRecs = readHostRecords(t, kv, hosts)
		for _, h := range hosts {
			if len(recSlots(lastRecs[h])) > 0 || len(lastRecs[h].Proxies) > 0 {
				return false
			}
		}
		return true
	})
	if !freed {
		for _, h := range hosts {
			t.Errorf("%s after the deletes: %d proxies hold room, slots held %v", h, len(lastRecs[h].Proxies), recSlots(lastRecs[h]))
		}
	}
	for _, h := range hosts {
		if doms := readDomains(filepath.Join(dir, h)); len(doms) > 0 {
			t.Errorf("%s: %d domains left after the deletes", h, len(doms))
		}
	}
	totalRedelivered := redelivered()
	deleted := time.Since(deletesBegan)

	checkSimLogs(t, dir, hosts)
	t.Logf("deletes done and addresses freed %s after they were published (%d kills, %d work items redelivered)",
		deleted.Round(100*time.Millisecond), deleteKills, totalRedelivered-createRedelivered)
	if createKills < 3 {
		t.Errorf("only %d kills landed while creates ran", createKills)
	}
	if createRedelivered == 0 {
		t.Error("no kill landed in the middle of a create; the test proved nothing")
	}
}

// recordLog keeps every write of a host record a subscription saw and
// every revision a watch delivered.
type recordLog struct {
	mu     sync.Mutex
	writes []recordRev
	revs   []recordRev
	top    uint64
}

type recordRev struct {
	key   string
	rev   uint64 // 0 for a write
	op    jetstream.KeyValueOp
	value []byte
}

func (l *recordLog) write(m *nats.Msg) {
	op := jetstream.KeyValuePut
	if m.Header.Get("KV-Operation") != "" {
		op = jetstream.KeyValueDelete // a delete or purge: no record
	}
	key := strings.TrimPrefix(m.Subject, "$KV."+messages.BucketHosts+".")
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, recordRev{key: key, op: op, value: slices.Clone(m.Data)})
}

func (l *recordLog) add(e jetstream.KeyValueEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.revs = append(l.revs, recordRev{key: e.Key(), rev: e.Revision(), op: e.Operation(), value: e.Value()})
	l.top = max(l.top, e.Revision())
}

func (l *recordLog) max() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.top
}

// covered says whether every revision delivered is among the writes.
func (l *recordLog) covered() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	written := map[string]bool{}
	for _, w := range l.writes {
		written[w.key+" "+string(w.value)] = true
	}
	for _, r := range l.revs {
		if r.op == jetstream.KeyValuePut && !written[r.key+" "+string(r.value)] {
			return false
		}
	}
	return true
}

// check checks every write and every revision (see recordProblems). It
// returns how many writes and revisions it checked, how many of the
// revisions 1 to the last the watch did not deliver, and what it found
// wrong.
func (l *recordLog) check() (writes, revs int, notDelivered uint64, bad []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	checkRec := func(what string, value []byte) {
		var rec messages.HostRecord
		if err := json.Unmarshal(value, &rec); err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", what, err))
			return
		}
		for _, p := range recordProblems(rec) {
			bad = append(bad, fmt.Sprintf("%s: %s", what, p))
		}
	}
	for i, w := range l.writes {
		if w.op == jetstream.KeyValuePut {
			checkRec(fmt.Sprintf("%s write %d", w.key, i+1), w.value)
		}
	}
	seen := map[uint64]bool{}
	for _, r := range l.revs {
		seen[r.rev] = true
		if r.op != jetstream.KeyValuePut {
			continue
		}
		checkRec(fmt.Sprintf("%s revision %d", r.key, r.rev), r.value)
	}
	return len(l.writes), len(l.revs), l.top - uint64(len(seen)), bad
}

// recordProblems is what is wrong with one revision (or write) of a host
// record: a slot held by two proxies, a slot the record's plan does not
// have, a proxy holding slots and no room.
func recordProblems(rec messages.HostRecord) []string {
	var bad []string
	st, err := rec.Addresses.Decode()
	if err != nil {
		return []string{err.Error()}
	}
	if len(st.Slots) > 0 && rec.Plan == nil {
		return []string{"slots held with no plan"}
	}
	var plan *addrplan.Plan
	if rec.Plan != nil {
		var err error
		if plan, err = addrplan.New(rec.Host, *rec.Plan); err != nil {
			return []string{fmt.Sprintf("plan: %v", err)}
		}
	}
	v4, v6 := map[int]string{}, map[int]string{}
	for _, id := range sortedKeys(st.Slots) {
		s := st.Slots[id]
		if _, ok := rec.Proxies[id]; !ok {
			bad = append(bad, fmt.Sprintf("%s holds slots %+v and no room", id, s))
		}
		if s.V4 < 1 || s.V4 > plan.Slots4() || s.V6 < 1 || s.V6 > plan.Slots6() {
			bad = append(bad, fmt.Sprintf("%s holds slots %+v, outside the plan's %d and %d", id, s, plan.Slots4(), plan.Slots6()))
		}
		if o, ok := v4[s.V4]; ok {
			bad = append(bad, fmt.Sprintf("IPv4 slot %d (%s) held by %s and %s", s.V4, plan.IPv4(s.V4), o, id))
		}
		if o, ok := v6[s.V6]; ok {
			bad = append(bad, fmt.Sprintf("IPv6 slot %d held by %s and %s", s.V6, o, id))
		}
		v4[s.V4], v6[s.V6] = id, id
	}
	return bad
}

// recSlots are the slots rec says each proxy holds; none if its
// addresses do not decode (recordProblems reports that).
func recSlots(rec messages.HostRecord) map[string]messages.AddrSlots {
	st, _ := rec.Addresses.Decode()
	return st.Slots
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// heldOnce says whether every one of ids holds slots on want hosts.
func heldOnce(recs map[string]messages.HostRecord, ids []string, want int) error {
	var held []map[string]messages.AddrSlots
	for _, rec := range recs {
		held = append(held, recSlots(rec))
	}
	for _, id := range ids {
		n := 0
		for _, h := range held {
			if _, ok := h[id]; ok {
				n++
			}
		}
		if n != want {
			return fmt.Errorf("%s holds slots on %d hosts", id, n)
		}
	}
	return nil
}

func readHostRecords(t *testing.T, kv jetstream.KeyValue, hosts []string) map[string]messages.HostRecord {
	t.Helper()
	out := map[string]messages.HostRecord{}
	for _, h := range hosts {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e, err := kv.Get(ctx, h)
		cancel()
		if err != nil {
			t.Fatalf("host record %s: %v", h, err)
		}
		var rec messages.HostRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatalf("host record %s: %v", h, err)
		}
		out[h] = rec
	}
	return out
}

func kvStreamLastSeq(js jetstream.JetStream) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "KV_"+messages.BucketHosts)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// lastEvents reads each proxy's last state event from PROXY_EVENTS.
func lastEvents(t *testing.T, js jetstream.JetStream, ids []string) map[string]messages.StateEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]messages.StateEvent{}
	for _, id := range ids {
		m, err := s.GetLastMsgForSubject(ctx, "proxy.state."+id)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("last event of %s: %v", id, err)
		}
		var ev messages.StateEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("last event of %s: %v", id, err)
		}
		out[id] = ev
	}
	return out
}

// slotAddrs are the addresses slots s give under plan, its IPv4 address
// first, as a domain's egress lists them.
func slotAddrs(plan *addrplan.Plan, s messages.AddrSlots) []netip.Addr {
	var out []netip.Addr
	if a := plan.IPv4(s.V4); a.IsValid() {
		out = append(out, a)
	}
	return append(out, plan.IPv6(s.V6)...)
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, " ")
}

// readDomains reads the egress addresses of every domain of the sim host
// in dir, by proxy id (a domain deleted while it reads is left out).
func readDomains(dir string) map[string][]netip.Addr {
	names, _ := filepath.Glob(filepath.Join(dir, "domains", "*.json"))
	out := map[string][]netip.Addr{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		var dom struct {
			ID     string   `json:"id"`
			Egress []string `json:"egress"`
		}
		if json.Unmarshal(b, &dom) != nil {
			continue
		}
		out[dom.ID], _ = messages.ExpandEgress(dom.Egress)
	}
	return out
}

// domainSampler reads every host's domains again and again, recording
// any sample in which two domains have an egress address in common.
type domainSampler struct {
	dir   string
	hosts []string

	mu       sync.Mutex
	n        int
	overlaps []string        // the first 20 found, each once
	seen     map[string]bool // every one found
}

func (s *domainSampler) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		holder := map[netip.Addr]string{}
		var bad []string
		for _, h := range s.hosts {
			doms := readDomains(filepath.Join(s.dir, h))
			for _, id := range sortedKeys(doms) {
				for _, a := range doms[id] {
					if o, ok := holder[a]; ok {
						bad = append(bad, fmt.Sprintf("domains %s and %s/%s both have egress %s", o, h, id, a))
					}
					holder[a] = h + "/" + id
				}
			}
		}
		s.mu.Lock()
		s.n++
		for _, b := range bad {
			if !s.seen[b] && len(s.overlaps) < 20 {
				s.overlaps = append(s.overlaps, b)
			}
			if s.seen == nil {
				s.seen = map[string]bool{}
			}
			s.seen[b] = true
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// result is how many samples were taken, the first overlaps found and
// how many were found in all.
func (s *domainSampler) result() (samples int, overlaps []string, all int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.overlaps, len(s.seen)
}
