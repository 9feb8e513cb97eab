package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

// quickChecks makes a worker look at its consumers often.
func quickChecks(c *worker.Config) { c.CheckInterval = 100 * time.Millisecond }

// startRepairer runs what `serve` runs beside its embedded server: set-up,
// then a repairer, on the rig's own (admin) connection.
func (r *rig) startRepairer(interval time.Duration) *topology.Repairer {
	r.t.Helper()
	rep := topology.NewRepairer(r.js, topology.Topology{Subjects: subj}, topology.RepairerConfig{Interval: interval, Logger: testLogger(r.t)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rep.Setup(ctx); err != nil {
		r.t.Fatal(err)
	}
	runtest.Go(r.t, rep.Run)
	return rep
}

// startHealth runs a health process on its own connection, folding events
// only (no probes), as with the sim driver.
func (r *rig) startHealth() *health.Health {
	r.t.Helper()
	_, js := r.srv.Connect(r.t, r.conn...)
	h, err := health.New(js, health.Config{
		Subjects: subj, HTTPAddr: health.NoHTTP, Logger: testLogger(r.t), LeaseTTL: 2 * time.Second,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	runtest.Start(r.t, h.Run, h.Started(), 10*time.Second)
	return h
}

// publishRetrying publishes a command as a client that retries would,
// until the stream takes it (it may be missing for a moment).
func (r *rig) publishRetrying(subject, body, msgID string, bound time.Duration) {
	r.t.Helper()
	var err error
	if !poll.WaitEvery(bound, 50*time.Millisecond, func() bool {
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		m.Header.Set(jetstream.MsgIDHeader, msgID)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = r.js.PublishMsg(ctx, m, jetstream.WithExpectStream(messages.StreamCommands))
		return err == nil
	}) {
		r.t.Fatalf("publish %s: %v", subject, err)
	}
}

// rotation reads PROXY_ROTATION as a client does.
func (r *rig) rotation() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := map[string]string{}
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			out[e.Key()] = string(e.Value())
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TestFleetHealsDeletedTopology deletes, one after the other while the fleet
// runs, each consumer, stream and bucket it uses, and after each deletion
// publishes new commands (two creates and a delete of an older proxy) and
// waits for them to be done, for the proxies' last events to say so and for
// the rotation to hold exactly the running proxies.
func TestFleetHealsDeletedTopology(t *testing.T) {
	r := newRig(t, "h1", "h2")
	rep := r.startRepairer(200 * time.Millisecond)
	w1 := r.startWorker(quickChecks)
	w2 := r.startWorker(quickChecks)
	r.startHealth()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const bound = 60 * time.Second
	running := map[string]bool{}
	var lastSeq uint64 // the highest event seq seen so far
	round := func(name string, n int) time.Duration {
		t.Helper()
		start := time.Now()
		a, b := fmt.Sprintf("p%da", n), fmt.Sprintf("p%db", n)
		var cmds []string
		for _, c := range []struct{ id, host string }{{a, "h1"}, {b, "h2"}} {
			cmd := "c-" + c.id
			r.publishRetrying(subj.Create(c.id), fmt.Sprintf(`{"v":1,"id":%q,"host":%q}`, c.id, c.host), cmd, bound)
			cmds = append(cmds, cmd)
			running[c.id] = true
		}
		if n > 0 {
			// A proxy created before: its delete must not be taken for
			// an old command, whatever stream was recreated.
			old := fmt.Sprintf("p%da", n-1)
			cmd := "d-" + old
			r.publishRetrying(subj.Delete(old), fmt.Sprintf(`{"v":1,"id":%q}`, old), cmd, bound)
			cmds = append(cmds, cmd)
			delete(running, old)
		}
		for _, cmd := range cmds {
			// Done on record in PROXY_RESULTS, where a client reads it:
			// a result published while the stream is missing still
			// reaches core subscribers.
			id := cmd[2:]
			// (Not only the last result of the subject: an "accepted"
			// that a missing stream did not store is answered again by
			// intake's retry, and may be stored after the "done".)
			var got []messages.Result
			if !poll.WaitEvery(bound, 20*time.Millisecond, func() bool {
				got = r.storedResults()[cmd]
				return hasOutcome(got, messages.OutcomeDone)
			}) {
				t.Fatalf("after deleting %s: command %s of %s not done within %s (stored results %+v, results seen %+v)", name, cmd, id, bound, got, r.resultsFor(cmd))
			}
		}
		doneAt := time.Since(start)
		for _, id := range []string{a, b} {
			ev, ok := r.lastEvent(id)
			if !ok || ev.State != messages.StateRunning || ev.IP == "" {
				t.Fatalf("after deleting %s: last event of %s = %+v, want running with an IP", name, id, ev)
			}
			if ev.Seq <= lastSeq {
				t.Fatalf("after deleting %s: %s's event seq %d is not above %d, the highest seen before", name, id, ev.Seq, lastSeq)
			}
		}
		for _, id := range []string{a, b} {
			ev, _ := r.lastEvent(id)
			lastSeq = max(lastSeq, ev.Seq)
		}
		var rot map[string]string
		var err error
		if !poll.WaitEvery(bound, 50*time.Millisecond, func() bool {
			rot, err = r.rotation()
			if err != nil || len(rot) != len(running) {
				return false
			}
			for id := range running {
				if rot[id] == "" {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("after deleting %s: rotation %v (err %v), want exactly %v", name, rot, err, running)
		}
		t.Logf("%s: commands done after %s, rotation right after %s", name, doneAt.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		return time.Since(start)
	}
	round("nothing", 0)

	type deletion struct {
		name string
		del  func() error
	}
	delStream := func(s string) deletion {
		return deletion{"stream " + s, func() error { return r.js.DeleteStream(ctx, s) }}
	}
	delBucket := func(b string) deletion {
		return deletion{"bucket " + b, func() error { return r.js.DeleteKeyValue(ctx, b) }}
	}
	delConsumer := func(s, c string) deletion {
		return deletion{"consumer " + c, func() error { return r.js.DeleteConsumer(ctx, s, c) }}
	}
	cases := []deletion{
		delConsumer(messages.StreamCommands, topology.IntakeConsumer),
		delConsumer(messages.StreamWork, topology.WorkConsumer("h1")),
		delStream(messages.StreamCommands),
		delStream(messages.StreamWork),
		delStream(messages.StreamResults),
		delStream(messages.StreamEvents),
		delStream(messages.StreamDead),
		delBucket(messages.BucketDesired),
		delBucket(messages.BucketCommands),
		delBucket(messages.BucketRotation),
		delBucket(messages.BucketLeases),
	}
	for i, c := range cases {
		if err := c.del(); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatalf("delete %s: %v", c.name, err)
		}
		took := round(c.name, i+1)
		t.Logf("deleted %-22s: new commands done, events and rotation right after %s", c.name, took.Round(time.Millisecond))
	}
	if got, want := rep.Repairs(), int64(len(cases)-2); got != want {
		t.Errorf("repairer recreated %d streams and buckets, want %d", got, want)
	}
	repairs := w1.Stats().Snapshot()["repairs"] + w2.Stats().Snapshot()["repairs"]
	if repairs < 2 {
		t.Errorf("workers counted %d consumer repairs, want at least 2", repairs)
	}
	t.Logf("repairer: %d repairs; workers: %d consumer repairs", rep.Repairs(), repairs)
}

// pinned returns the id of the client a host's work consumer is pinned to.
func (r *rig) pinned(host string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cons, err := r.js.Consumer(ctx, messages.StreamWork, topology.WorkConsumer(host))
	if err != nil {
		return ""
	}
	for _, g := range cons.CachedInfo().PriorityGroups {
		if g.Group == topology.PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// A worker whose consumers are deleted under it recreates them within
// seconds, says so at error level, counts it, goes on working, and still
// drains and unpins when it stops.
func TestWorkerRecreatesDeletedConsumers(t *testing.T) {
	r := newRig(t, "h1")
	var logs syncBuf
	w := r.startWorker(quickChecks, func(c *worker.Config) { c.Logger = logTo(&logs) })
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	ctx := ctxFor(t, 30*time.Second)
	for i, c := range []struct{ stream, name string }{
		{messages.StreamCommands, topology.IntakeConsumer},
		{messages.StreamWork, topology.WorkConsumer("h1")},
	} {
		if err := r.js.DeleteConsumer(ctx, c.stream, c.name); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		id, cmd := fmt.Sprintf("q%d", i), fmt.Sprintf("cq%d", i)
		r.create(id, cmd, "")
		r.waitOutcome(cmd, messages.OutcomeDone)
		t.Logf("consumer %s deleted: the next command was done after %s", c.name, time.Since(start).Round(time.Millisecond))
		if got := w.Stats().Snapshot()["repairs"]; got != int64(i+1) {
			t.Fatalf("repairs = %d after %d deletions", got, i+1)
		}
		// The check that repairs it names the deletion, or, if the
		// consumer exists again by the time the check looks, the consume
		// it found stopped: either way it was recreated and consumed.
		deleted := fmt.Sprintf(`level=ERROR msg="consumer %s on %s was deleted: recreated it and resumed consuming"`, c.name, c.stream)
		stopped := fmt.Sprintf(`level=ERROR msg="consumer %s on %s had stopped consuming: recreated it and resumed consuming"`, c.name, c.stream)
		if l := logs.String(); !strings.Contains(l, deleted) && !strings.Contains(l, stopped) {
			t.Fatalf("no %s in the log:\n%s", deleted, l)
		}
	}
	if r.pinned("h1") == "" {
		t.Fatal("the recreated work consumer is pinned to nobody")
	}
	if err := r.stopWorker(w); err != nil {
		t.Fatal(err)
	}
	if p := r.pinned("h1"); p != "" {
		t.Fatalf("work-h1 still pinned to %s after the worker stopped", p)
	}
}
