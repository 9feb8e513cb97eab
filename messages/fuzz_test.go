package messages

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Fuzz targets of the wire contract (`make fuzz` runs each for a bounded
// time; `go test` runs their seeds and testdata/fuzz corpus as tests).

// FuzzDecodeCommand: decoding never panics, every error names a field, and
// a command that decodes and validates re-encodes to a body that decodes to
// the same command.
func FuzzDecodeCommand(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"id":"p1"}`,
		`{"v":1,"id":"p1","host":"h1","image":"debian-12","cpus":2,"memory_mib":512,"labels":{"a":"b","team/x":"<&>\"\u0000\ud800"}}`,
		`{"v":1,"id":"p1","labels":{}}`, `{"v":1,"id":"p1","labels":null}`, `{"v":1,"id":"p1","id":"p1"}`,
		`{"v":1,"id":"p1","cpus":0}`, `{"v":1,"id":"p1","cpus":-0}`, `{"v":1,"id":"p1","cpus":1e0}`,
		`{"v":1,"id":"p1","cpuſ":1}`, `{"v":1,"Id":"p1"}`, `{"v":1,"id":"p1","labels":{"k":"` + strings.Repeat("é", 128) + `"}}`,
		`{"v":1,"id":"p1"`, `[]`, `{"v":1,"id":"p1","x":1}`, `{"v":1,"id":"p1","cpus":"2"}`, ``, ` {"v":1,"id":"p1"} `,
		// Pool commands (the same decoding, nested under spec).
		`{"v":1,"name":"p1","size":2,"min_ready":1,"surge":2,"max_age":"6h","ready_timeout":"90s","spec":{"image":"img","cpus":1,"labels":{"a":"b"},"hosts":["h1"]}}`,
		`{"v":1,"name":"p1","size":2,"spec":{"Image":"x"}}`, `{"v":1,"name":"p1","size":2,"spec":{"x":1}}`, `{"v":1,"name":"p1","ids":["p1-abcdef"]}`,
		`{"v":1,"name":"p1","all":true}`, `{"v":1,"name":"p1","size":2,"spec":null}`,
	} {
		f.Add([]byte(s), "p1")
	}
	f.Fuzz(func(t *testing.T, body []byte, sid string) {
		c, err := DecodeCreate(body, sid)
		if err != nil {
			checkFieldError(t, body, err)
		} else {
			if !ValidID(sid) || c.ID != sid {
				t.Fatalf("accepted %+v published with subject id %q", c, sid)
			}
			b, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := DecodeCreate(b, sid)
			if err != nil {
				t.Fatalf("re-encoded %s: %v", b, err)
			}
			if len(c.Labels) == 0 {
				c.Labels = nil // omitempty: no labels and an empty map are one command
			}
			if !reflect.DeepEqual(c2, c) {
				t.Fatalf("round trip\n%#v\n!=\n%#v", c2, c)
			}
			if err := c2.Validate(sid); err != nil {
				t.Fatalf("decoded command does not validate: %v", err)
			}
		}
		checkPoolDecoding(t, body, sid)
		d, err := DecodeDelete(body, sid)
		if err != nil {
			checkFieldError(t, body, err)
			return
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if d2, err := DecodeDelete(b, sid); err != nil || d2 != d {
			t.Fatalf("delete round trip %s: %+v, %v; want %+v", b, d2, err, d)
		}
	})
}

// checkPoolDecoding: the pool commands decode like the others (every
// error names a field; an unknown field of spec is named spec.<as spelled>),
// and a set that validates re-encodes and decodes to the same.
func checkPoolDecoding(t *testing.T, body []byte, sid string) {
	t.Helper()
	p, err := DecodePoolSet(body, sid)
	if err != nil {
		fe, ok := AsFieldError(err)
		if ok {
			if k, nested := strings.CutPrefix(fe.Field, "spec."); nested && fe.Reason == "unknown field" {
				var m map[string]json.RawMessage
				var spec map[string]json.RawMessage
				if json.NewDecoder(bytes.NewReader(body)).Decode(&m) != nil || json.Unmarshal(m["spec"], &spec) != nil {
					t.Fatalf("unknown field %q of a spec that is no object: %s", fe.Field, body)
				}
				if _, ok := spec[k]; !ok {
					t.Fatalf("unknown field %q is not a key of the spec of %s", fe.Field, body)
				}
				return
			}
		}
		checkFieldError(t, body, err)
	} else {
		if !ValidPoolName(sid) || p.Name != sid {
			t.Fatalf("accepted %+v published with subject name %q", p, sid)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := DecodePoolSet(b, sid)
		if err != nil {
			t.Fatalf("re-encoded %s: %v", b, err)
		}
		if len(p.Spec.Labels) == 0 {
			p.Spec.Labels = nil
		}
		if len(p.Spec.Hosts) == 0 {
			p.Spec.Hosts = nil
		}
		if !reflect.DeepEqual(p2, p) {
			t.Fatalf("pool set round trip\n%#v\n!=\n%#v", p2, p)
		}
	}
	if _, err := DecodePoolDelete(body, sid); err != nil {
		checkFieldError(t, body, err)
	}
	if _, err := DecodePoolRecycle(body, sid); err != nil {
		checkFieldError(t, body, err)
	}
}

// checkFieldError: err names a field, and an unknown field is named as the
// body spells it.
func checkFieldError(t *testing.T, body []byte, err error) {
	t.Helper()
	fe, ok := AsFieldError(err)
	if !ok || fe.Field == "" {
		t.Fatalf("error without a field: %v", err)
	}
	if fe.Reason != "unknown field" {
		return
	}
	var m map[string]json.RawMessage // the first value: trailing data is found later
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&m); err != nil {
		t.Fatalf("unknown field %q in a body that is no object: %v", fe.Field, err)
	}
	if _, ok := m[fe.Field]; !ok {
		t.Fatalf("unknown field %q is not a key of %s", fe.Field, body)
	}
}

// FuzzSubjects: what parses back from a built subject is what went in; a
// subject that parses is rebuilt exactly from its parts; a token that is
// empty or holds a '.' (more than one token) is never accepted.
func FuzzSubjects(f *testing.F) {
	for _, c := range [][4]string{
		{"proxy", "create", "p1", "h1"}, {"fleet.a", "delete", "p-9", "h-2"}, {"", "create", "p1", "h1"},
		{"proxy", "stop", "p1", "h1"}, {"proxy", "create", "a.b", "h1"}, {"proxy", "create", "p1", "h.1"},
		{"proxy", "create", "", ""}, {"proxy", "create", "*", ">"}, {"proxy.cmd", "create", "cmd", "work"},
		{"a..b", "create", "p1", "h1"}, {"proxy", "create", "p 1", "h\t1"}, {"proxy", "create", "é", "h1"},
	} {
		f.Add(c[0], c[1], c[2], c[3])
	}
	f.Fuzz(func(t *testing.T, prefix, op, id, host string) {
		s := NewSubjects(prefix)
		token := func(x string) bool { return x != "" && !strings.Contains(x, ".") }

		// Arbitrary subjects: whatever parses is rebuilt exactly from its
		// parts, and every part is one non-empty token.
		for _, subject := range []string{prefix, s.Prefix + "." + op + "." + id + "." + host, s.Create(id) + "." + host, s.Work(op, id)} {
			if gop, gid, err := s.ParseCommand(subject); err == nil {
				if !token(gid) || (gop != OpCreate && gop != OpDelete) || s.Command(gop, gid) != subject {
					t.Fatalf("ParseCommand(%q) = %q, %q", subject, gop, gid)
				}
			}
			if gh, gid, err := s.ParseWork(subject); err == nil {
				if !token(gh) || !token(gid) || s.Work(gh, gid) != subject {
					t.Fatalf("ParseWork(%q) = %q, %q", subject, gh, gid)
				}
			}
			if gid, err := s.ParseState(subject); err == nil {
				if !token(gid) || s.State(gid) != subject {
					t.Fatalf("ParseState(%q) = %q", subject, gid)
				}
			}
			if gop, gname, err := s.ParsePoolCommand(subject); err == nil {
				if !token(gname) || s.PoolCommand(gop, gname) != subject {
					t.Fatalf("ParsePoolCommand(%q) = %q, %q", subject, gop, gname)
				}
			}
		}
		for _, pop := range []string{OpPoolSet, OpPoolDelete, OpPoolRecycle} {
			if !ValidPrefix(s.Prefix) {
				break
			}
			gop, gname, err := s.ParsePoolCommand(s.PoolCommand(pop, id))
			if token(id) != (err == nil) || (err == nil && (gop != pop || gname != id)) {
				t.Fatalf("ParsePoolCommand(PoolCommand(%q, %q)) = %q, %q, %v", pop, id, gop, gname, err)
			}
		}

		// Built subjects, under any prefix that can prefix subjects: they
		// parse back to what went in exactly when every token is one token.
		if !ValidPrefix(s.Prefix) {
			return
		}
		gop, gid, err := s.ParseCommand(s.Command(op, id))
		okCmd := (op == OpCreate || op == OpDelete) && token(id)
		if okCmd != (err == nil) || (okCmd && (gop != op || gid != id)) {
			t.Fatalf("ParseCommand(Command(%q, %q)) = %q, %q, %v", op, id, gop, gid, err)
		}
		gh, gid, err := s.ParseWork(s.Work(host, id))
		okWork := token(host) && token(id)
		if okWork != (err == nil) || (okWork && (gh != host || gid != id)) {
			t.Fatalf("ParseWork(Work(%q, %q)) = %q, %q, %v", host, id, gh, gid, err)
		}
		gid, err = s.ParseState(s.State(id))
		if token(id) != (err == nil) || (err == nil && gid != id) {
			t.Fatalf("ParseState(State(%q)) = %q, %v", id, gid, err)
		}
		// Valid ids and host names are always single tokens.
		if ValidID(id) && !token(id) {
			t.Fatalf("valid id %q is not one subject token", id)
		}
	})
}
