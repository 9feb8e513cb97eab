package worker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/addrplan"
	"proxyfleet/messages"
)

// plannedRecords are n successive records of host h as other workers
// write them: 100 proxies each, under an address plan (an IPv4 /24 and
// an IPv6 /64 at 16 addresses a proxy, 10 slots cooling), each record
// one create on from the one before.
func plannedRecords(tb testing.TB, h string, n int) [][]byte {
	tb.Helper()
	plan, err := addrplan.New(h, addrplan.Config{IPv4: []string{"198.18.101.0/24"}, IPv6: []string{"2001:db8:101::/64"}, IPv6PerProxy: 16})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	pc := plan.Config()
	rec := messages.HostRecord{V: messages.Version, Host: h, MaxProxies: 1000, State: messages.HostOK, Proxies: map[string]uint64{},
		Since: now, At: now, Plan: &pc}
	var st messages.AddrState
	for i := range 110 {
		id := fmt.Sprintf("p%05d", i)
		rec.Proxies[id] = uint64(i + 1)
		if _, err := plan.Assign(&st, id, now); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range 10 {
		id := fmt.Sprintf("p%05d", i)
		plan.Release(&st, id, now)
		delete(rec.Proxies, id)
	}
	out := make([][]byte, n)
	for i := range out {
		// One proxy out, one in: 100 proxies in each.
		gone, id := fmt.Sprintf("p%05d", 10+i), fmt.Sprintf("p%05d", 110+i)
		plan.Release(&st, gone, now)
		delete(rec.Proxies, gone)
		rec.Proxies[id] = uint64(110 + i)
		if _, err := plan.Assign(&st, id, now); err != nil {
			tb.Fatal(err)
		}
		rec.Addresses = messages.EncodeAddrs(st)
		rec.At = now.Add(time.Duration(i) * time.Millisecond)
		out[i], err = json.Marshal(rec)
		if err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

// BenchmarkHostViewUpdate: what a worker's host view spends on each
// record another worker writes (every worker's view sees every write of
// every host's record): a record of 100 proxies under an address plan.
func BenchmarkHostViewUpdate(b *testing.B) {
	const hosts = 20
	recs := make([][][]byte, hosts)
	names := hostNames(hosts)
	for i, h := range names {
		recs[i] = plannedRecords(b, h, 100)
	}
	b.Logf("record: %d bytes", len(recs[0][0]))
	v := newHostView(nil, nil, time.Second, slog.New(slog.DiscardHandler))
	v.setOrder(names)
	rev := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		rev++
		h := int(rev) % hosts
		v.update(names[h], rev, jetstream.KeyValuePut, recs[h][int(rev/hosts)%100])
	}
}

// A record another worker wrote is ranked by what the view reads of it at
// once, and given to a writer (latest, at) and a read (record) as decoding
// it whole gives it; a record that cannot be decoded leaves the view as it
// was, and a delete empties the host.
func TestHostViewReadsWatchedRecords(t *testing.T) {
	v := newHostView(nil, nil, time.Second, slog.New(slog.DiscardHandler))
	v.ready = true
	v.setOrder([]string{"h1", "h2"})
	raws := plannedRecords(t, "h1", 2)
	quarantined := func() []byte {
		var rec messages.HostRecord
		if err := json.Unmarshal(raws[1], &rec); err != nil {
			t.Fatal(err)
		}
		rec.State, rec.Reason = messages.HostQuarantined, "calls failed"
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	check := func(raw []byte, rev uint64) {
		t.Helper()
		want := messages.HostRecord{V: messages.Version, Host: "h1", State: messages.HostOK}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		got, gotRev, ok := v.latest("h1")
		if !ok || gotRev != rev || !reflect.DeepEqual(got, want) {
			t.Fatalf("latest: %v at %d (%v); want %+v at %d", got, gotRev, ok, want, rev)
		}
		if at, ok := v.at("h1", rev); !ok || !reflect.DeepEqual(at, want) {
			t.Fatalf("at %d: %+v (%v); want the record", rev, at, ok)
		}
		if _, ok := v.at("h1", rev-1); ok {
			t.Fatalf("at %d: found, want none (the view holds %d)", rev-1, rev)
		}
		if rec, err := v.record("h1"); err != nil || !reflect.DeepEqual(rec, want) {
			t.Fatalf("record: %+v, %v; want the record", rec, err)
		}
		var id string
		for id = range want.Proxies {
			break
		}
		v.each([]string{"h1", "h2"}, id, func(i int, h string, n int, held, q bool) {
			if h == "h1" && (n != len(want.Proxies) || !held || q != want.Quarantined()) {
				t.Fatalf("h1 ranked with %d proxies, %s held %v, quarantined %v; want %d, true, %v", n, id, held, q, len(want.Proxies), want.Quarantined())
			}
		})
	}
	v.update("h1", 5, jetstream.KeyValuePut, raws[0])
	check(raws[0], 5)
	v.update("h1", 6, jetstream.KeyValuePut, []byte(`{"proxies":{"p1":"one"}}`))
	check(raws[0], 5)
	v.update("h1", 7, jetstream.KeyValuePut, quarantined)
	check(quarantined, 7)
	v.update("h1", 6, jetstream.KeyValuePut, raws[1]) // older: changes nothing
	check(quarantined, 7)
	v.update("h1", 8, jetstream.KeyValuePut, raws[1])
	v.update("h1", 9, jetstream.KeyValueDelete, nil)
	if _, _, ok := v.latest("h1"); !ok {
		t.Fatal("latest after a delete: none; want the empty record")
	}
	v.each([]string{"h1"}, "p00100", func(_ int, _ string, n int, held, q bool) {
		if n != 0 || held || q {
			t.Fatalf("h1 after a delete: %d proxies, held %v, quarantined %v; want none", n, held, q)
		}
	})
}
