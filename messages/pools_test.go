package messages

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDecodePoolSet(t *testing.T) {
	p, err := DecodePoolSet([]byte(`{"v":1,"name":"eu","size":20,"min_ready":18,"surge":2,"max_age":"6h","ready_timeout":"3m",
		"recycle_after_bans":3,"spec":{"image":"debian-12","cpus":2,"memory_mib":512,"labels":{"team":"a"},"hosts":["h1","h2"]}}`), "eu")
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "eu" || p.Size != 20 || *p.MinReady != 18 || *p.Surge != 2 || p.MaxAge.D() != 6*time.Hour ||
		p.ReadyTimeout.D() != 3*time.Minute || p.RecycleAfterBans != 3 || p.Spec.Image != "debian-12" || p.Spec.CPUs != 2 || p.Spec.Labels["team"] != "a" ||
		len(p.Spec.Hosts) != 2 {
		t.Fatalf("decoded %+v", p)
	}
	minReady, surge, rt := p.Resolved()
	if minReady != 18 || surge != 2 || rt != 3*time.Minute {
		t.Fatalf("resolved %d %d %s", minReady, surge, rt)
	}

	p, err = DecodePoolSet([]byte(`{"v":1,"name":"eu","size":3}`), "eu")
	if err != nil {
		t.Fatal(err)
	}
	minReady, surge, rt = p.Resolved()
	if p.MinReady != nil || p.Surge != nil || p.MaxAge != 0 || p.RecycleAfterBans != 0 || minReady != 3 || surge != DefaultPoolSurge || rt != DefaultPoolReadyTimeout {
		t.Fatalf("defaults: %+v → %d %d %s", p, minReady, surge, rt)
	}

	// What a client encodes decodes to the same.
	b, err := json.Marshal(PoolSet{V: 1, Name: "eu", Size: 2, MaxAge: Duration(90 * time.Second), Spec: PoolSpec{Hosts: []string{"h1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"max_age":"1m30s"`) {
		t.Fatalf("encoded %s", b)
	}
	if p, err = DecodePoolSet(b, "eu"); err != nil || p.MaxAge.D() != 90*time.Second || p.Spec.Hosts[0] != "h1" {
		t.Fatalf("round trip %s: %+v %v", b, p, err)
	}
}

func TestDecodePoolErrorsNameTheField(t *testing.T) {
	long := strings.Repeat("a", MaxPoolName+1)
	for _, tc := range []struct {
		body, name, field string
	}{
		{``, "eu", "body"},
		{`{"v":1,"name":"eu"}`, "eu", "size"},
		{`{"v":2,"name":"eu","size":1}`, "eu", "v"},
		{`{"v":1,"size":1}`, "eu", "name"},
		{`{"v":1,"name":"EU","size":1}`, "EU", "name"},
		{`{"v":1,"name":"` + long + `","size":1}`, long, "name"},
		{`{"v":1,"name":"eu","size":1}`, "us", "name"},
		{`{"v":1,"name":"eu","size":-1}`, "eu", "size"},
		{`{"v":1,"name":"eu","size":1001}`, "eu", "size"},
		{`{"v":1,"name":"eu","size":"2"}`, "eu", "size"},
		{`{"v":1,"name":"eu","size":2,"min_ready":3}`, "eu", "min_ready"},
		{`{"v":1,"name":"eu","size":2,"min_ready":-1}`, "eu", "min_ready"},
		{`{"v":1,"name":"eu","size":2,"surge":0}`, "eu", "surge"},
		{`{"v":1,"name":"eu","size":2,"surge":101}`, "eu", "surge"},
		{`{"v":1,"name":"eu","size":2,"max_age":"6 hours"}`, "eu", "max_age"},
		{`{"v":1,"name":"eu","size":2,"max_age":"10ms"}`, "eu", "max_age"},
		{`{"v":1,"name":"eu","size":2,"max_age":6}`, "eu", "max_age"},
		{`{"v":1,"name":"eu","size":2,"ready_timeout":"0s"}`, "eu", "ready_timeout"},
		{`{"v":1,"name":"eu","size":2,"ready_timeout":"48h"}`, "eu", "ready_timeout"},
		{`{"v":1,"name":"eu","size":2,"recycle_after_bans":-1}`, "eu", "recycle_after_bans"},
		{`{"v":1,"name":"eu","size":2,"recycle_after_bans":1001}`, "eu", "recycle_after_bans"},
		{`{"v":1,"name":"eu","size":2,"recycle_after_bans":"2"}`, "eu", "recycle_after_bans"},
		{`{"v":1,"name":"eu","size":2,"x":1}`, "eu", "x"},
		{`{"v":1,"name":"eu","size":2,"spec":[]}`, "eu", "spec"},
		{`{"v":1,"name":"eu","size":2,"spec":{"imag":"x"}}`, "eu", "spec.imag"},
		{`{"v":1,"name":"eu","size":2,"spec":{"Image":"x"}}`, "eu", "spec.Image"},
		{`{"v":1,"name":"eu","size":2,"spec":{"image":"a.b"}}`, "eu", "spec.image"},
		{`{"v":1,"name":"eu","size":2,"spec":{"cpus":65}}`, "eu", "spec.cpus"},
		{`{"v":1,"name":"eu","size":2,"spec":{"cpus":"1"}}`, "eu", "spec.cpus"},
		{`{"v":1,"name":"eu","size":2,"spec":{"memory_mib":10}}`, "eu", "spec.memory_mib"},
		{`{"v":1,"name":"eu","size":2,"spec":{"labels":{"pool":"x"}}}`, "eu", "spec.labels"},
		{`{"v":1,"name":"eu","size":2,"spec":{"labels":{"a b":"x"}}}`, "eu", "spec.labels"},
		{`{"v":1,"name":"eu","size":2,"spec":{"hosts":["h1","h1"]}}`, "eu", "spec.hosts"},
		{`{"v":1,"name":"eu","size":2,"spec":{"hosts":["H1"]}}`, "eu", "spec.hosts"},
	} {
		_, err := DecodePoolSet([]byte(tc.body), tc.name)
		fe, ok := AsFieldError(err)
		if !ok {
			t.Errorf("%.70s: error %v, want a field error", tc.body, err)
			continue
		}
		if fe.Field != tc.field {
			t.Errorf("%.70s: field %q (%s), want %q", tc.body, fe.Field, fe.Reason, tc.field)
		}
	}
	for _, tc := range []struct {
		body, field string
	}{
		{`{"v":1,"name":"eu"}`, ""},
		{`{"v":1,"name":"eu","all":true}`, ""},
		{`{"v":1,"name":"eu","ids":["eu-abc123"]}`, ""},
		{`{"v":1,"name":"eu","ids":["eu-abc123"],"all":true}`, "ids"},
		{`{"v":1,"name":"eu","ids":[]}`, "ids"},
		{`{"v":1,"name":"eu","ids":["A"]}`, "ids"},
		{`{"v":1,"name":"eu","size":1}`, "size"},
	} {
		_, errDelete := DecodePoolDelete([]byte(tc.body), "eu")
		_, errRecycle := DecodePoolRecycle([]byte(tc.body), "eu")
		want := tc.field
		if tc.body == `{"v":1,"name":"eu"}` {
			if errDelete != nil {
				t.Errorf("delete %s: %v", tc.body, errDelete)
			}
			want = "ids"
		}
		if want == "" {
			if errRecycle != nil {
				t.Errorf("recycle %s: %v", tc.body, errRecycle)
			}
			continue
		}
		if fe, ok := AsFieldError(errRecycle); !ok || fe.Field != want {
			t.Errorf("recycle %s: %v, want field %s", tc.body, errRecycle, want)
		}
	}
}

func TestPoolSubjects(t *testing.T) {
	s := NewSubjects("fleet.a")
	for _, op := range []string{OpPoolSet, OpPoolDelete, OpPoolRecycle} {
		subj := s.PoolCommand(op, "eu")
		gotOp, name, err := s.ParsePoolCommand(subj)
		if err != nil || gotOp != op || name != "eu" {
			t.Errorf("%s: %q %q %v", subj, gotOp, name, err)
		}
	}
	if s.PoolSet("eu") != "fleet.a.cmd.pool.set.eu" || s.PoolResult("eu") != "fleet.a.result.pool.eu" ||
		s.PoolCommandAll() != "fleet.a.cmd.pool.>" || s.ResultProxies() != "fleet.a.result.*" {
		t.Fatal(s.PoolSet("eu"), s.PoolResult("eu"), s.PoolCommandAll(), s.ResultProxies())
	}
	for _, bad := range []string{"fleet.a.cmd.pool.stop.eu", "fleet.a.cmd.pool.set", "fleet.a.cmd.pool.set.a.b", "fleet.a.cmd.create.eu"} {
		if _, _, err := s.ParsePoolCommand(bad); err == nil {
			t.Errorf("ParsePoolCommand(%q) accepted", bad)
		}
	}
}

// TestPoolRecordJSON pins the record's encoding: every controller and
// client reads what others wrote.
func TestPoolRecordJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := PoolRecord{V: 1, Name: "eu", Op: "set", Seq: 9, CommandID: "c1", Size: 2, MinReady: 2, Surge: 1,
		MaxAge: Duration(time.Hour), ReadyTimeout: Duration(5 * time.Minute), Spec: PoolSpec{Image: "img"},
		Members: []PoolMember{{ID: "eu-aaaaaa", Host: "h1", Created: at, Jitter: 0.05, Published: true, Ready: at,
			Retired: &PoolRetire{At: at, Why: RetireRecycle, Published: true}}},
		Pending: []PoolPending{{CommandID: "c1", Op: OpPoolSet, Seq: 9}}, State: PoolFilling, At: at}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"v":1,"name":"eu","op":"set","seq":9,"command_id":"c1","size":2,"min_ready":2,"surge":1,"max_age":"1h0m0s","ready_timeout":"5m0s","spec":{"image":"img"},` +
		`"members":[{"id":"eu-aaaaaa","host":"h1","created":"2026-01-02T03:04:05Z","jitter":0.05,"published":true,"ready":"2026-01-02T03:04:05Z",` +
		`"retired":{"at":"2026-01-02T03:04:05Z","why":"recycle","published":true}}],"pending":[{"command_id":"c1","op":"pool.set","seq":9}],` +
		`"state":"filling","at":"2026-01-02T03:04:05Z"}`
	if string(b) != want {
		t.Fatalf("record encodes as\n%s\nwant\n%s", b, want)
	}
	var back PoolRecord
	if err := json.Unmarshal(b, &back); err != nil || back.MaxAge.D() != time.Hour || back.Members[0].Retired.Why != RetireRecycle {
		t.Fatalf("decode: %+v %v", back, err)
	}
	if m, ok := back.Member("eu-aaaaaa"); !ok || m.Host != "h1" {
		t.Fatalf("member: %+v %v", m, ok)
	}
	if d := back.Members[0].Deadline(time.Hour); !d.Equal(at.Add(57 * time.Minute)) {
		t.Fatalf("deadline %s", d)
	}
}

// A member is due for the first cause that holds, in the documented
// order; the summary counts those due for their bans apart.
func TestPoolMemberDueCause(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := PoolRecord{Size: 4, MaxAge: Duration(time.Hour), RecycleAfterBans: 2, Spec: PoolSpec{Image: "img", Hosts: []string{"h1"}}}
	spec := r.Spec.Hash()
	for _, tc := range []struct {
		m     PoolMember
		cause string
	}{
		{PoolMember{ID: "a", Host: "h1", Created: at, Spec: spec}, ""},
		{PoolMember{ID: "b", Host: "h1", Created: at, Spec: spec, Recycle: "r1", BannedOn: 3}, RecycleCommand},
		{PoolMember{ID: "c", Host: "h2", Created: at.Add(-2 * time.Hour), Spec: "other", BannedOn: 3}, RecycleBans},
		{PoolMember{ID: "d", Host: "h2", Created: at.Add(-2 * time.Hour), Spec: "other"}, RecycleSpec},
		{PoolMember{ID: "e", Host: "h2", Created: at.Add(-2 * time.Hour), Spec: spec}, RecycleHosts},
		{PoolMember{ID: "f", Host: "h1", Created: at.Add(-2 * time.Hour), Spec: spec}, RecycleAge},
	} {
		cause, why := r.DueCause(tc.m, at)
		if due, why2 := r.Due(tc.m, at); cause != tc.cause || due != (cause != "") || why2 != why || (cause == "") != (why == "") {
			t.Errorf("%s: cause %q (%q), due %v; want cause %q", tc.m.ID, cause, why, due, tc.cause)
		}
		if tc.cause == RecycleBans && why != "its addresses are banned on 3 sites (recycle_after_bans 2)" {
			t.Errorf("%s: reason %q", tc.m.ID, why)
		}
		r.Members = append(r.Members, tc.m)
	}
	s := r.Summary(at, func(string) bool { return true })
	if s.Recycling != 5 || s.Banned != 1 || s.Ready != 6 {
		t.Fatalf("summary %+v, want 5 recycling, 1 of them for its bans", s)
	}
}
