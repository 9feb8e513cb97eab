package worker

import (
	"context"
	"encoding/json"
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
	w := &Worker{hosts: kv, catalog: Catalog{Hosts: []string{"h1"}}, writers: map[string]*hostWriter{"h1": {host: "h1"}}}
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
