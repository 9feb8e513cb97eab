package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/fleet"
	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

// A failure never harms a healthy proxy. These tests stage a
// failing command against a proxy that runs and is in the rotation, and
// check that the proxy keeps its domain, its state and its place.

// rotationWatch runs a health process (events only, no probing) and records
// every removal from PROXY_ROTATION.
type rotationWatch struct {
	mu      sync.Mutex
	members map[string]bool
	removed []string
}

func (r *rig) watchRotation() *rotationWatch {
	r.t.Helper()
	r.startHealth()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketRotation)
	if err != nil {
		r.t.Fatal(err)
	}
	kw, err := kv.WatchAll(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	w := &rotationWatch{members: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			w.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				w.members[e.Key()] = true
			} else {
				delete(w.members, e.Key())
				w.removed = append(w.removed, e.Key())
			}
			w.mu.Unlock()
		}
	}()
	r.t.Cleanup(func() { _ = kw.Stop(); <-done })
	return w
}

func (w *rotationWatch) has(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.members[id]
}

func (w *rotationWatch) removals() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.removed...)
}

// runningInRotation creates id and waits until it runs and is in the
// rotation; it returns its last event.
func (r *rig) runningInRotation(rw *rotationWatch, id, cmdID string) messages.StateEvent {
	r.t.Helper()
	r.create(id, cmdID, "")
	r.waitOutcome(cmdID, messages.OutcomeDone)
	r.waitFor(id+" in the rotation", 10*time.Second, func() bool { return rw.has(id) })
	ev, _ := r.lastEvent(id)
	return ev
}

// checkUnharmed asserts that id still has the domain cmdID made on host,
// that no event after before was published for it, and that it never left
// the rotation.
func (r *rig) checkUnharmed(rw *rotationWatch, host, id, cmdID string, before messages.StateEvent) {
	r.t.Helper()
	d, err := sim.New(sim.Config{Host: host, Dir: r.hostDir(host)})
	if err != nil {
		r.t.Fatal(err)
	}
	in, err := d.Get(context.Background(), id)
	if err != nil {
		r.t.Fatalf("the running proxy's domain is gone: %v", err)
	}
	if in.CommandID != cmdID || in.State != messages.StateRunning {
		r.t.Errorf("domain %+v, want the one %s made, running", in, cmdID)
	}
	if _, err := os.Stat(sim.VolumePath(r.hostDir(host), id)); err != nil {
		r.t.Errorf("the running proxy's volume is gone: %v", err)
	}
	if ev, _ := r.lastEvent(id); ev.State != messages.StateRunning || ev.IP != before.IP {
		r.t.Errorf("last event %+v, want running at %s as before", ev, before.IP)
	}
	if got := rw.removals(); len(got) != 0 {
		r.t.Errorf("removed from the rotation: %v", got)
	}
	if !rw.has(id) {
		r.t.Errorf("%s is not in the rotation", id)
	}
}

// Case 1 of the issue: a create re-sent for a running proxy meets a
// permanent read error; the command fails, the proxy is untouched.
func TestFailedResendKeepsTheRunningProxy(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) { c.MaxAttempts = 3 })
	rw := r.watchRotation()
	before := r.runningInRotation(rw, "p1", "c1")

	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "get", ID: "p1", Class: fleet.ClassPermanent, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c2", "")
	res := r.waitOutcome("c2", messages.OutcomeFailed)
	if res.Class != string(fleet.ClassPermanent) || res.Reason == "" {
		t.Errorf("result %+v, want failed, permanent, with a reason", res)
	}
	r.checkUnharmed(rw, "h1", "p1", "c1", before)
}

// A lookup that keeps failing transiently until the attempts run out fails
// the command and leaves the proxy alone.
func TestReadErrorsUntilOutOfAttemptsKeepTheRunningProxy(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker(func(c *worker.Config) { c.MaxAttempts = 3 })
	rw := r.watchRotation()
	before := r.runningInRotation(rw, "p1", "c1")

	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "get", ID: "p1", Class: fleet.ClassTransient, Count: 3}); err != nil {
		t.Fatal(err)
	}
	r.create("p1", "c2", "")
	r.waitOutcome("c2", messages.OutcomeFailed)
	r.checkUnharmed(rw, "h1", "p1", "c1", before)
}

// The same path through NATS: the "done" answer cannot be published for
// max_attempts attempts (the executing worker's user may not publish on
// the proxy's result subject, a real server refusing it). The command
// fails; nothing is deleted and the proxy stays in the rotation.
func TestUnpublishableResultDeletesNothing(t *testing.T) {
	srv := natstest.StartOpts(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "all", Password: "all"},
			{Username: "mute", Password: "mute", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Deny: []string{subj.Result("p1")}},
			}},
		}
	})
	r := newRigOn(t, srv, nats.UserInfo("all", "all"), "h1")
	w1 := r.startWorker(func(c *worker.Config) { c.MaxAttempts = 3 })
	rw := r.watchRotation()
	before := r.runningInRotation(rw, "p1", "c1")
	if err := r.stopWorker(w1); err != nil {
		t.Fatal(err)
	}

	// Intake on a worker that may answer, execution on one that may not.
	r.startWorker(func(c *worker.Config) { c.Providers = nil })
	r.startWorkerAs(nats.UserInfo("mute", "mute"), func(c *worker.Config) {
		c.MaxAttempts = 3
		c.NoIntake = true
	})
	r.create("p1", "c2", "")
	r.waitOutcome("c2", messages.OutcomeAccepted)
	// The executor gives up without a word on the result subject; its
	// dead letter says why.
	r.waitFor("a dead letter for c2", 60*time.Second, func() bool {
		dl, ok := r.deadLetter("p1")
		return ok && dl.CommandID == "c2"
	})
	r.checkUnharmed(rw, "h1", "p1", "c1", before)
}

// Case 3 of the issue, on the simulated host: a delete interrupted after
// the domain is gone (its volume is left) is retried; the retry finds no
// domain and must still remove the volume before it reports deleted.
func TestInterruptedDeleteStillRemovesTheVolume(t *testing.T) {
	r := newRig(t, "h1")
	r.startWorker()
	r.create("p1", "c1", "")
	r.waitOutcome("c1", messages.OutcomeDone)
	vol := sim.VolumePath(r.hostDir("h1"), "p1")
	if _, err := os.Stat(vol); err != nil {
		t.Fatalf("create made no volume: %v", err)
	}
	if err := sim.InjectFault(r.hostDir("h1"), sim.Fault{Op: "delete-volumes", ID: "p1", Class: fleet.ClassTransient, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r.delete("p1", "d1")
	r.waitOutcome("d1", messages.OutcomeDone)
	if ev, _ := r.lastEvent("p1"); ev.State != messages.StateDeleted {
		t.Fatalf("last event %+v, want deleted", ev)
	}
	if r.domainExists("h1", "p1") {
		t.Error("domain left")
	}
	if _, err := os.Stat(vol); !os.IsNotExist(err) {
		t.Errorf("the volume outlived a delete that reported done: %v", err)
	}
}

// A create that never reaches running is cleaned up (its own domain, not
// running); the failure is reported.
func TestFailedCreateRemovesOnlyWhatItMade(t *testing.T) {
	r := newRig(t, "h1")
	slow := map[string]bool{"slow": true}
	r.startWorker(func(c *worker.Config) {
		c.MaxAttempts = 2
		c.ReadyTimeout = 200 * time.Millisecond
		for h, p := range c.Providers {
			c.Providers[h] = bootNever{Provider: p, ids: slow}
		}
	})
	r.create("slow", "s1", "")
	res := r.waitOutcome("s1", messages.OutcomeFailed)
	if res.Class != string(fleet.ClassTransient) {
		t.Errorf("result %+v, want failed, transient (out of attempts)", res)
	}
	if r.domainExists("h1", "slow") {
		t.Error("a create that never ran left its domain")
	}
	if _, err := os.Stat(sim.VolumePath(r.hostDir("h1"), "slow")); !os.IsNotExist(err) {
		t.Errorf("a create that never ran left its volume: %v", err)
	}
	if ev, _ := r.lastEvent("slow"); ev.State != messages.StateFailed {
		t.Errorf("last event %+v, want failed", ev)
	}
}

// bootNever reports the proxies in ids as booting forever.
type bootNever struct {
	worker.Provider
	ids map[string]bool
}

func (b bootNever) Get(ctx context.Context, id string) (fleet.Instance, error) {
	in, err := b.Provider.Get(ctx, id)
	if err == nil && b.ids[id] && in.State == messages.StateRunning {
		in.State, in.IP, in.Source, in.Reason = messages.StateProvisioning, "", "", "no address yet"
	}
	return in, err
}

// A desired record older than its work item is never acted on. KV reads are
// direct gets any replica answers, and a replica catching up after a node
// restart answers with an older record: in the cluster test a proxy's
// delete (read stale) was run for the work of its newer create, whose item
// was then acked and gone, so the proxy ended deleted. Here the stale read
// is staged: the record says delete at an old sequence, a work item names
// a newer one. The executor must wait for the record to catch up, then
// converge to it, and delete nothing.
func TestStaleDesiredReadDeletesNothing(t *testing.T) {
	r := newRig(t, "h1")
	var mu sync.Mutex
	behind := 0
	r.startWorker(func(c *worker.Config) {
		c.MaxAttempts = 50
		c.OnRetry = func(ri worker.RetryInfo) {
			if errors.Is(ri.Err, worker.ErrDesiredBehind) {
				mu.Lock()
				behind++
				mu.Unlock()
			}
		}
	})
	rw := r.watchRotation()
	before := r.runningInRotation(rw, "p1", "c1")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := r.js.KeyValue(ctx, messages.BucketDesired)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	var cur messages.Desired
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
		t.Fatal(err)
	}
	put := func(d messages.Desired) {
		b, _ := json.Marshal(d)
		if _, err := kv.Put(ctx, "p1", b); err != nil {
			t.Fatal(err)
		}
	}
	stale := cur
	stale.Op, stale.CommandID = messages.OpDelete, "c0-old"
	put(stale)
	newer := cur.Seq + 1000
	m := nats.NewMsg(subj.Work("h1", "p1"))
	m.Data = []byte(fmt.Sprintf(`{"v":1,"id":"p1","seq":%d}`, newer))
	if _, err := r.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	// The worker sees the stale record for a while: long enough for the
	// buggy form to delete.
	r.waitFor("the worker to delete p1 or retry the work of a record behind it", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return behind > 0 || !r.domainExists("h1", "p1")
	})
	if !r.domainExists("h1", "p1") {
		t.Fatal("the proxy was deleted on a desired record older than its work")
	}
	// The record catches up: the create, at the work's sequence.
	caught := cur
	caught.Seq, caught.CommandID = newer, "c2"
	put(caught)
	r.waitOutcome("c2", messages.OutcomeDone)
	r.checkUnharmed(rw, "h1", "p1", "c1", before)
}
