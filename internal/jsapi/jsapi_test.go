package jsapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"proxyfleet/internal/jsapi"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func setUp(t *testing.T) (jetstream.JetStream, context.Context) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return js, ctx
}

func bucket(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) jetstream.KeyValue {
	t.Helper()
	kv, err := js.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatalf("create bucket %s: %v", cfg.Bucket, err)
	}
	return kv
}

// KeyFromLeader reads a key's value; a key never written is ErrKeyNotFound,
// one deleted or purged ErrKeyDeleted, a bucket that does not exist the
// server's stream-not-found code.
func TestKeyFromLeader(t *testing.T) {
	js, ctx := setUp(t)
	kv := bucket(t, ctx, js, jetstream.KeyValueConfig{Bucket: "B"})
	rev, err := kv.Put(ctx, "a", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"del", "purged"} {
		if _, err := kv.Put(ctx, k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "del"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "purged"); err != nil {
		t.Fatal(err)
	}
	api := jsapi.New(js)

	v, seq, err := api.KeyFromLeader(ctx, "B", "a")
	if err != nil || string(v) != "one" || seq != rev {
		t.Errorf("a: %q at %d, %v; want \"one\" at %d", v, seq, err, rev)
	}
	if _, _, err := api.KeyFromLeader(ctx, "B", "never"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a key never written: %v, want ErrKeyNotFound", err)
	}
	for _, k := range []string{"del", "purged"} {
		if _, _, err := api.KeyFromLeader(ctx, "B", k); !errors.Is(err, jetstream.ErrKeyDeleted) {
			t.Errorf("%s: %v, want ErrKeyDeleted", k, err)
		}
	}
	_, _, err = api.KeyFromLeader(ctx, "NONE", "a")
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamNotFound || !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a bucket that does not exist: %v, want the API error %d", err, jetstream.JSErrCodeStreamNotFound)
	}
}

// LastFromLeader decodes the headers of the message it reads, and its
// absence is the server's message-not-found code.
func TestLastFromLeaderDecodesHeaders(t *testing.T) {
	js, ctx := setUp(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("s.1")
	m.Header.Set("X-One", "1")
	m.Header.Add("X-Two", "a")
	m.Header.Add("X-Two", "b")
	m.Data = []byte("body")
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	api := jsapi.New(js)
	got, err := api.LastFromLeader(ctx, "S", "s.1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Subject != "s.1" || got.Sequence != ack.Sequence || string(got.Data) != "body" ||
		got.Header.Get("X-One") != "1" || len(got.Header.Values("X-Two")) != 2 || got.Time.IsZero() {
		t.Errorf("got %+v", got)
	}
	_, err = api.LastFromLeader(ctx, "S", "s.2")
	if !jsapi.IsCode(err, jetstream.JSErrCodeMessageNotFound) || !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("no message: %v, want the API error %d", err, jetstream.JSErrCodeMessageNotFound)
	}
}

// A key the server removed for its age leaves a marker (Nats-Marker-Reason:
// MaxAge), which reads as a deleted key.
func TestKeyAgedOutIsDeleted(t *testing.T) {
	js, ctx := setUp(t)
	kv := bucket(t, ctx, js, jetstream.KeyValueConfig{Bucket: "AGED", TTL: time.Second, LimitMarkerTTL: time.Minute})
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	api := jsapi.New(js)
	var last error
	if !poll.Wait(10*time.Second, func() bool {
		_, _, last = api.KeyFromLeader(ctx, "AGED", "k")
		return errors.Is(last, jetstream.ErrKeyDeleted)
	}) {
		t.Fatalf("a key past the bucket's TTL: %v, want ErrKeyDeleted", last)
	}
	m, err := api.LastFromLeader(ctx, jsapi.BucketStream("AGED"), jsapi.KeySubject("AGED", "k"))
	if err != nil || m.Header.Get(jetstream.MarkerReasonHeader) != "MaxAge" {
		t.Fatalf("the marker: %+v, %v; want Nats-Marker-Reason MaxAge", m, err)
	}
	seen := 0
	err = jsapi.LastOfKeys(ctx, api, "AGED", []string{"k"}, same, func(key string, _ []byte, deleted bool) {
		seen++
		if key != "k" || !deleted {
			t.Errorf("batched: %s deleted %v, want k deleted", key, deleted)
		}
	})
	if err != nil || seen != 1 {
		t.Errorf("batched: %d keys, %v; want the one", seen, err)
	}
}

// LastOfEach reads the last message of each subject that has one, over as
// many requests as MaxBatch makes, and leaves out those with none.
func TestLastOfEachInBatches(t *testing.T) {
	js, ctx := setUp(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "E", Subjects: []string{"e.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	const n = 2*jsapi.MaxBatch + 17
	var subjects []string
	for i := range n {
		s := fmt.Sprintf("e.%d", i)
		subjects = append(subjects, s, "e.none"+s[2:])
		if _, err := js.PublishAsync(s, []byte("first")); err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(s, fmt.Appendf(nil, "last %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	api := jsapi.New(js)
	got := map[string]string{}
	err := api.LastOfEach(ctx, "E", subjects, func(subject string, hdr nats.Header, data []byte) {
		if hdr.Get(jetstream.SequenceHeader) == "" {
			t.Errorf("%s: no sequence header", subject)
		}
		got[subject] = string(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d subjects read, want %d", len(got), n)
	}
	for i := range n {
		if s := fmt.Sprintf("e.%d", i); got[s] != fmt.Sprintf("last %d", i) {
			t.Errorf("%s: %q", s, got[s])
		}
	}
	if err := api.LastOfEach(ctx, "E", []string{"e.x", "e.y"}, func(string, nats.Header, []byte) {
		t.Error("a message for a subject with none")
	}); err != nil {
		t.Errorf("subjects with no message: %v, want no error", err)
	}
}

// LastOfKeys tells a deleted key from one with a value, and a stream that
// answers no direct get is an API error with the status as its code.
func TestLastOfKeys(t *testing.T) {
	js, ctx := setUp(t)
	kv := bucket(t, ctx, js, jetstream.KeyValueConfig{Bucket: "K"})
	for _, k := range []string{"a", "b", "gone"} {
		if _, err := kv.Put(ctx, k, []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	api := jsapi.New(js)
	got := map[string]string{}
	err := jsapi.LastOfKeys(ctx, api, "K", []string{"a", "b", "gone", "never"}, same, func(key string, value []byte, deleted bool) {
		if deleted {
			got[key] = "deleted"
			return
		}
		got[key] = string(value)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got["a"] != "va" || got["b"] != "vb" || got["gone"] != "deleted" {
		t.Errorf("got %v", got)
	}

	err = api.LastOfEach(ctx, "NONE", []string{"x"}, func(string, nats.Header, []byte) {})
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != 503 {
		t.Errorf("a stream that does not exist: %v, want an API error with code 503", err)
	}
}

// Keys lists the keys a bucket's stream holds.
func TestKeys(t *testing.T) {
	js, ctx := setUp(t)
	kv := bucket(t, ctx, js, jetstream.KeyValueConfig{Bucket: "W"})
	for _, k := range []string{"w1", "w2"} {
		if _, err := kv.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := jsapi.New(js).Keys(ctx, "W")
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %v, %v; want w1, w2", keys, err)
	}
	if _, err := jsapi.New(js).Keys(ctx, "NONE"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a bucket that does not exist: %v", err)
	}
}

// A pin hold renews a pin the consumer has, and reports a pin that is not
// (or no longer) the consumer's.
func TestHoldPin(t *testing.T) {
	js, ctx := setUp(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "P", Subjects: []string{"p.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:        "c",
		AckPolicy:      jetstream.AckExplicitPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{"g"},
		PinnedTTL:      time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "p.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	pin := fetchPin(t, cons)
	api := jsapi.New(js)

	var wrongLost atomic.Int32
	wrong, err := api.HoldPin("P", "c", "g", "not-the-pin", func() { wrongLost.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = wrong.Stop() }()
	if err := wrong.Renew(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "a hold of a pin the consumer does not have to be lost", 5*time.Second, func() bool { return wrongLost.Load() > 0 })

	var lost atomic.Int32
	hold, err := api.HoldPin("P", "c", "g", pin, func() { lost.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Stop() }()
	if err := hold.Renew(); err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || len(info.PriorityGroups) != 1 || info.PriorityGroups[0].PinnedClientID != pin {
		t.Fatalf("consumer info %+v, %v; want pinned to %s", info, err, pin)
	}
	// Unpinned, the consumer pins the next puller: the old pin is lost.
	if err := st.UnpinConsumer(ctx, "c", "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "p.2", []byte("x")); err != nil {
		t.Fatal(err)
	}
	other, err := js.Consumer(ctx, "P", "c") // another puller: it has no pin
	if err != nil {
		t.Fatal(err)
	}
	if pin2 := fetchPin(t, other); pin2 == pin {
		t.Fatalf("pinned again to %s", pin)
	}
	poll.Until(t, "the hold of a pin given to another puller to be lost", 5*time.Second, func() bool {
		_ = hold.Renew()
		return lost.Load() > 0
	})
}

// fetchPin pulls one message of cons in group g and returns the pin it
// came with.
func fetchPin(t *testing.T, cons jetstream.Consumer) string {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup("g"))
	if err != nil {
		t.Fatal(err)
	}
	var pin string
	for m := range batch.Messages() {
		pin = m.Headers().Get("Nats-Pin-Id")
		_ = m.Ack()
	}
	if pin == "" {
		t.Fatalf("no pin delivered: %v", batch.Error())
	}
	return pin
}

// Every request goes under js's API prefix: a domain's, here.
func TestDomainPrefix(t *testing.T) {
	srv := natstest.StartOpts(t, func(o *server.Options) { o.JetStreamDomain = "hub" })
	nc, _ := srv.Connect(t)
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	if p := jsapi.Prefix(js); p != "$JS.hub.API." {
		t.Errorf("prefix %q", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := bucket(t, ctx, js, jetstream.KeyValueConfig{Bucket: "D"})
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, _, err := jsapi.New(js).KeyFromLeader(ctx, "D", "k"); err != nil || string(v) != "v" {
		t.Errorf("through the domain: %q, %v", v, err)
	}
	n := 0
	if err := jsapi.LastOfKeys(ctx, jsapi.New(js), "D", []string{"k"}, same, func(string, []byte, bool) { n++ }); err != nil || n != 1 {
		t.Errorf("batched through the domain: %d, %v", n, err)
	}
}

func same(s string) string { return s }

func TestKeyOf(t *testing.T) {
	for _, c := range []struct {
		bucket, subject, key string
		ok                   bool
	}{
		{"B", "$KV.B.k", "k", true},
		{"B", "$KV.B.a.b", "a.b", true},
		{"B", "$KV.BB.k", "", false},
		{"B", "$KV.B", "", false},
		{"B", "x.B.k", "", false},
	} {
		if key, ok := jsapi.KeyOf(c.bucket, c.subject); key != c.key || ok != c.ok {
			t.Errorf("KeyOf(%s, %s) = %q, %v; want %q, %v", c.bucket, c.subject, key, ok, c.key, c.ok)
		}
	}
	if got := jsapi.KeySubject("B", "k"); got != "$KV.B.k" {
		t.Errorf("KeySubject: %s", got)
	}
}
