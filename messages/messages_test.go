package messages

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDecodeCreate(t *testing.T) {
	c, err := DecodeCreate([]byte(`{"v":1,"id":"p1","host":"h1","image":"debian-12","cpus":2,"memory_mib":512,"labels":{"team":"a"}}`), "p1")
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != "p1" || c.Host != "h1" || c.CPUs != 2 || c.MemoryMiB != 512 || c.Labels["team"] != "a" {
		t.Fatalf("decoded %+v", c)
	}
	c, err = DecodeCreate([]byte(`{"v":1,"id":"p1"}`), "p1")
	if err != nil || c.CPUs != 0 || c.MemoryMiB != 0 {
		t.Fatalf("absent sizes: %+v, %v; want zero (defaults)", c, err)
	}
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		body, sid, field string
	}{
		{``, "p1", "body"},
		{`   `, "p1", "body"},
		{`null`, "p1", "body"},
		{`{"v":1,"id":"p1"`, "p1", "body"},
		{`{"v":1,"id":"p1"}{}`, "p1", "body"},
		{`{"v":1,"id":"p1","x":1}`, "p1", "x"},
		{`{"v":1,"ID":"p1"}`, "p1", "ID"},
		{`{"":0}`, "p1", "body"}, // an unknown key with no name (found by FuzzDecodeCommand)
		// Unknown keys are named as sent, not as Go quotes them (found by FuzzDecodeCommand).
		{`{"v":1,"id":"p1","\u007f":1}`, "p1", "\x7f"},
		{`{"v":1,"id":"p1","a\"b":1}`, "p1", `a"b`},
		{`{"v":1}`, "p1", "id"},
		{`{"v":1,"id":"P1"}`, "P1", "id"},
		{`{"v":1,"id":"-p"}`, "-p", "id"},
		{`{"v":1,"id":"` + strings.Repeat("a", 64) + `"}`, strings.Repeat("a", 64), "id"},
		{`{"v":1,"id":"p2"}`, "p1", "id"},
		{`{"v":0,"id":"p1"}`, "p1", "v"},
		{`{"id":"p1"}`, "p1", "v"},
		{`{"v":1,"id":"p1","cpus":0}`, "p1", "cpus"},
		{`{"v":1,"id":"p1","cpus":65}`, "p1", "cpus"},
		{`{"v":1,"id":"p1","cpus":1.5}`, "p1", "cpus"},
		{`{"v":1,"id":"p1","memory_mib":0}`, "p1", "memory_mib"},
		{`{"v":1,"id":"p1","memory_mib":63}`, "p1", "memory_mib"},
		{`{"v":1,"id":"p1","host":"H 1"}`, "p1", "host"},
		{`{"v":1,"id":"p1","image":"a.b"}`, "p1", "image"},
		{`{"v":1,"id":"p1","labels":{"":"x"}}`, "p1", "labels"},
		{`{"v":1,"id":"p1","labels":"x"}`, "p1", "labels"},
		{`{"v":1,"id":"p1","labels":{"a":"` + strings.Repeat("x", MaxBodySize) + `"}}`, "p1", "body"},
	} {
		_, err := DecodeCreate([]byte(tc.body), tc.sid)
		fe, ok := AsFieldError(err)
		if !ok {
			t.Errorf("%.60q: error %v, want a field error", tc.body, err)
			continue
		}
		if fe.Field != tc.field {
			t.Errorf("%.60q: field %q (%s), want %q", tc.body, fe.Field, fe.Reason, tc.field)
		}
	}
}

func TestDecodeDelete(t *testing.T) {
	if _, err := DecodeDelete([]byte(`{"v":1,"id":"p1"}`), "p1"); err != nil {
		t.Fatal(err)
	}
	_, err := DecodeDelete([]byte(`{"v":1,"id":"p1","cpus":1}`), "p1")
	if fe, ok := AsFieldError(err); !ok || fe.Field != "cpus" {
		t.Fatalf("delete with cpus: %v", err)
	}
}

func TestSubjects(t *testing.T) {
	s := NewSubjects("")
	if got := s.Create("p1"); got != "proxy.cmd.create.p1" {
		t.Fatal(got)
	}
	op, id, err := s.ParseCommand("proxy.cmd.delete.p9")
	if err != nil || op != OpDelete || id != "p9" {
		t.Fatalf("%q %q %v", op, id, err)
	}
	for _, bad := range []string{"proxy.cmd.stop.p1", "proxy.cmd.create", "other.cmd.create.p1", "proxy.cmd.create.a.b"} {
		if _, _, err := s.ParseCommand(bad); err == nil {
			t.Errorf("ParseCommand(%q) accepted", bad)
		}
	}
	h, id, err := NewSubjects("fleet.a").ParseWork("fleet.a.work.h1.p1")
	if err != nil || h != "h1" || id != "p1" {
		t.Fatalf("%q %q %v", h, id, err)
	}
	if id, err := s.ParseState("proxy.state.p3"); err != nil || id != "p3" {
		t.Fatalf("%q %v", id, err)
	}
}

// TestDesiredJSON pins the PROXY_DESIRED record's encoding: records written
// by one build are read by others (workers, clients), so a renamed field
// would lose data silently.
func TestDesiredJSON(t *testing.T) {
	d := Desired{V: 1, ID: "p1", Op: OpCreate, Seq: 7, CommandID: "c1", Host: "h2", PrevHost: "h1", Image: "img",
		CPUs: 2, MemoryMiB: 512, Labels: map[string]string{"team": "a"}, SpecHash: "abcd",
		At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"v":1,"id":"p1","op":"create","seq":7,"command_id":"c1","host":"h2","prev_host":"h1","image":"img","cpus":2,"memory_mib":512,"labels":{"team":"a"},"spec_hash":"abcd","at":"2026-01-02T03:04:05Z"}`
	if string(b) != want {
		t.Fatalf("desired record encodes as\n%s\nwant\n%s", b, want)
	}
	b, err = json.Marshal(Desired{V: 1, ID: "p1", Op: OpDelete, Seq: 8, CommandID: "c2", Host: "h2"})
	if err != nil {
		t.Fatal(err)
	}
	const wantDelete = `{"v":1,"id":"p1","op":"delete","seq":8,"command_id":"c2","host":"h2","at":"0001-01-01T00:00:00Z"}`
	if string(b) != wantDelete {
		t.Fatalf("delete record encodes as\n%s\nwant\n%s", b, wantDelete)
	}
	var back Desired
	if err := json.Unmarshal([]byte(want), &back); err != nil || back.PrevHost != "h1" || back.Labels["team"] != "a" || back.Seq != 7 {
		t.Fatalf("decode: %+v, %v", back, err)
	}
}
