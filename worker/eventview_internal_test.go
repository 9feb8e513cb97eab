package worker

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"proxyfleet/messages"
)

// BenchmarkEventViewOf50000: the event view of a fleet of 50,000 proxies
// over 500 hosts, as every worker process holds it: the bytes it keeps
// per proxy (heap in use after the events are applied, over the empty
// view's) and what applying each event costs.
func BenchmarkEventViewOf50000(b *testing.B) {
	const proxies, hosts = 50000, 500
	events := make([][]byte, proxies)
	subjects := make([]string, proxies)
	subj := messages.NewSubjects("")
	for i := range events {
		subjects[i] = subj.State(fmt.Sprintf("f%05d", i))
		ev := messages.StateEvent{V: 1, ID: fmt.Sprintf("f%05d", i), State: messages.StateRunning, Host: fmt.Sprintf("h%03d", i%hosts),
			IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250), Port: 3128, Source: "agent", CommandID: fmt.Sprintf("fleet50k-f%05d", i),
			CommandSeq: uint64(i + 1), Seq: uint64(i + 1), Labels: map[string]string{"pool": "a"}}
		events[i], _ = json.Marshal(ev)
	}
	var kept float64
	b.ReportAllocs()
	for b.Loop() {
		v := newEventView(nil, subj, 0, nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i, e := range events {
			v.apply(subjects[i], e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept = float64(after.HeapAlloc-before.HeapAlloc) / proxies
		runtime.KeepAlive(v)
	}
	b.ReportMetric(kept, "B-kept/proxy")
}

// BenchmarkEventViewKeepingATenth: a worker of ten, which keeps the
// proxies of a tenth of the hosts, applying the whole fleet's events.
func BenchmarkEventViewKeepingATenth(b *testing.B) {
	const proxies, hosts = 50000, 500
	subj := messages.NewSubjects("")
	events := make([][]byte, proxies)
	subjects := make([]string, proxies)
	for i := range events {
		ev := messages.StateEvent{V: 1, ID: fmt.Sprintf("f%05d", i), State: messages.StateRunning, Host: fmt.Sprintf("h%03d", i%hosts),
			IP: "198.18.0.1", Port: 3128, Source: "agent", CommandID: fmt.Sprintf("fleet50k-f%05d", i),
			CommandSeq: uint64(i + 1), Seq: uint64(i + 1), Labels: map[string]string{"pool": "a"}}
		events[i], _ = json.Marshal(ev)
		subjects[i] = subj.State(ev.ID)
	}
	b.ReportAllocs()
	for b.Loop() {
		v := newEventView(nil, subj, 0, nil)
		v.keep = func(h string) bool { return h < "h050" }
		for i, e := range events {
			v.apply(subjects[i], e)
		}
		if n := len(v.host); n != proxies/10 {
			b.Fatalf("%d proxies kept, want %d", n, proxies/10)
		}
	}
}

// The view passed over without decoding only the events it would have
// dropped after decoding them: a proxy of a host it keeps is kept, one
// that moves to a host it does not keep is dropped, and an event whose
// host it cannot read plainly is decoded.
func TestEventViewPassesOverOnlyWhatItDrops(t *testing.T) {
	subj := messages.NewSubjects("")
	v := newEventView(nil, subj, 0, nil)
	v.keep = func(h string) bool { return h == "mine" }
	put := func(id, host string, seq uint64, labels map[string]string) {
		b, _ := json.Marshal(messages.StateEvent{V: 1, ID: id, State: messages.StateRunning, Host: host, IP: "198.18.0.1", Seq: seq, Labels: labels})
		v.apply(subj.State(id), b)
	}
	put("a", "mine", 1, nil)
	put("b", "theirs", 1, map[string]string{"host": "mine"})
	put("c", "mine", 1, map[string]string{"host": "theirs"})
	if len(v.host) != 2 || v.host["a"] != "mine" || v.host["c"] != "mine" {
		t.Fatalf("held %v, want a and c on mine", v.host)
	}
	put("a", "theirs", 2, nil) // moved away: dropped, though its host is not kept
	if _, ok := v.host["a"]; ok {
		t.Fatal("a moved to a host the view does not keep, and the view still holds it")
	}
	// A host written with an escape is decoded, not passed over.
	v.apply(subj.State("d"), []byte(`{"v":1,"id":"d","state":"running","host":"mi\u006ee","ip":"198.18.0.1","seq":1}`))
	if v.host["d"] != "mine" {
		t.Fatalf("d, whose host has an escape: held on %q, want mine", v.host["d"])
	}
	// The body's id must be the subject's.
	v.apply(subj.State("e"), []byte(`{"v":1,"id":"c","state":"running","host":"theirs","seq":2}`))
	if _, ok := v.host["c"]; ok {
		t.Fatal("an event of c on e's subject was passed over on e's id")
	}
}

// topString reads a top-level string member exactly as a decode would,
// or says it cannot.
func TestTopString(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"host":"h1"}`, "h1", true},
		{` { "v" : 1 , "host" : "h1" } `, "h1", true},
		{`{"labels":{"host":"x"},"host":"h1"}`, "h1", true},
		{`{"a":[1,{"host":"x"},"]}"],"host":"h1"}`, "h1", true},
		{`{"a":"q\"host\":\"x","host":"h1"}`, "h1", true},
		{`{"a":true,"b":null,"c":-1.5e3,"host":"h1"}`, "h1", true},
		{`{"labels":{"host":"x"}}`, "", false},
		{`{"host":"h\u0031"}`, "", false},
		{`{"host":1}`, "", false},
		{`{"host":"h1`, "", false},
		{`["host","h1"]`, "", false},
		{`{}`, "", false},
		{``, "", false},
	} {
		got, ok := topString([]byte(c.in), "host")
		if got != c.want || ok != c.ok {
			t.Errorf("topString(%s) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
		if ok {
			var v struct{ Host string }
			if err := json.Unmarshal([]byte(c.in), &v); err != nil || v.Host != got {
				t.Errorf("%s: a decode says %q (%v), topString %q", c.in, v.Host, err, got)
			}
		}
	}
}
