package worker_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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
