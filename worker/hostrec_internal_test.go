package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
)

// readHost skips decoding a record it decoded last only when the bytes are
// the same, not when the revision is: a PROXY_HOSTS made anew (as set-up
// does after it was lost) numbers its revisions from 1 again, and another
// worker's record of revision 1 there is not the one read before.
func TestHostRecordIsDecodedAgainWhenItsBytesDiffer(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: messages.BucketHosts, History: 1}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{metrics: newMetrics(), hosts: kv, catalog: Catalog{Hosts: []string{"h1"}}, writers: map[string]*hostWriter{"h1": {host: "h1"}}}
	put := func(kv jetstream.KeyValue, proxies map[string]uint64) uint64 {
		b, _ := json.Marshal(messages.HostRecord{V: messages.Version, Host: "h1", Proxies: proxies, State: messages.HostOK})
		rev, err := kv.Put(ctx, "h1", b)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	read := func() (messages.HostRecord, uint64) {
		rec, rev, err := w.readHost(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		return rec, rev
	}
	put(kv, map[string]uint64{"p1": 1})
	if rec, _ := read(); len(rec.Proxies) != 1 || rec.Proxies["p1"] != 1 {
		t.Fatalf("first read: proxies %v, want p1", rec.Proxies)
	}
	if rec, _ := read(); rec.Proxies["p1"] != 1 {
		t.Fatalf("the same record again: proxies %v, want p1", rec.Proxies)
	}
	put(kv, map[string]uint64{"p2": 2}) // another worker's write
	if rec, _ := read(); len(rec.Proxies) != 1 || rec.Proxies["p2"] != 2 {
		t.Fatalf("after another worker's write: proxies %v, want p2", rec.Proxies)
	}
	// The bucket made anew: revision 1 again, another record.
	if err := js.DeleteKeyValue(ctx, messages.BucketHosts); err != nil {
		t.Fatal(err)
	}
	if kv, err = js.CreateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	w.hosts = kv
	if rev := put(kv, map[string]uint64{"p3": 3}); rev != 1 {
		t.Fatalf("revision %d in the new bucket, want 1", rev)
	}
	put(kv, map[string]uint64{"p4": 4})
	if rec, rev := read(); len(rec.Proxies) != 1 || rec.Proxies["p4"] != 4 {
		t.Fatalf("in the bucket made anew (revision %d): proxies %v, want p4", rev, rec.Proxies)
	}
}

// A writer's batch starts from the record its host view holds instead of
// reading it, and the compare-and-set on that record's revision keeps a
// view that is behind from losing another worker's write: a stale guess
// is read afresh and applied again, and a change a stale guess found
// unneeded (a reservation the record no longer holds) is judged again on
// a fresh read. With a view that is current, a reservation reads nothing.
func TestHostWriterGuessesFromItsViewAndNeverLosesAWrite(t *testing.T) {
	_, nc, js, ctx := setUpTopology(t)
	kv, err := js.KeyValue(ctx, messages.BucketHosts)
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{metrics: newMetrics(), hosts: kv, catalog: Catalog{Hosts: []string{"h1"}, MaxProxies: map[string]int{"h1": 10}}}
	w.hostView = newHostView(kv, nc, time.Second, slog.New(slog.DiscardHandler))
	w.hostView.ready = true
	w.startWriters()
	defer w.stopWriters()
	reads := countOf(t, nc, "$JS.API.DIRECT.GET.KV_"+messages.BucketHosts+".>")
	stored := func() map[string]uint64 {
		t.Helper()
		e, err := kv.Get(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		var rec messages.HostRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Proxies
	}
	other := func(proxies map[string]uint64) { // another worker's write, not in the view
		t.Helper()
		e, err := kv.Get(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(messages.HostRecord{V: messages.Version, Host: "h1", MaxProxies: 10, Proxies: proxies, State: messages.HostOK})
		if _, err := kv.Update(ctx, "h1", b, e.Revision()); err != nil {
			t.Fatal(err)
		}
	}

	if err := w.reserve(ctx, "h1", "p1", 1, false); err != nil { // the first: no record, a read
		t.Fatal(err)
	}
	before := reads()
	if err := w.reserve(ctx, "h1", "p2", 2, false); err != nil {
		t.Fatal(err)
	}
	if got := reads() - before; got != 0 {
		t.Errorf("a reservation on a record the view holds read it %d times; want none", got)
	}
	if got := stored(); len(got) != 2 || got["p1"] != 1 || got["p2"] != 2 {
		t.Fatalf("after two reservations: %v, want p1 and p2", got)
	}

	// Another worker adds p9 and releases p2; the view holds neither.
	other(map[string]uint64{"p1": 1, "p9": 9})
	if err := w.reserve(ctx, "h1", "p3", 3, false); err != nil {
		t.Fatal(err)
	}
	if got := stored(); len(got) != 3 || got["p9"] != 9 || got["p3"] != 3 || got["p1"] != 1 {
		t.Fatalf("a reservation on a stale guess: %v, want p1, p9 and p3 (the other worker's write kept)", got)
	}
	other(map[string]uint64{"p1": 1, "p3": 3}) // p9 released behind the view's back
	// The view still holds p9 at 9 (its own write): reserving it is
	// unneeded on the guess, but the record no longer holds it, so read
	// afresh it must be reserved again.
	if err := w.reserve(ctx, "h1", "p9", 9, false); err != nil {
		t.Fatal(err)
	}
	if got := stored(); len(got) != 3 || got["p9"] != 9 || got["p1"] != 1 || got["p3"] != 3 {
		t.Fatalf("a reservation a stale guess held already: %v, want p1, p3 and p9", got)
	}
}
