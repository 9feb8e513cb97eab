package messages

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFeedSubjects(t *testing.T) {
	s := NewSubjects("fleet.a")
	if got := s.RotationChanges(); got != "fleet.a.rotation.changes" {
		t.Fatal(got)
	}
	if got := s.RotationGet(); got != "fleet.a.rotation.get" {
		t.Fatal(got)
	}
}

// TestRotationChangesJSON pins the feed's encoding and that it decodes
// back strictly.
func TestRotationChangesJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := RotationChanges{V: 1, Version: 12, Prev: 9, Size: 1, At: at, Changes: []RotationChange{
		{Op: ChangeEntered, ID: "p1", Proxy: &RotationEntry{ID: "p1", Addr: "198.18.0.1:3128", Host: "h1", Since: at, Labels: map[string]string{"team": "a"}}},
		{Op: ChangeLeft, ID: "p2"},
	}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"v":1,"version":12,"prev":9,"size":1,"changes":[{"op":"entered","id":"p1","proxy":{"id":"p1","addr":"198.18.0.1:3128","host":"h1","since":"2026-01-02T03:04:05Z","labels":{"team":"a"}}},{"op":"left","id":"p2"}],"at":"2026-01-02T03:04:05Z"}`
	if string(b) != want {
		t.Fatalf("feed message encodes as\n%s\nwant\n%s", b, want)
	}
	back, err := DecodeRotationChanges(b)
	if err != nil || back.Version != 12 || back.Prev != 9 || len(back.Changes) != 2 || back.Changes[0].Proxy.Labels["team"] != "a" || back.Changes[1].Proxy != nil {
		t.Fatalf("decode: %+v, %v", back, err)
	}
}

func TestDecodeRotationChangesNamesTheField(t *testing.T) {
	entry := `{"id":"p1","addr":"198.18.0.1:3128","host":"h1","since":"2026-01-02T03:04:05Z"}`
	for _, tc := range []struct{ body, field string }{
		{`{"v":2,"version":2,"prev":1,"size":0,"changes":[],"at":"2026-01-02T03:04:05Z"}`, "v"},
		{`{"v":1,"prev":0,"size":0,"changes":[],"at":"2026-01-02T03:04:05Z"}`, "version"},
		{`{"v":1,"version":2,"prev":3,"size":0,"changes":[],"at":"2026-01-02T03:04:05Z"}`, "prev"},
		{`{"v":1,"version":2,"prev":1,"size":-1,"changes":[],"at":"2026-01-02T03:04:05Z"}`, "size"},
		{`{"v":1,"version":2,"prev":1,"size":0,"at":"2026-01-02T03:04:05Z"}`, "changes"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[],"extra":1}`, "extra"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"gone","id":"p1"}]}`, "changes[0].op"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"left","id":"P1"}]}`, "changes[0].id"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"entered","id":"p1"}]}`, "changes[0].proxy"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"left","id":"p1","proxy":` + entry + `}]}`, "changes[0].proxy"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"entered","id":"p2","proxy":` + entry + `}]}`, "changes[0].proxy.id"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"changed","id":"p1","proxy":{"id":"p1","addr":"nowhere"}}]}`, "changes[0].proxy.addr"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[{"op":"left","id":"p3"},{"op":"left","id":"p1"},{"op":"left","id":"p1"}]}`, "changes[2].id"},
		{`{"v":1,"version":2,"prev":1,"size":0,"changes":[],"at":"2026-01-02T03:04:05Z","Size":1}`, "Size"},
	} {
		_, err := DecodeRotationChanges([]byte(tc.body))
		fe, ok := AsFieldError(err)
		if !ok || fe.Field != tc.field {
			t.Errorf("%.80s: %v, want a field error of %q", tc.body, err, tc.field)
		}
	}
}

func TestDecodeRotationGet(t *testing.T) {
	g, err := DecodeRotationGet([]byte(`{"v":1,"after":"p9","limit":100}`))
	if err != nil || g.After != "p9" || g.Limit != 100 {
		t.Fatalf("%+v %v", g, err)
	}
	if g, err := DecodeRotationGet([]byte(`{"v":1}`)); err != nil || g.After != "" || g.Limit != 0 {
		t.Fatalf("first page: %+v %v", g, err)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"v":1,"limit":-1}`, "limit"},
		{`{"v":1,"limit":10001}`, "limit"},
		{`{"v":1,"after":"P9"}`, "after"},
		{`{"v":0}`, "v"},
		{`{"v":1,"from":"p1"}`, "from"},
		{``, "body"},
	} {
		_, err := DecodeRotationGet([]byte(tc.body))
		if fe, ok := AsFieldError(err); !ok || fe.Field != tc.field {
			t.Errorf("%s: %v, want a field error of %q", tc.body, err, tc.field)
		}
	}
}

func TestDecodeRotationPage(t *testing.T) {
	e := func(id string) string {
		return `{"id":"` + id + `","addr":"198.18.0.1:3128","host":"h1","since":"2026-01-02T03:04:05Z"}`
	}
	p, err := DecodeRotationPage([]byte(`{"v":1,"version":7,"size":3,"proxies":[` + e("p1") + `,` + e("p2") + `],"next":"p2"}`))
	if err != nil || p.Version != 7 || p.Size != 3 || len(p.Proxies) != 2 || p.Next != "p2" {
		t.Fatalf("%+v %v", p, err)
	}
	_, err = DecodeRotationPage([]byte(`{"v":1,"version":0,"size":0,"proxies":null,"error":"standing by"}`))
	var pe *PageError
	if !errors.As(err, &pe) || pe.Reason != "standing by" {
		t.Fatalf("a refusal: %v, want a *PageError", err)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"v":1,"version":7,"size":2,"proxies":[` + e("p2") + `,` + e("p1") + `]}`, "proxies[1].id"},
		{`{"v":1,"version":7,"size":2,"proxies":[` + e("p1") + `,` + e("p1") + `]}`, "proxies[1].id"},
		{`{"v":1,"version":7,"size":2,"proxies":[` + e("p1") + `],"next":"p9"}`, "next"},
		{`{"v":1,"version":7,"size":2}`, "proxies"},
		{`{"v":1,"size":2,"proxies":[]}`, "version"},
		{`{"v":1,"version":7,"size":2,"proxies":[{"id":"p1","addr":""}]}`, "proxies[0].addr"},
	} {
		_, err := DecodeRotationPage([]byte(tc.body))
		if fe, ok := AsFieldError(err); !ok || fe.Field != tc.field {
			t.Errorf("%.80s: %v, want a field error of %q", tc.body, err, tc.field)
		}
	}
}

// TestTruncatedRotationJSON: a whole snapshot encodes as before (no new
// field); a truncated one says so, with null proxies.
func TestTruncatedRotationJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, _ := json.Marshal(Rotation{V: 1, Version: 3, Proxies: []RotationEntry{}, At: at})
	if string(b) != `{"v":1,"version":3,"proxies":[],"at":"2026-01-02T03:04:05Z"}` {
		t.Fatalf("whole snapshot: %s", b)
	}
	b, _ = json.Marshal(Rotation{V: 1, Version: 3, At: at, Truncated: true, Size: 50000, Bytes: 7000000, Feed: "proxy.rotation.changes"})
	const want = `{"v":1,"version":3,"proxies":null,"at":"2026-01-02T03:04:05Z","truncated":true,"size":50000,"bytes":7000000,"feed":"proxy.rotation.changes"}`
	if string(b) != want {
		t.Fatalf("truncated snapshot encodes as\n%s\nwant\n%s", b, want)
	}
	var back Rotation
	if err := Decode(b, &back); err != nil || !back.Truncated || back.Proxies != nil || back.Size != 50000 {
		t.Fatalf("decode: %+v %v", back, err)
	}
	if strings.Contains(want, `"proxies":[]`) {
		t.Fatal("a truncated snapshot must not look like an empty rotation")
	}
}
