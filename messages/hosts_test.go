package messages

import (
	"cmp"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHostAddrsRoundTrip(t *testing.T) {
	freed := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	st := AddrState{
		Slots: map[string]AddrSlots{"p1": {V4: 1, V6: 1}, "p2": {V4: 3}},
		V4:    SlotSpace{Next: 3, Freed: map[int]time.Time{2: freed}},
		V6:    SlotSpace{Next: 1},
	}
	rec := HostRecord{V: 1, Host: "h1", Proxies: map[string]uint64{"p1": 1, "p2": 2}, Addresses: EncodeAddrs(st)}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var back HostRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := back.Addresses.Decode()
	if err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, st)
	}
	// What Decode returns is the caller's: changing it changes no copy.
	got.Slots["p3"] = AddrSlots{V4: 4}
	if again, _ := back.Addresses.Decode(); len(again.Slots) != 2 {
		t.Errorf("a change to a decoded state reached the record: %+v", again.Slots)
	}
}

func TestHostAddrsEmptyIsOmitted(t *testing.T) {
	b, err := json.Marshal(HostRecord{V: 1, Host: "h1", Addresses: EncodeAddrs(AddrState{Slots: map[string]AddrSlots{}})})
	if err != nil || strings.Contains(string(b), "addresses") {
		t.Fatalf("a record with no assignments: %s, %v; want no addresses field", b, err)
	}
	for _, in := range []string{`{"v":1}`, `{"v":1,"addresses":null}`, `{"v":1,"addresses":{}}`} {
		var rec HostRecord
		if err := json.Unmarshal([]byte(in), &rec); err != nil || !rec.Addresses.IsZero() {
			t.Errorf("%s: %+v, %v; want no assignments", in, rec.Addresses, err)
		}
		if st, err := rec.Addresses.Decode(); err != nil || st.Slots != nil {
			t.Errorf("%s: decoded %+v, %v", in, st, err)
		}
	}
}

func TestHostAddrsMalformed(t *testing.T) {
	var rec HostRecord
	if err := json.Unmarshal([]byte(`{"v":1,"addresses":[1]}`), &rec); err == nil || !strings.Contains(err.Error(), "addresses") {
		t.Errorf("addresses as an array: %v, want an error naming addresses", err)
	}
	if err := json.Unmarshal([]byte(`{"v":1,"addresses":{"slots":{"p1":"x"}}}`), &rec); err != nil {
		t.Fatalf("a record whose addresses are malformed inside still decodes: %v", err)
	}
	if _, err := rec.Addresses.Decode(); err == nil || !strings.Contains(err.Error(), "decode addresses") {
		t.Errorf("Decode of a malformed slot: %v, want an error", err)
	}
}

func TestAddrSlotsArePairs(t *testing.T) {
	b, err := json.Marshal(AddrState{Slots: map[string]AddrSlots{"p1": {V4: 1, V6: 2}}})
	if err != nil || string(b) != `{"slots":{"p1":[1,2]}}` {
		t.Fatalf("encoded %s, %v", b, err)
	}
	var st AddrState
	if err := json.Unmarshal([]byte(`{"slots":{"p1":[ 3 , 0 ]}}`), &st); err != nil || st.Slots["p1"] != (AddrSlots{V4: 3}) {
		t.Errorf("a pair with whitespace: %+v, %v", st.Slots, err)
	}
	for _, bad := range []string{`{"slots":{"p1":[1]}}`, `{"slots":{"p1":[1,-2]}}`, `{"slots":{"p1":{"v4":1}}}`,
		`{"slots":{"p1":[1,2,3]}}`, `{"slots":{"p1":[1.5,2]}}`, `{"slots":{"p1":["1",2]}}`, `{"slots":{"p1":[1,9999999999]}}`} {
		var st AddrState
		if err := json.Unmarshal([]byte(bad), &st); err == nil || !strings.Contains(err.Error(), "slots") {
			t.Errorf("%s: %v, want an error naming slots", bad, err)
		}
	}
}

// EncodeAddrs writes what encoding/json writes of the same state.
func TestEncodeAddrsIsJSON(t *testing.T) {
	at := time.Date(2026, 12, 5, 7, 0, 0, 123456789, time.UTC)
	for _, st := range []AddrState{
		{Slots: SlotMap{"p1": {V4: 1, V6: 1}}},
		{V4: SlotSpace{Next: 3}},
		{V6: SlotSpace{Freed: map[int]time.Time{2: at}}},
		{
			Slots: SlotMap{"b": {V4: 2}, "a": {V6: 12}, "c<&>": {V4: 3, V6: 4}},
			V4:    SlotSpace{Next: 3, Freed: map[int]time.Time{1: at, 10: at.Add(time.Hour), 2: at}},
			V6:    SlotSpace{Next: 12, Freed: map[int]time.Time{3: at.In(time.FixedZone("x", 3600))}},
		},
	} {
		type plain struct { // AddrState's fields without their MarshalJSON
			Slots map[string][2]int `json:"slots,omitempty"`
			V4    SlotSpace         `json:"v4,omitzero"`
			V6    SlotSpace         `json:"v6,omitzero"`
		}
		p := plain{V4: st.V4, V6: st.V6}
		for k, v := range st.Slots {
			if p.Slots == nil {
				p.Slots = map[string][2]int{}
			}
			p.Slots[k] = [2]int{v.V4, v.V6}
		}
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(EncodeAddrs(st))
		if string(got) != string(want) {
			t.Errorf("EncodeAddrs(%+v):\n%s\nwant\n%s", st, got, want)
		}
		back, err := EncodeAddrs(st).Decode()
		if err != nil || !reflect.DeepEqual(back.Slots, st.Slots) || back.V4.Next != st.V4.Next || len(back.V6.Freed) != len(st.V6.Freed) {
			t.Errorf("round trip of %+v: %+v, %v", st, back, err)
		}
	}
}

// Held answers as Decode's Slots do, for the form EncodeAddrs writes and
// for any other a record may hold.
func TestHostAddrsHeldAsDecode(t *testing.T) {
	freed := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	st := AddrState{
		Slots: map[string]AddrSlots{"p1": {V4: 1, V6: 1}, "p2": {V4: 3}, "p10": {V6: 7}},
		V4:    SlotSpace{Next: 3, Freed: map[int]time.Time{2: freed}},
		V6:    SlotSpace{Next: 7},
	}
	var other HostAddrs // the same assignments, written with whitespace
	if err := json.Unmarshal([]byte(`{ "slots": {"p1": [1, 1], "p2": [3,0], "p10": [0,7]}, "v4": {"next": 3} }`), &other); err != nil {
		t.Fatal(err)
	}
	var repeated HostAddrs // a key twice: the last counts, as encoding/json reads it
	if err := json.Unmarshal([]byte(`{"slots":{"p1":[9,9],"p2":[3,0],"p1":[1,1],"p10":[0,7]}}`), &repeated); err != nil {
		t.Fatal(err)
	}
	var onlySpaces HostAddrs // no slots at all
	if err := json.Unmarshal([]byte(`{"v4":{"next":3}}`), &onlySpaces); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]HostAddrs{"encoded": EncodeAddrs(st), "spaced": other, "repeated": repeated, "no slots": onlySpaces, "zero": {}} {
		want, err := h.Decode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, id := range []string{"p1", "p2", "p10", "p", "p3", `p"1`, "slots", "v4"} {
			got, ok, err := h.Held(id)
			w, wok := want.Slots[id]
			if err != nil || ok != wok || got != w {
				t.Errorf("%s: Held(%q) = %+v, %v, %v; Decode's slots say %+v, %v", name, id, got, ok, err, w, wok)
			}
		}
	}
	bad := HostAddrs{raw: []byte(`{"slots":{"p1":[1,x]}}`)}
	if _, _, err := bad.Held("p2"); err == nil {
		t.Error("Held of malformed assignments: no error")
	}
}

// Adding and With write what EncodeAddrs writes of the decoded
// assignments with the proxy's slots added, wherever its key sorts; a
// form other than EncodeAddrs's, a malformed one, or a proxy holding
// slots already is left to Decode.
func TestHostAddrsAddingAsEncode(t *testing.T) {
	freed := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	encoded := func(slots map[string]AddrSlots, v4, v6 SlotSpace) HostAddrs {
		return EncodeAddrs(AddrState{Slots: slots, V4: v4, V6: v6})
	}
	three := map[string]AddrSlots{"p1": {V4: 1, V6: 1}, "p2": {V4: 3}, "p4": {V6: 7}}
	cases := map[string]HostAddrs{
		"zero":       {},
		"one":        encoded(map[string]AddrSlots{"p2": {V4: 2, V6: 2}}, SlotSpace{Next: 2}, SlotSpace{Next: 2}),
		"three":      encoded(three, SlotSpace{Next: 3, Freed: map[int]time.Time{2: freed}}, SlotSpace{Next: 7}),
		"no spaces":  encoded(three, SlotSpace{}, SlotSpace{}),
		"only v6":    encoded(three, SlotSpace{}, SlotSpace{Next: 7, Freed: map[int]time.Time{3: freed, 10: freed}}),
		"only freed": encoded(three, SlotSpace{Freed: map[int]time.Time{2: freed}}, SlotSpace{}),
	}
	spaces := []SlotSpace{{}, {Next: 9}, {Next: 9, Freed: map[int]time.Time{4: freed, 12: freed}}}
	for name, h := range cases {
		for _, id := range []string{"p0", "p1a", "p3", "p9", "a", "q"} {
			a, ok := h.Adding(id)
			if !ok {
				t.Fatalf("%s: Adding(%q) not ok", name, id)
			}
			st, err := h.Decode()
			if err != nil {
				t.Fatal(err)
			}
			var held []AddrSlots
			for _, s := range st.Slots {
				held = append(held, s)
			}
			slices.SortFunc(held, func(x, y AddrSlots) int { return cmp.Or(cmp.Compare(x.V4, y.V4), cmp.Compare(x.V6, y.V6)) })
			got := slices.SortedFunc(slices.Values(a.Held), func(x, y AddrSlots) int { return cmp.Or(cmp.Compare(x.V4, y.V4), cmp.Compare(x.V6, y.V6)) })
			if !slices.Equal(got, held) || !reflect.DeepEqual(a.Spaces, AddrState{V4: st.V4, V6: st.V6}) {
				t.Errorf("%s: Adding(%q) read %+v and %+v; Decode says %+v", name, id, got, a.Spaces, st)
			}
			for _, sp := range spaces {
				a.Spaces.V4, a.Spaces.V6 = sp, st.V6
				if st.Slots == nil {
					st.Slots = SlotMap{}
				}
				st.Slots[id] = AddrSlots{V4: 5, V6: 11}
				st.V4 = sp
				want := EncodeAddrs(st)
				if w := a.With(AddrSlots{V4: 5, V6: 11}); string(w.raw) != string(want.raw) {
					t.Errorf("%s: Adding(%q).With = %s, want %s", name, id, w.raw, want.raw)
				}
				delete(st.Slots, id)
			}
		}
	}
	raw := func(s string) HostAddrs { return HostAddrs{raw: []byte(s)} }
	spaced := raw(`{ "slots": {"p1": [1, 1]}, "v4": {"next": 3} }`)
	unsorted := raw(`{"slots":{"p2":[2,0],"p1":[1,1]}}`)
	repeated := raw(`{"slots":{"p1":[9,9],"p1":[1,1]}}`)
	slotsTwice := raw(`{"slots":{"p1":[1,1]},"slots":{"p2":[2,2]}}`)
	badPair := raw(`{"slots":{"p1":[1,x]}}`)
	badRest := raw(`{"slots":{"p1":[1,1]},"v4":{"next":"x"}}`)
	for name, c := range map[string]struct {
		h  HostAddrs
		id string
	}{
		"spaced": {spaced, "p2"}, "unsorted": {unsorted, "p3"}, "repeated": {repeated, "p2"},
		"slots twice": {slotsTwice, "p3"}, "bad pair": {badPair, "p2"}, "bad rest": {badRest, "p2"},
		"held": {cases["three"], "p2"}, "escaped id": {cases["three"], `p"5`}, "escaped id, zero": {HostAddrs{}, "p<5"},
	} {
		if _, ok := c.h.Adding(c.id); ok {
			t.Errorf("%s: Adding(%q) ok; want it left to Decode", name, c.id)
		}
	}
}
