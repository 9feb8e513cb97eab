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
	for i := range events {
		ev := messages.StateEvent{V: 1, ID: fmt.Sprintf("f%05d", i), State: messages.StateRunning, Host: fmt.Sprintf("h%03d", i%hosts),
			IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250), Port: 3128, Source: "agent", CommandID: fmt.Sprintf("fleet50k-f%05d", i),
			CommandSeq: uint64(i + 1), Seq: uint64(i + 1), Labels: map[string]string{"pool": "a"}}
		events[i], _ = json.Marshal(ev)
	}
	var kept float64
	b.ReportAllocs()
	for b.Loop() {
		v := newEventView(nil, messages.NewSubjects(""), 0, nil)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, e := range events {
			v.apply(e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept = float64(after.HeapAlloc-before.HeapAlloc) / proxies
		runtime.KeepAlive(v)
	}
	b.ReportMetric(kept, "B-kept/proxy")
}
