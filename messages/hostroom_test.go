package messages

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"
)

// hostRoomSeeds are stored records and near misses: the form
// encoding/json writes, and others it reads or refuses.
func hostRoomSeeds(t testing.TB) [][]byte {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	rec := HostRecord{V: Version, Host: "h1", MaxProxies: 10, State: HostQuarantined, Since: now, Until: now, CoolDownMS: 5,
		Reason: "a \"quoted\" \u00e9 <reason>", At: now, Proxies: map[string]uint64{"p1": 1, "p2": 18446744073709551615, "p3": 0},
		Plan:      &AddrPlan{IPv4: []string{"198.18.0.0/30"}, MACs: map[string]string{"198.18.0.1": "00:50:56:00:12:34"}, IPv6PerProxy: 16},
		Addresses: EncodeAddrs(AddrState{Slots: SlotMap{"p1": {1, 2}}, V4: SlotSpace{Next: 3, Freed: map[int]time.Time{2: now}}})}
	full, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	out := [][]byte{full}
	for _, s := range []string{
		`{}`, ` { } `, `{"proxies":{}}`, `{"proxies":null}`, `{"proxies":{"a":1},"proxies":{"b":2}}`,
		`{"Proxies":{"a":1}}`, `{"STATE":"quarantined"}`, `{"state":"quar\u0061ntined"}`, `{"state":null}`,
		`{"proxies":{"a":1,"a":2}}`, `{"proxies":{"a":01}}`, `{"proxies":{"a":1.0}}`, `{"proxies":{"a":-1}}`,
		`{"proxies":{"a":18446744073709551616}}`, `{"proxies":{"a\u0062":1}}`, `{"proxies":{"a":1,}}`,
		`{"plan":{"ipv4":["x"]},"proxies":{"a":1}}`, `{"plan":[1,2.5e-3,-0,true,false,null,{"x":"\u00e9\n"}]}`,
		`{"plan":01}`, `{"plan":1.}`, `{"plan":"\x01"}`, `{"plan":"\q"}`, `{"plan":[1,]}`, `{"at":"x"} x`,
		`{"v":"one","proxies":{"a":1}}`, `{"unknown":1}`, `[]`, `null`, `{"proxies":{"a":1}`, "{\"proxies\":{\"\xff\":1}}",
		`{ "proxies" : { "a" : 1 , "b" : 2 } , "state" : "ok" }`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// DecodeHostRoom reads a record's proxies and state as decoding the whole
// record does, and refuses what that refuses unless only a field it
// skips is of the wrong type.
func FuzzDecodeHostRoom(f *testing.F) {
	for _, s := range hostRoomSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		room, err := DecodeHostRoom(b)
		var rec HostRecord
		want := json.Unmarshal(b, &rec)
		var slim struct {
			Proxies map[string]uint64 `json:"proxies"`
			State   string            `json:"state"`
		}
		wantSlim := json.Unmarshal(b, &slim)
		if (err == nil) != (wantSlim == nil) {
			t.Fatalf("%q: DecodeHostRoom: %v; encoding/json: %v", b, err, wantSlim)
		}
		if err != nil {
			return
		}
		if want == nil && (!maps.Equal(room.Proxies, rec.Proxies) || (room.Proxies == nil) != (rec.Proxies == nil) || room.State != rec.State) {
			t.Fatalf("%q: DecodeHostRoom: %v %q; the record: %v %q", b, room.Proxies, room.State, rec.Proxies, rec.State)
		}
		whole, err := room.Record(HostRecord{})
		if (err == nil) != (want == nil) {
			t.Fatalf("%q: Record: %v; encoding/json: %v", b, err, want)
		}
		if want == nil && !reflect.DeepEqual(whole, rec) {
			t.Fatalf("%q: Record: %+v; encoding/json: %+v", b, whole, rec)
		}
		if !maps.Equal(room.Proxies, slim.Proxies) || room.State != slim.State {
			t.Fatalf("%q: DecodeHostRoom: %v %q; encoding/json: %v %q", b, room.Proxies, room.State, slim.Proxies, slim.State)
		}
	})
}

// The form encoding/json writes is read without encoding/json.
func TestDecodeHostRoomScansStoredForm(t *testing.T) {
	full := hostRoomSeeds(t)[0]
	r, ok := scanHostRoom(full)
	if !ok || len(r.Proxies) != 3 || !r.Quarantined() {
		t.Fatalf("scan of %s: %v, %v", full, r, ok)
	}
	for _, s := range []string{`{"Proxies":{"a":1}}`, `{"proxies":{"a":1},"proxies":{}}`, `{"proxies":null}`} {
		if _, ok := scanHostRoom([]byte(s)); ok {
			t.Errorf("scan of %s: read; want it left to encoding/json", s)
		}
	}
}

func BenchmarkDecodeHostRoom(b *testing.B) {
	rec := HostRecord{V: Version, Host: "h1", State: HostOK, Proxies: map[string]uint64{}}
	st := AddrState{Slots: SlotMap{}}
	for i := range 100 {
		rec.Proxies[fmt.Sprintf("p%05d", i)] = uint64(i)
		st.Slots[fmt.Sprintf("p%05d", i)] = AddrSlots{i + 1, i + 1}
	}
	rec.Addresses = EncodeAddrs(st)
	raw, _ := json.Marshal(rec)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeHostRoom(raw); err != nil {
			b.Fatal(err)
		}
	}
}
