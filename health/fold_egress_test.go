package health

import (
	"fmt"
	"strings"
	"testing"

	"proxyfleet/messages"
)

// plan17 is a proxy's egress list as a plan gives it: its IPv4 address
// and sixteen IPv6 addresses.
var plan17 = []string{"198.18.101.5", "2001:db8:101::10/124"}

// Over n probes in a row, egressChoice names each of the n addresses of
// the families asked for once, whatever the first probe's number; none of
// another family, and none of an item that is not an address.
func TestEgressChoiceCyclesThroughEveryAddress(t *testing.T) {
	for _, tc := range []struct {
		fams Families
		n    int
	}{{FamilyIPv4 | FamilyIPv6, 17}, {FamilyIPv6, 16}, {FamilyIPv4, 1}} {
		for _, start := range []uint64{0, 5, 1<<64 - 3} {
			seen := map[string]int{}
			for k := range uint64(tc.n) {
				a := egressChoice(append([]string{"nope", "2001:db8::/64"}, plan17...), tc.fams, start, k)
				if a == "" || !messages.EgressContains(plan17, a) || FamilyName(a) == familyIPv4 && tc.fams&FamilyIPv4 == 0 ||
					FamilyName(a) == familyIPv6 && tc.fams&FamilyIPv6 == 0 {
					t.Fatalf("families %b from %d, probe %d: %q", tc.fams, start, k, a)
				}
				seen[a]++
			}
			if len(seen) != tc.n {
				t.Errorf("families %b from %d: %d probes named %d addresses: %v", tc.fams, start, tc.n, len(seen), seen)
			}
		}
	}
	if a := egressChoice(plan17, 0, 0, 3); a != "" {
		t.Errorf("no family: %q", a)
	}
	if a := egressChoice([]string{"2001:db8::/124"}, FamilyIPv4, 0, 3); a != "" {
		t.Errorf("no address of the family: %q", a)
	}
	if a := egressChoice([]string{"198.18.101.8/30"}, FamilyIPv4, 1, 5); a != "198.18.101.10" {
		t.Errorf("the 6th probe of a /30 names %q, want the third address", a)
	}
}

// egressFold is a probeFold with probe targets of both families whose
// cycles start at each proxy's first address.
func newEgressFold(t *testing.T) *probeFold {
	pf := newProbeFold(t, 0)
	pf.f.EgressFamilies = FamilyIPv4 | FamilyIPv6
	pf.f.EgressStart = func(string) uint64 { return 0 }
	return pf
}

// named applies a passing probe of id's current target that saw its
// request come from saw ("": from the address it named) and returns the
// address it named.
func (pf *probeFold) named(id, saw string) string {
	pf.t.Helper()
	named := pf.target(id).Egress
	if saw == "" {
		saw = named
	}
	pf.result(id, ProbeResult{OK: true, Named: named, Egress: saw, Reported: true})
	return named
}

// A proxy's probes name its addresses in turn, as its plan lists them
// from where its cycle starts: over 17 rounds each of its 17, and only the
// families with a target; the target seeing each, it rises and stays in.
func TestFoldNamesEachEgressAddressInTurn(t *testing.T) {
	pf := newEgressFold(t)
	e := ev("p1", 2, running, "198.18.101.5")
	e.Egress = plan17
	pf.apply(e, false)
	var got []string
	for range 17 {
		got = append(got, pf.named("p1", ""))
	}
	want := []string{"198.18.101.5"}
	for i := range 16 {
		want = append(want, fmt.Sprintf("2001:db8:101::%x", 0x10+i))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("named %v, want %v", got, want)
	}
	pf.want(map[string]string{"p1": "198.18.101.5:3128"})
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK || r.Egress != "198.18.101.5" {
		t.Fatalf("record %+v, want ok, the egress of its first address", r)
	}
	if n := pf.f.Stats().EgressMismatches; n != 0 {
		t.Fatalf("%d mismatches", n)
	}

	// Another start (the injected order): the cycle begins there.
	pf.f.EgressStart = func(string) uint64 { return 3 }
	if a := pf.target("p1").Egress; a != "2001:db8:101::12" {
		t.Errorf("with its cycle starting at 3, the 18th probe names %s", a)
	}
	// Without an IPv6 target, only the IPv4 address is named.
	pf.f.EgressFamilies = FamilyIPv4
	for range 3 {
		if a := pf.named("p1", ""); a != "198.18.101.5" {
			t.Fatalf("without an IPv6 target, a probe named %s", a)
		}
	}
	// Without any, none is; a proxy without a plan is named nothing.
	pf.f.EgressFamilies = 0
	if a := pf.target("p1").Egress; a != "" {
		t.Errorf("without targets, a probe names %s", a)
	}
	pf.f.EgressFamilies = FamilyIPv4 | FamilyIPv6
	pf.apply(ev("p2", 2, running, "198.18.100.2"), false)
	if a := pf.target("p2").Egress; a != "" {
		t.Errorf("a proxy without a plan is named %s", a)
	}
}

// A request that names one address and leaves from another is a
// mismatch, whether the other is of the plan or not; the reason names
// both, probes name the same address until one leaves from it, and then
// the proxy comes back and its cycle goes on. A request naming an IPv4
// address that reached the target over IPv6 (a name resolved to IPv6)
// proves nothing of the named one: no mismatch, if it left from the plan.
func TestFoldRefusesARequestLeavingFromAnotherAddressThanNamed(t *testing.T) {
	for _, tc := range []struct{ name, wrong string }{
		{"another of its plan", "2001:db8:101::1f"},
		{"one not of its plan", "2001:db8:999::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pf := newEgressFold(t)
			e := ev("p1", 2, running, "198.18.101.5")
			e.Egress = plan17
			pf.apply(e, false)
			pf.named("p1", "")
			pf.named("p1", "")
			pf.want(map[string]string{"p1": "198.18.101.5:3128"})
			bad := pf.target("p1").Egress // 2001:db8:101::11
			if pf.named("p1", tc.wrong) != bad {
				t.Fatal("the named address changed")
			}
			pf.want(map[string]string{})
			r := pf.record("p1")
			if r.Verdict != messages.VerdictMismatch || !strings.HasPrefix(r.Reason, ReasonMismatch+": ") ||
				!strings.Contains(r.Reason, bad) || !strings.Contains(r.Reason, tc.wrong) {
				t.Fatalf("record %+v, want a mismatch naming %s and %s", r, bad, tc.wrong)
			}
			if n := pf.f.Stats().EgressMismatches; n != 1 {
				t.Fatalf("%d mismatches", n)
			}
			// Refused: named again, round after round, while it leaves
			// from the wrong address.
			for range 3 {
				if a := pf.named("p1", tc.wrong); a != bad {
					t.Fatalf("a refused proxy's probe named %s, want %s again", a, bad)
				}
			}
			pf.want(map[string]string{})
			// Fixed: the named address is seen, the mismatch goes, the
			// cycle goes on from the next address.
			pf.named("p1", "")
			if r := pf.record("p1"); r.Verdict != messages.VerdictOK || r.Reason != "" {
				t.Fatalf("record after the named address was seen: %+v", r)
			}
			pf.named("p1", "")
			pf.want(map[string]string{"p1": "198.18.101.5:3128"})
			if a := pf.target("p1").Egress; a != "2001:db8:101::13" {
				t.Errorf("after the fix the cycle names %s, want the next address", a)
			}
		})
	}

	pf := newEgressFold(t)
	e := ev("p1", 2, running, "198.18.101.5")
	e.Egress = plan17
	pf.apply(e, false)
	if a := pf.named("p1", "2001:db8:101::14"); a != "198.18.101.5" {
		t.Fatalf("named %s", a)
	}
	if r := pf.record("p1"); r.Verdict != messages.VerdictOK {
		t.Fatalf("a request of another family than the named address: %+v", r)
	}
}

// A probe that fails names the same address again: an address of the
// proxy's plan that never answers fails Fall probes in a row and takes
// the proxy out, instead of failing one probe in n between passes on the
// others. A failure that passes on its retry changes nothing, and the
// cycle goes on from the next address.
func TestFoldTakesOutAProxyWhoseNamedAddressKeepsFailing(t *testing.T) {
	pf := newEgressFold(t)
	e := ev("p1", 2, running, "198.18.101.5")
	e.Egress = plan17
	pf.apply(e, false)
	pf.named("p1", "")
	pf.named("p1", "")
	pf.want(map[string]string{"p1": "198.18.101.5:3128"})

	// One timeout, then the same address passes: still in, the cycle
	// resumes after it.
	flaky := pf.target("p1").Egress
	pf.result("p1", ProbeResult{Named: flaky})
	if a := pf.named("p1", ""); a != flaky {
		t.Fatalf("after a failure the probe named %s, want %s again", a, flaky)
	}
	pf.want(map[string]string{"p1": "198.18.101.5:3128"})
	next := pf.target("p1").Egress
	if next == flaky {
		t.Fatalf("after its pass the cycle stayed at %s", flaky)
	}

	// An address that always times out: named probe after probe, Fall
	// failures in a row, and the proxy leaves.
	for i := range pf.f.Fall {
		if a := pf.target("p1").Egress; a != next {
			t.Fatalf("failure %d: the probe named %s, want %s again", i, a, next)
		}
		pf.result("p1", ProbeResult{Named: next})
	}
	pf.want(map[string]string{})
}
