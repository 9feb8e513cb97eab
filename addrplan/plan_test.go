package addrplan

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"proxyfleet/messages"
)

func mustPlan(t *testing.T, c Config) *Plan {
	t.Helper()
	p, err := New("h1", c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewNamesTheBadField(t *testing.T) {
	for _, tc := range []struct {
		c     Config
		field string
	}{
		{Config{}, "ipv4"},
		{Config{IPv4: []string{"203.0.113.8/33"}}, "ipv4[0]"},
		{Config{IPv4: []string{"2001:db8::1"}}, "ipv4[0]"},
		{Config{IPv4: []string{"203.0.113.9/29"}}, "ipv4[0]"},
		{Config{IPv4: []string{"203.0.113.8/29", "203.0.113.10"}}, "ipv4[1]"},
		{Config{IPv4: []string{"203.0.113.8/29"}, IPv4Gateway: "x"}, "ipv4_gateway"},
		{Config{IPv6: []string{"2001:db8::/64"}, IPv4Gateway: "203.0.113.1"}, "ipv4_gateway"},
		{Config{IPv4: []string{"203.0.113.8/29"}, MACs: map[string]string{"198.51.100.7": "00:50:56:00:12:34"}}, "macs"},
		{Config{IPv4: []string{"198.51.100.7"}, MACs: map[string]string{"198.51.100.7": "01:50:56:00:12:34"}}, "macs"},
		{Config{IPv4: []string{"198.51.100.7"}, MACs: map[string]string{"198.51.100.7": "zz"}}, "macs"},
		{Config{IPv4: []string{"198.51.100.7", "198.51.100.8"}, MACs: map[string]string{"198.51.100.7": "00:50:56:00:12:34", "198.51.100.8": "00:50:56:00:12:34"}}, "macs"},
		{Config{IPv6: []string{"2001:db8::/64"}, IPv6PerProxy: 257}, "ipv6_per_proxy"},
		{Config{IPv6: []string{"2001:db8::/64"}, IPv6PerProxy: -1}, "ipv6_per_proxy"},
		{Config{IPv4: []string{"198.51.100.7"}, IPv6PerProxy: 4}, "ipv6_per_proxy"},
		{Config{IPv6: []string{"203.0.113.0/24"}}, "ipv6[0]"},
		{Config{IPv6: []string{"2001:db8::/64", "2001:db8::/48"}}, "ipv6[1]"},
		{Config{IPv6: []string{"2001:db8::/126"}, IPv6PerProxy: 4}, "ipv6[0]"},
		{Config{IPv6: []string{"2001:db8::/64"}, IPv6Gateway: "203.0.113.1"}, "ipv6_gateway"},
		{Config{IPv4: []string{"203.0.113.1"}, IPv4Gateway: "203.0.113.1"}, "ipv4"},
		{Config{IPv4: []string{"203.0.113.1"}, Nameservers: []string{"198.51.100.53", "resolver"}}, "nameservers[1]"},
		{Config{IPv4: []string{"203.0.113.1"}, Nameservers: []string{"fe80::1%eth0"}}, "nameservers[0]"},
		{Config{IPv4: []string{"203.0.113.1"}, Nameservers: []string{"0.0.0.0"}}, "nameservers[0]"},
		{Config{IPv4: []string{"203.0.113.1"}, Nameservers: []string{"198.51.100.53", "198.51.100.53"}}, "nameservers[1]"},
		{Config{IPv4: []string{"203.0.113.1"}, Nameservers: []string{"198.51.100.1", "198.51.100.2", "198.51.100.3", "198.51.100.4"}}, "nameservers"},
	} {
		_, err := New("h1", tc.c)
		var fe *messages.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.c, err, tc.field)
		}
	}
}

func TestSlotsGiveTheirAddresses(t *testing.T) {
	p := mustPlan(t, Config{
		IPv4:         []string{"203.0.113.8/29", "198.51.100.7"},
		IPv4Gateway:  "203.0.113.9",
		MACs:         map[string]string{"198.51.100.7": "00:50:56:00:12:34"},
		IPv6:         []string{"2001:db8:1:2::/64"},
		IPv6PerProxy: 16,
		Nameservers:  []string{"198.51.100.53", "2001:db8:53::53"},
	})
	// .8 (network), .9 (gateway) and .15 (broadcast) are left out.
	want4 := []string{"203.0.113.10", "203.0.113.11", "203.0.113.12", "203.0.113.13", "203.0.113.14", "198.51.100.7"}
	if p.Slots4() != len(want4) {
		t.Fatalf("Slots4 = %d, want %d", p.Slots4(), len(want4))
	}
	for i, w := range want4 {
		if got := p.IPv4(i + 1).String(); got != w {
			t.Errorf("IPv4(%d) = %s, want %s", i+1, got, w)
		}
		if n := p.Slot4Of(netip.MustParseAddr(w)); n != i+1 {
			t.Errorf("Slot4Of(%s) = %d, want %d", w, n, i+1)
		}
	}
	for _, a := range []string{"203.0.113.8", "203.0.113.9", "203.0.113.15", "198.51.100.8", "2001:db8:1:2::10"} {
		if n := p.Slot4Of(netip.MustParseAddr(a)); n != 0 {
			t.Errorf("Slot4Of(%s) = %d, want 0", a, n)
		}
	}
	if p.IPv4(0).IsValid() || p.IPv4(7).IsValid() {
		t.Error("slots 0 and 7 give an address")
	}
	if p.Slots6() != MaxSlots {
		t.Errorf("Slots6 = %d, want MaxSlots", p.Slots6())
	}
	got := p.IPv6(1)
	if len(got) != 16 || got[0].String() != "2001:db8:1:2::10" || got[15].String() != "2001:db8:1:2::1f" {
		t.Errorf("IPv6(1) = %v, want 2001:db8:1:2::10 to ::1f", got)
	}
	if got := p.IPv6(2); got[0].String() != "2001:db8:1:2::20" {
		t.Errorf("IPv6(2) starts at %s", got[0])
	}
	for _, a := range []string{"2001:db8:1:2::10", "2001:db8:1:2::1f"} {
		if n := p.Slot6Of(netip.MustParseAddr(a)); n != 1 {
			t.Errorf("Slot6Of(%s) = %d, want 1", a, n)
		}
	}
	if n := p.Slot6Of(netip.MustParseAddr("2001:db8:1:2::1")); n != 0 {
		t.Errorf("Slot6Of(::1) = %d, want 0 (the first slot's place is left out)", n)
	}

	n := p.Network(Slots{V4: 6, V6: 1})
	if n.IPv4.String() != "198.51.100.7" || n.MAC != "00:50:56:00:12:34" || n.IPv4Gateway.String() != "203.0.113.9" || len(n.IPv6) != 16 ||
		fmt.Sprint(n.Nameservers) != "[198.51.100.53 2001:db8:53::53]" {
		t.Errorf("Network(6, 1) = %+v", n)
	}
	m1, m2 := p.Network(Slots{V4: 1}).MAC, p.Network(Slots{V4: 2}).MAC
	if m1 == m2 || !strings.HasPrefix(m1, "52:54:00:") {
		t.Errorf("derived MACs %s, %s: want distinct, under 52:54:00", m1, m2)
	}
	if v6only := p.Network(Slots{V6: 1}).MAC; v6only == m1 {
		t.Errorf("an IPv6-only slot shares MAC %s with IPv4 slot 1", v6only)
	}
	if n := p.Network(Slots{}); n.Static() || n.MAC != "" || n.Nameservers != nil {
		t.Errorf("no slots give %+v", n)
	}
}

func TestSmallBlocksAndSingles(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.8/31", "203.0.113.20/32"}})
	if p.Slots4() != 3 {
		t.Fatalf("Slots4 = %d, want 3 (a /31 keeps both)", p.Slots4())
	}
	if p.ReuseAfter() != DefaultReuseAfter {
		t.Errorf("ReuseAfter = %s", p.ReuseAfter())
	}
}

func TestOverlapAcrossHosts(t *testing.T) {
	a := mustPlan(t, Config{IPv4: []string{"203.0.113.8/29"}})
	b, _ := New("h2", Config{IPv4: []string{"203.0.113.12"}})
	c, _ := New("h3", Config{IPv4: []string{"203.0.113.16/29"}})
	if Overlap(a, b) == nil {
		t.Error("no overlap found between 203.0.113.8/29 and 203.0.113.12")
	}
	if err := Overlap(a, c); err != nil {
		t.Error(err)
	}
}

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func TestAssignGivesDistinctSlotsLeastRecentlyUsedFirst(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.8/29"}, ReuseAfter: time.Hour}) // 6 addresses
	var st messages.AddrState
	for i := range 6 {
		s, err := p.Assign(&st, fmt.Sprintf("p%d", i), t0)
		if err != nil || s.V4 != i+1 {
			t.Fatalf("Assign p%d = %v, %v; want slot %d", i, s, err, i+1)
		}
	}
	// Again for one that holds slots: the same, nothing changes.
	if s, err := p.Assign(&st, "p2", t0); err != nil || s.V4 != 3 {
		t.Fatalf("Assign p2 again = %v, %v", s, err)
	}
	_, err := p.Assign(&st, "p6", t0)
	var fe *FullError
	if !errors.As(err, &fe) || !errors.Is(err, ErrNoAddress) || fe.Held != 6 {
		t.Fatalf("Assign on a full plan = %v", err)
	}
	// Free 4 then 2: neither is given within the hour; then 4 first
	// (freed longer ago).
	p.Release(&st, "p3", t0)
	p.Release(&st, "p1", t0.Add(time.Minute))
	if _, err := p.Assign(&st, "q1", t0.Add(59*time.Minute)); !errors.As(err, &fe) || fe.Cooling != 2 {
		t.Fatalf("Assign while both cool = %v", err)
	}
	s, err := p.Assign(&st, "q1", t0.Add(61*time.Minute))
	if err != nil || s.V4 != 4 {
		t.Fatalf("Assign after p3's cooled = %v, %v; want slot 4", s, err)
	}
	s, err = p.Assign(&st, "q2", t0.Add(62*time.Minute))
	if err != nil || s.V4 != 2 {
		t.Fatalf("Assign after p1's cooled = %v, %v; want slot 2", s, err)
	}
	if v4, _ := p.Usage(&st, t0.Add(62*time.Minute)); v4 != (Usage{Slots: 6, Held: 6}) {
		t.Errorf("Usage = %+v", v4)
	}
}

func TestNeverGivenSlotsComeBeforeFreedOnes(t *testing.T) {
	p := mustPlan(t, Config{IPv6: []string{"2001:db8::/64"}, IPv6PerProxy: 16, ReuseAfter: time.Minute})
	var st messages.AddrState
	a, _ := p.Assign(&st, "a", t0)
	p.Release(&st, "a", t0)
	b, _ := p.Assign(&st, "b", t0.Add(time.Hour))
	if b.V6 == a.V6 {
		t.Fatalf("a slot freed an hour ago was given again while never-given slots remain")
	}
	// While never-given slots remain, freed times past ReuseAfter are
	// pruned: the record does not grow with churn.
	for i := range 100 {
		id := fmt.Sprintf("c%d", i)
		_, _ = p.Assign(&st, id, t0.Add(2*time.Hour))
		p.Release(&st, id, t0.Add(2*time.Hour))
	}
	_, _ = p.Assign(&st, "d", t0.Add(3*time.Hour))
	if len(st.V6.Freed) != 0 {
		t.Errorf("%d freed times kept past ReuseAfter", len(st.V6.Freed))
	}
}

func TestAssignLeavesTheStateAloneWhenFull(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.7"}, IPv6: []string{"2001:db8::/64"}})
	var st messages.AddrState
	if _, err := p.Assign(&st, "a", t0); err != nil {
		t.Fatal(err)
	}
	next6 := st.V6.Next
	if _, err := p.Assign(&st, "b", t0); !errors.Is(err, ErrNoAddress) {
		t.Fatalf("err = %v", err)
	}
	if _, ok := st.Slots["b"]; ok || st.V6.Next != next6 {
		t.Errorf("a refused assignment changed the state: %+v", st)
	}
}

func TestTakeRefusesAHeldSlot(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.8/29"}})
	var st messages.AddrState
	_, _ = p.Assign(&st, "a", t0)
	if err := p.Take(&st, "b", Slots{V4: 1}, t0); !errors.Is(err, ErrTaken) {
		t.Fatalf("Take of a's slot = %v", err)
	}
	if err := p.Take(&st, "b", Slots{V4: 5}, t0); err != nil {
		t.Fatal(err)
	}
	// Slots below a taken one count as given before (found domains are
	// rare): the never-given slot 6 comes first.
	if s, _ := p.Assign(&st, "c", t0); s.V4 != 6 {
		t.Errorf("next slot %d, want 6", s.V4)
	}
	if s, _ := Held(&st, "b"); s.V4 != 5 {
		t.Errorf("b holds %v", s)
	}
}

// Holders names the other proxies holding a slot of either family: the
// ones a Take is refused for.
func TestHoldersNamesWhoHoldsASlot(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.8/29"}, IPv6: []string{"2001:db8::/64"}})
	var st messages.AddrState
	for _, id := range []string{"a", "b", "c"} {
		if _, err := p.Assign(&st, id, t0); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := Held(&st, "a")
	b, _ := Held(&st, "b")
	if got := Holders(&st, "x", Slots{V4: a.V4, V6: b.V6}); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("holders of a's IPv4 and b's IPv6 slot: %v, want [a b]", got)
	}
	if got := Holders(&st, "a", a); len(got) != 0 {
		t.Errorf("holders of a's slots but a: %v, want none", got)
	}
	if got := Holders(&st, "x", Slots{V4: 6}); len(got) != 0 {
		t.Errorf("holders of a free slot: %v, want none", got)
	}
	// Released, a's slots are taken by x.
	p.Release(&st, "a", t0)
	if err := p.Take(&st, "x", a, t0); err != nil {
		t.Fatal(err)
	}
}

// No two slots of one host derive one MAC, IPv4 or IPv6-only, up to
// MaxSlots.
func TestDerivedMACsAreDistinct(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"198.18.0.0/16"}, IPv6: []string{"2001:db8::/64"}})
	seen := map[string]Slots{}
	for n := 1; n <= MaxSlots; n++ {
		for _, s := range []Slots{{V4: n}, {V6: n}} {
			m := p.Network(s).MAC
			if o, ok := seen[m]; ok {
				t.Fatalf("slots %v and %v both derive %s", o, s, m)
			}
			seen[m] = s
		}
	}
}

// Every IPv4 slot's address is the plan's, given once, and Slot4Of finds
// the slot again: blocks of each kind, a gateway inside one.
func TestIPv4SlotsRoundTrip(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.0/28", "203.0.113.16/31", "198.51.100.7", "203.0.113.64/26"}, IPv4Gateway: "203.0.113.70"})
	// 14 + 2 + 1 + (62 less the gateway)
	if p.Slots4() != 14+2+1+61 {
		t.Fatalf("Slots4 = %d", p.Slots4())
	}
	seen := map[netip.Addr]bool{}
	for n := 1; n <= p.Slots4(); n++ {
		a := p.IPv4(n)
		if !a.IsValid() || seen[a] || a.String() == "203.0.113.70" || a.String() == "203.0.113.0" || a.String() == "203.0.113.127" {
			t.Fatalf("slot %d gives %s", n, a)
		}
		seen[a] = true
		if got := p.Slot4Of(a); got != n {
			t.Fatalf("Slot4Of(%s) = %d, want %d", a, got, n)
		}
	}
}

// AssignFree, given the slots the proxies hold, decides as Assign does
// for a proxy that holds none, through churn: slots given, freed, cooling
// and given again, up to a full plan.
func TestAssignFreeAsAssign(t *testing.T) {
	p := mustPlan(t, Config{IPv4: []string{"203.0.113.8/29", "198.51.100.7"}, IPv6: []string{"2001:db8::/64"}, IPv6PerProxy: 16, ReuseAfter: time.Minute})
	var st messages.AddrState
	now := t0
	for i := range 200 {
		now = now.Add(7 * time.Second)
		id := fmt.Sprintf("p%d", i)
		held := make([]messages.AddrSlots, 0, len(st.Slots))
		for _, a := range st.Slots {
			held = append(held, a)
		}
		free := messages.AddrState{V4: cloneSpace(st.V4), V6: cloneSpace(st.V6)}
		got, gotErr := p.AssignFree(&free, held, now)
		want, wantErr := p.Assign(&st, id, now)
		if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(free.V4, st.V4) || !reflect.DeepEqual(free.V6, st.V6) {
			t.Fatalf("%s: AssignFree = %v, %v, spaces %+v %+v; Assign = %v, %v, spaces %+v %+v", id, got, gotErr, free.V4, free.V6, want, wantErr, st.V4, st.V6)
		}
		if i%3 == 2 { // free one of every three, the oldest held
			for j := i - 2; j >= 0; j-- {
				if p.Release(&st, fmt.Sprintf("p%d", j), now) {
					break
				}
			}
		}
	}
}

func cloneSpace(sp messages.SlotSpace) messages.SlotSpace {
	sp.Freed = maps.Clone(sp.Freed)
	return sp
}
