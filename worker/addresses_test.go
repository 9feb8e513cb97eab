package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/messages"
	"proxyfleet/worker"
)

// withPlans gives each host of the rig the plan of plans.
func withPlans(t *testing.T, plans map[string]addrplan.Config) workerOpt {
	return func(c *worker.Config) {
		c.Catalog.Plans = map[string]*addrplan.Plan{}
		for h, pc := range plans {
			p, err := addrplan.New(h, pc)
			if err != nil {
				t.Fatal(err)
			}
			c.Catalog.Plans[h] = p
		}
	}
}

// simEgress reads the egress addresses a sim domain was created with.
func (r *rig) simEgress(host, id string) []string {
	b, err := os.ReadFile(filepath.Join(r.hostDir(host), "domains", id+".json"))
	if err != nil {
		return nil
	}
	var dom struct {
		Egress []string `json:"egress"` // messages.CompactEgress's form
	}
	if err := json.Unmarshal(b, &dom); err != nil {
		r.t.Fatal(err)
	}
	addrs, err := messages.ExpandEgress(dom.Egress)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// Concurrent creates from three workers on two hosts whose plans have
// fewer addresses than room: each proxy gets addresses of its host's plan
// that no other proxy has (its domain is made with them, its running event
// carries them), a host whose plan is used up turns creates away naming
// the host, and a deleted proxy's addresses are not given again within
// reuse_after.
func TestConcurrentCreatesGetDistinctAddresses(t *testing.T) {
	r := newRig(t, "h1", "h2")
	plans := map[string]addrplan.Config{
		"h1": {IPv4: []string{"198.18.101.0/29"}, IPv6: []string{"2001:db8:101:1::/64"}, IPv6PerProxy: 4},  // 6 IPv4
		"h2": {IPv4: []string{"198.18.101.8/30", "198.18.101.20"}, IPv6: []string{"2001:db8:101:2::/120"}}, // 3 IPv4
	}
	for range 3 {
		r.startWorker(withRoom(r, 20), withPlans(t, plans), func(c *worker.Config) { c.Concurrency = 16 })
	}
	const n = 15
	var pub sync.WaitGroup
	for g := range 3 {
		pub.Add(1)
		go func() {
			defer pub.Done()
			for i := g; i < n; i += 3 {
				r.create(fmt.Sprintf("a%02d", i), fmt.Sprintf("ca%02d", i), "")
			}
		}()
	}
	pub.Wait()
	done := map[string]string{} // id -> host
	rejected := 0
	for i := range n {
		res := r.waitFinal(fmt.Sprintf("ca%02d", i))
		switch res.Outcome {
		case messages.OutcomeDone:
			ev, _ := r.lastEvent(res.ID)
			done[res.ID] = ev.Host
		case messages.OutcomeRejected:
			rejected++
			if res.Field != "host" || !strings.Contains(res.Reason, "no free address") {
				t.Errorf("rejection of %s: field %q, reason %q", res.ID, res.Field, res.Reason)
			}
		default:
			t.Errorf("%s: %s (%s)", res.ID, res.Outcome, res.Reason)
		}
	}
	if len(done) != 9 || rejected != n-9 {
		t.Fatalf("%d done, %d rejected; want 9 (6 + 3 IPv4 addresses) and %d", len(done), rejected, n-9)
	}
	holder := map[string]string{}
	for id, h := range done {
		egress := r.simEgress(h, id)
		ev, _ := r.lastEvent(id)
		evEgress, err := messages.ExpandEgress(ev.Egress)
		if err != nil {
			t.Errorf("%s: event egress %v: %v", id, ev.Egress, err)
		}
		if len(egress) == 0 || ev.IP != egress[0] || ev.Source != messages.SourceSim || fmt.Sprint(evEgress) != "["+strings.Join(egress, " ")+"]" {
			t.Errorf("%s on %s: domain egress %v; event ip %s (%s), egress %v", id, h, egress, ev.IP, ev.Source, ev.Egress)
		}
		want6 := 4
		if h == "h2" {
			want6 = 1
		}
		if len(egress) != 1+want6 {
			t.Errorf("%s on %s: %d addresses, want 1 IPv4 and %d IPv6", id, h, len(egress), want6)
		}
		for _, a := range egress {
			if o, ok := holder[a]; ok {
				t.Errorf("%s is held by %s and %s", a, o, id)
			}
			holder[a] = id
		}
	}
	// The record says who holds which slot, one slot a proxy.
	for _, h := range r.hosts {
		rec, _ := r.hostRecord(h)
		if st := mustAddrs(t, rec); len(st.Slots) != len(rec.Proxies) {
			t.Errorf("%s: %d proxies hold room, %d hold slots", h, len(rec.Proxies), len(st.Slots))
		}
	}

	// A delete frees the addresses; a create right after gets none of
	// them (h2's plan then has none free: its one freed address cools).
	var gone string
	for id, h := range done {
		if h == "h2" {
			gone = id
			break
		}
	}
	freed := r.simEgress("h2", gone)
	r.delete(gone, "del-"+gone)
	if res := r.waitFinal("del-" + gone); res.Outcome != messages.OutcomeDone {
		t.Fatalf("delete %s: %s (%s)", gone, res.Outcome, res.Reason)
	}
	rec, _ := r.hostRecord("h2")
	if st := mustAddrs(t, rec); st.Slots[gone] != (messages.AddrSlots{}) || len(st.V4.Freed) != 1 {
		t.Errorf("after the delete, h2's record: slots %v, freed %v", st.Slots, st.V4.Freed)
	}
	r.create("b1", "cb1", `,"host":"h2"`)
	if res := r.waitFinal("cb1"); res.Outcome != messages.OutcomeRejected || !strings.Contains(res.Reason, "freed within reuse_after") {
		t.Errorf("a create on h2 right after the delete: %s (%s), want rejected: the freed address cools", res.Outcome, res.Reason)
	}
	r.create("b2", "cb2", `,"host":"h1"`)
	if res := r.waitFinal("cb2"); res.Outcome != messages.OutcomeRejected {
		t.Errorf("a create on the full h1: %s (%s)", res.Outcome, res.Reason)
	}
	if r.domainExists("h2", "b1") {
		t.Errorf("b1 was made on h2 with no address free")
	}
	for _, a := range freed {
		if id, ok := holder[a]; !ok || id != gone {
			t.Errorf("freed address %s was %s's, want %s's", a, id, gone)
		}
	}
}

// mustAddrs is rec's address assignments, decoded.
func mustAddrs(t *testing.T, rec messages.HostRecord) messages.AddrState {
	t.Helper()
	st, err := rec.Addresses.Decode()
	if err != nil {
		t.Fatalf("%s: %v", rec.Host, err)
	}
	return st
}

// simMAC reads the MAC a sim domain was created with.
func (r *rig) simMAC(host, id string) string {
	b, err := os.ReadFile(filepath.Join(r.hostDir(host), "domains", id+".json"))
	if err != nil {
		return ""
	}
	var dom struct {
		MAC string `json:"mac"`
	}
	if err := json.Unmarshal(b, &dom); err != nil {
		r.t.Fatal(err)
	}
	return dom.MAC
}

// A worker that starts on a host whose record has lost the slots of a
// domain running there (the record deleted, or its assignments lost)
// gives no new proxy that domain's addresses or MAC: the host's owner
// records the slots of the domains it finds before it creates any, and a
// proxy placed meanwhile on a slot the record showed free gets another.
// Observation is off for the time of the test (an hour's interval): the
// first create comes before any observation pass.
func TestStartingWorkerGivesNoAddressOfAnUnrecordedDomain(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, kv jetstream.KeyValue)
	}{
		{"record deleted", deleteRecord},
		{"assignments lost", loseAssignments},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "h1")
			plans := map[string]addrplan.Config{"h1": {IPv4: []string{"198.18.101.0/29"}, IPv6: []string{"2001:db8:101:1::/64"}, IPv6PerProxy: 4}}
			opts := []workerOpt{withRoom(r, 5), withPlans(t, plans), func(c *worker.Config) { c.ObserveInterval = time.Hour }}
			w := r.startWorker(opts...)
			r.create("old", "c-old", "")
			if res := r.waitFinal("c-old"); res.Outcome != messages.OutcomeDone {
				t.Fatalf("create old: %s (%s)", res.Outcome, res.Reason)
			}
			if err := r.stopWorker(w); err != nil {
				t.Fatal(err)
			}
			kv, err := r.js.KeyValue(context.Background(), messages.BucketHosts)
			if err != nil {
				t.Fatal(err)
			}
			tc.lose(t, kv)

			r.startWorker(opts...)
			for _, id := range []string{"new1", "new2"} {
				r.create(id, "c-"+id, `,"host":"h1"`)
				if res := r.waitFinal("c-" + id); res.Outcome != messages.OutcomeDone {
					t.Fatalf("create %s: %s (%s)", id, res.Outcome, res.Reason)
				}
			}
			checkNoneHeldTwice(t, r, "old", "new1", "new2")
			// The record says old holds the slots its domain has.
			rec, _ := r.hostRecord("h1")
			st := mustAddrs(t, rec)
			p, err := addrplan.New("h1", plans["h1"])
			if err != nil {
				t.Fatal(err)
			}
			if got, want := p.IPv4(st.Slots["old"].V4).String(), r.simEgress("h1", "old")[0]; got != want {
				t.Errorf("the record gives old slots %v (%s); its domain has %s", st.Slots["old"], got, want)
			}
			if _, ok := rec.Proxies["old"]; !ok || len(st.Slots) != 3 {
				t.Errorf("record: room %v, slots %v; want old, new1 and new2 with both", rec.Proxies, st.Slots)
			}
		})
	}
}

// A domain found with no reservation whose addresses a proxy with a domain
// holds (two guests made with one address, say by hand) takes its room
// and not the slot: the proxy that holds it keeps it, and a create after
// gets other addresses.
func TestFoundDomainLeavesTheSlotOfAProxyThatRuns(t *testing.T) {
	r := newRig(t, "h1")
	plans := map[string]addrplan.Config{"h1": {IPv4: []string{"198.18.101.0/29"}}}
	opts := []workerOpt{withRoom(r, 5), withPlans(t, plans), func(c *worker.Config) { c.ObserveInterval = time.Hour }}
	w := r.startWorker(opts...)
	r.create("a", "c-a", "")
	if res := r.waitFinal("c-a"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("create a: %s (%s)", res.Outcome, res.Reason)
	}
	if err := r.stopWorker(w); err != nil {
		t.Fatal(err)
	}
	// A copy of a's domain under another id: a guest with a's address.
	b, err := os.ReadFile(filepath.Join(r.hostDir("h1"), "domains", "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dom map[string]any
	if err := json.Unmarshal(b, &dom); err != nil {
		t.Fatal(err)
	}
	dom["id"] = "twin"
	b, _ = json.Marshal(dom)
	if err := os.WriteFile(filepath.Join(r.hostDir("h1"), "domains", "twin.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	r.startWorker(opts...)
	r.create("b", "c-b", `,"host":"h1"`)
	if res := r.waitFinal("c-b"); res.Outcome != messages.OutcomeDone {
		t.Fatalf("create b: %s (%s)", res.Outcome, res.Reason)
	}
	rec, _ := r.hostRecord("h1")
	st := mustAddrs(t, rec)
	if _, ok := rec.Proxies["twin"]; !ok || st.Slots["a"] != (messages.AddrSlots{V4: 1}) || st.Slots["twin"] != (messages.AddrSlots{}) {
		t.Errorf("record: room %v, slots %v; want twin with room and no slot, a with slot 1", rec.Proxies, st.Slots)
	}
	if ea, eb := r.simEgress("h1", "a"), r.simEgress("h1", "b"); len(eb) != 1 || ea[0] == eb[0] {
		t.Errorf("b made with %v, a has %v", eb, ea)
	}
}

// A running worker whose host's record loses the slots of domains running
// there (the record deleted, put back as it was before one of them was
// made, or written anew without its address assignments) gives no new proxy those domains' addresses or MAC: the host's
// owner records the slots of the domains it finds before it makes another,
// as a starting worker does, and a proxy placed meanwhile on a slot the
// record showed free gets another. Observation is off for the time of the
// test (an hour's interval): no pass comes to put the slots back.
func TestRunningWorkerGivesNoAddressOfADomainItsRecordLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, kv jetstream.KeyValue, before []byte)
	}{
		{"record deleted", func(t *testing.T, kv jetstream.KeyValue, _ []byte) { deleteRecord(t, kv) }},
		{"record put back without a domain", func(t *testing.T, kv jetstream.KeyValue, before []byte) {
			if _, err := kv.Put(context.Background(), "h1", before); err != nil {
				t.Fatal(err)
			}
		}},
		{"assignments lost", func(t *testing.T, kv jetstream.KeyValue, _ []byte) { loseAssignments(t, kv) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, "h1")
			plans := map[string]addrplan.Config{"h1": {IPv4: []string{"198.18.101.0/29"}, IPv6: []string{"2001:db8:101:1::/64"}, IPv6PerProxy: 4}}
			r.startWorker(withRoom(r, 5), withPlans(t, plans), func(c *worker.Config) { c.ObserveInterval = time.Hour })
			kv, err := r.js.KeyValue(context.Background(), messages.BucketHosts)
			if err != nil {
				t.Fatal(err)
			}
			r.create("keep", "c-keep", "")
			if res := r.waitFinal("c-keep"); res.Outcome != messages.OutcomeDone {
				t.Fatalf("create keep: %s (%s)", res.Outcome, res.Reason)
			}
			e, err := kv.Get(context.Background(), "h1")
			if err != nil {
				t.Fatal(err)
			}
			before := e.Value() // keep's room and slots, not old's
			r.create("old", "c-old", "")
			if res := r.waitFinal("c-old"); res.Outcome != messages.OutcomeDone {
				t.Fatalf("create old: %s (%s)", res.Outcome, res.Reason)
			}
			tc.lose(t, kv, before)

			ids := []string{"keep", "old", "new1", "new2"}
			for _, id := range ids[2:] {
				r.create(id, "c-"+id, `,"host":"h1"`)
				if res := r.waitFinal("c-" + id); res.Outcome != messages.OutcomeDone {
					t.Fatalf("create %s: %s (%s)", id, res.Outcome, res.Reason)
				}
			}
			checkNoneHeldTwice(t, r, ids...)
			// The record says each proxy holds the slots its domain has.
			p, err := addrplan.New("h1", plans["h1"])
			if err != nil {
				t.Fatal(err)
			}
			rec, _ := r.hostRecord("h1")
			st := mustAddrs(t, rec)
			for _, id := range ids {
				if _, ok := rec.Proxies[id]; !ok {
					t.Errorf("record: %s holds no room (room %v)", id, rec.Proxies)
				}
				if got, want := p.IPv4(st.Slots[id].V4).String(), r.simEgress("h1", id); len(want) == 0 || got != want[0] {
					t.Errorf("the record gives %s slots %v (%s); its domain has %v", id, st.Slots[id], got, want)
				}
			}
			if len(st.Slots) != len(ids) {
				t.Errorf("record: slots %v, want those of %v", st.Slots, ids)
			}
		})
	}
}

// deleteRecord deletes h1's record.
func deleteRecord(t *testing.T, kv jetstream.KeyValue) {
	t.Helper()
	if err := kv.Delete(context.Background(), "h1"); err != nil {
		t.Fatal(err)
	}
}

// loseAssignments writes h1's record anew without its address
// assignments; the proxies keep their room.
func loseAssignments(t *testing.T, kv jetstream.KeyValue) {
	t.Helper()
	e, err := kv.Get(context.Background(), "h1")
	if err != nil {
		t.Fatal(err)
	}
	var rec messages.HostRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	rec.Addresses = messages.HostAddrs{}
	b, _ := json.Marshal(rec)
	if _, err := kv.Update(context.Background(), "h1", b, e.Revision()); err != nil {
		t.Fatal(err)
	}
}

// checkNoneHeldTwice checks that the domains of ids on h1 each have one
// IPv4 and four IPv6 addresses, and that no address or MAC is two's.
func checkNoneHeldTwice(t *testing.T, r *rig, ids ...string) {
	t.Helper()
	holder := map[string]string{}
	for _, id := range ids {
		egress := r.simEgress("h1", id)
		if len(egress) != 5 {
			t.Errorf("%s: egress %v, want 1 IPv4 and 4 IPv6 addresses", id, egress)
		}
		for _, a := range append(egress, r.simMAC("h1", id)) {
			if o, ok := holder[a]; ok {
				t.Errorf("%s is %s's and %s's", a, o, id)
			}
			holder[a] = id
		}
	}
}
