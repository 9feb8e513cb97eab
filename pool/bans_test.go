package pool_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/addrplan"
	"proxyfleet/bans"
	"proxyfleet/messages"
)

// A pool with recycle_after_bans 2 on a host with an address plan: a
// member whose addresses are banned on two sites (its IPv4 address on one,
// an IPv6 address on another) is replaced make-before-break by one that
// leaves from none of them, and the recycle is counted for its bans; a
// member banned on one site stays.
func TestPoolRecyclesBurnedMembers(t *testing.T) {
	r := newRigPlans(t, map[string]addrplan.Config{
		"h1": {IPv4: []string{"198.18.101.0/28"}, IPv6: []string{"2001:db8:101:1::/64"}, IPv6PerProxy: 2},
	}, "h1")
	reg := prometheus.NewRegistry()
	r.reg = reg
	r.controller("c1")
	r.set(messages.PoolSet{Name: "eu", Size: 2, RecycleAfterBans: 2}, true)
	st := r.waitReady("eu", 2, 30*time.Second)
	full := time.Now()
	ids := slicesOf(liveOf(st.Record.Members))
	burned, kept := ids[0], ids[1]
	egress := func(id string) []netip.Addr {
		p, ok := r.rot.Get(id)
		if !ok || len(p.EgressAddrs) != 3 {
			t.Fatalf("%s in the rotation %v with egress addresses %v, want its plan's 3", id, ok, p.EgressAddrs)
		}
		return p.EgressAddrs
	}
	burnedAddrs, keptAddrs := egress(burned), egress(kept)
	ctx := ctxFor(t, time.Minute)
	for _, b := range []struct {
		addr netip.Addr
		site string
	}{{burnedAddrs[0], "a.example"}, {keptAddrs[0], "a.example"}, {burnedAddrs[1], "b.example"}} {
		if _, err := r.cl.AddBan(ctx, bans.Request{Address: b.addr.String(), Site: b.site, For: messages.Duration(time.Hour), Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	pollUntil(t, "the burned member replaced and deleted", 30*time.Second, func() bool {
		st, err := r.pool("eu")
		if err != nil || st.Record.State != messages.PoolReady || st.Summary.Live != 2 || st.Summary.Ready != 2 {
			return false
		}
		_, member := st.Record.Member(burned)
		return !member && r.hostOf(burned) == "" && len(r.inRotation("eu")) == 2
	})
	st, err := r.pool("eu")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := st.Record.Member(kept); !ok || m.Retired != nil || m.BannedOn != 0 {
		t.Fatalf("%s, banned on one site, is %+v (member %v)", kept, m, ok)
	}
	for _, id := range r.inRotation("eu") {
		if id == kept {
			continue
		}
		for _, a := range egress(id) {
			if slices.Contains(burnedAddrs, a) || slices.Contains(keptAddrs, a) {
				t.Errorf("the replacement %s leaves from %s, an address of %s or %s", id, a, burned, kept)
			}
		}
	}
	if least, at, n := r.sample.fewest("eu", full); least < 2 {
		t.Errorf("the rotation held %d members of eu at %s (of %d samples), fewer than min_ready 2", least, at.Format("15:04:05.000"), n)
	}
	if got := recycles(t, reg, "eu"); got[messages.RecycleBans] != 1 || len(got) != 1 {
		t.Errorf("recycles by cause %v, want one for its bans", got)
	}
}

// recycles reads proxyfleet_pool_recycles_total of pool from reg, the
// causes with a count only.
func recycles(t *testing.T, reg *prometheus.Registry, pool string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "proxyfleet_pool_recycles_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if v := m.GetCounter().GetValue(); labels["pool"] == pool && v > 0 {
				out[labels["cause"]] = v
			}
		}
	}
	return out
}
