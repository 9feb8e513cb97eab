package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"proxyfleet/addrplan"
	"proxyfleet/messages"
)

// egressPerHost is how many proxies a host record holds in the egress
// section: 50,000 proxies over 500 hosts, as fleet50k runs them.
const egressPerHost = 100

// runEgress measures the CPU an address assignment adds to a create: a
// create's change of its host's record (decode the record, reserve room,
// encode it for the compare-and-set), on a record of egressPerHost
// proxies, with a plan (one IPv4 address and 16 IPv6 addresses a proxy:
// the slots taken, the record's assignments decoded and encoded) against
// the same without one, b.runs times each; the difference is the figure.
func runEgress(_ context.Context, b *bench) (sectionResult, error) {
	plan, err := addrplan.New("h1", addrplan.Config{IPv4: []string{"198.18.101.0/24"}, IPv6: []string{"2001:db8:101::/64"}, IPv6PerProxy: 16})
	if err != nil {
		return sectionResult{}, err
	}
	now := time.Now()
	base := messages.HostRecord{V: 1, Host: "h1", MaxProxies: 1000, State: messages.HostOK, Proxies: map[string]uint64{}}
	planned := base
	planned.Proxies = map[string]uint64{}
	pc := plan.Config()
	planned.Plan = &pc
	var st messages.AddrState
	for i := range egressPerHost {
		id := fmt.Sprintf("p%05d", i)
		base.Proxies[id] = uint64(i + 1)
		planned.Proxies[id] = uint64(i + 1)
		if _, err := plan.Assign(&st, id, now); err != nil {
			return sectionResult{}, err
		}
	}
	// Some freed slots cooling, as churn leaves them.
	for i := range 10 {
		plan.Release(&st, fmt.Sprintf("p%05d", i), now)
		delete(planned.Proxies, fmt.Sprintf("p%05d", i))
	}
	planned.Addresses = messages.EncodeAddrs(st)
	rawBase, _ := json.Marshal(base)
	rawPlanned, _ := json.Marshal(planned)
	edit := func(raw []byte, withPlan bool) func(*testing.B) {
		return func(tb *testing.B) {
			for i := 0; tb.Loop(); i++ {
				var rec messages.HostRecord
				if err := json.Unmarshal(raw, &rec); err != nil {
					tb.Fatal(err)
				}
				id := fmt.Sprintf("new%d", i)
				rec.Proxies[id] = 1
				if withPlan {
					st, err := rec.Addresses.Decode()
					if err != nil {
						tb.Fatal(err)
					}
					if _, err := plan.Assign(&st, id, now); err != nil {
						tb.Fatal(err)
					}
					rec.Addresses = messages.EncodeAddrs(st)
				}
				if _, err := json.Marshal(rec); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	var with, without, diffs []float64
	for range b.runs {
		w := testing.Benchmark(edit(rawPlanned, true))
		wo := testing.Benchmark(edit(rawBase, false))
		with = append(with, float64(w.NsPerOp())/1e3)
		without = append(without, float64(wo.NsPerOp())/1e3)
		diffs = append(diffs, float64(w.NsPerOp()-wo.NsPerOp())/1e3)
	}
	f := figure{
		Key: "egress_per_create_us", Value: median(diffs), Unit: "µs", Target: atMost(200), Runs: diffs,
		Ours: fmt.Sprintf("%.1f µs a create's record change with a plan (median; record %d bytes)", median(with), len(rawPlanned)),
		Peer: fmt.Sprintf("%.1f µs without one (record %d bytes)", median(without), len(rawBase)),
		How: fmt.Sprintf("a create's change of its host's record in PROXY_HOSTS, in one process, no NATS: decode the stored record, reserve room "+
			"(and with a plan take the proxy's slots, addrplan.Assign), encode it for the compare-and-set; a record of %d proxies "+
			"(50,000 over 500 hosts), with a plan of an IPv4 /24 and an IPv6 /64 at 16 addresses a proxy and 10 slots cooling, against the same "+
			"record without a plan; testing.Benchmark, %d runs. The figure is the difference: what the assignment adds to each such change "+
			"(a create makes one or two, and every worker's host view decodes each).", egressPerHost, b.runs),
	}
	f.check()
	return sectionResult{figures: []figure{f}}, nil
}
