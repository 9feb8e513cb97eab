package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/messages"
)

// A pool command waits for its answer on <prefix>.result.pool.<name>, as a
// proxy's does on its own subject; a pool's answers are no proxy's in List;
// Pool and Pools read PROXY_POOLS with the rotation.
func TestPoolCommandsAndRecords(t *testing.T) {
	r := newRig(t, true)
	ctx := ctxFor(t, 30*time.Second)
	subj := messages.NewSubjects("")
	// Stand in for a pool controller: answer the set accepted, then done.
	cons, err := r.js.CreateConsumer(ctx, messages.StreamPoolCommands, jetstream.ConsumerConfig{Durable: "pools", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var set messages.PoolSet
		_ = json.Unmarshal(m.Data(), &set)
		cmdID := m.Headers().Get("Nats-Msg-Id")
		for _, outcome := range []string{messages.OutcomeAccepted, messages.OutcomeDone} {
			b, _ := json.Marshal(messages.Result{V: 1, ID: set.Name, CommandID: cmdID, Op: messages.OpPoolSet, Outcome: outcome, At: time.Now()})
			if _, err := r.js.Publish(context.Background(), subj.PoolResult(set.Name), b); err != nil {
				t.Error(err)
			}
		}
		_ = m.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	o, err := r.c.PoolSet(ctx, messages.PoolSet{Name: "eu", Size: 1}, "", true)
	if err != nil || o.Final == nil || o.Final.Outcome != messages.OutcomeDone || o.Op != messages.OpPoolSet || len(o.Results) != 2 {
		t.Fatalf("pool set --wait: %+v %v", o, err)
	}
	// The pool's answers are not a proxy's.
	r.create("p1", "", "")
	l, err := r.c.List(ctx, client.IncludeDeleted())
	if err != nil || len(l) != 1 || l[0].ID != "p1" {
		t.Fatalf("list: %+v %v; want p1 alone", l, err)
	}

	if _, err := r.c.Pool(ctx, "eu"); !errors.Is(err, client.ErrPoolNotFound) {
		t.Fatalf("pool eu with no record: %v", err)
	}
	kv, err := r.js.KeyValue(ctx, messages.BucketPools)
	if err != nil {
		t.Fatal(err)
	}
	rec := messages.PoolRecord{V: 1, Name: "eu", Op: "set", Size: 2, State: messages.PoolFilling,
		Members: []messages.PoolMember{{ID: "eu-bbbbbb", Host: "h1", Created: time.Now(), Ready: time.Now()}, {ID: "eu-aaaaaa", Host: "h1", Created: time.Now()}}}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, "eu", b); err != nil {
		t.Fatal(err)
	}
	rot, err := r.js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rot.Put(ctx, "eu-bbbbbb", []byte("198.18.0.9:3128")); err != nil {
		t.Fatal(err)
	}
	st, err := r.c.Pool(ctx, "eu")
	if err != nil || st.Summary.Ready != 1 || st.Summary.Creating != 1 || !st.InRotation["eu-bbbbbb"] || st.InRotation["eu-aaaaaa"] {
		t.Fatalf("pool eu: %+v %v", st, err)
	}
	all, err := r.c.Pools(ctx)
	if err != nil || len(all) != 1 || all[0].Record.Name != "eu" || all[0].Summary.Live != 2 {
		t.Fatalf("pools: %+v %v", all, err)
	}
}
