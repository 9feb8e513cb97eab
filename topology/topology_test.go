package topology_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

var subj = messages.NewSubjects("")

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startRepairer runs what `serve` runs beside its embedded server: set-up,
// then a repairer, on an admin connection.
func startRepairer(t *testing.T, js jetstream.JetStream, interval time.Duration) *topology.Repairer {
	t.Helper()
	rep := topology.NewRepairer(js, topology.Topology{Subjects: subj}, topology.RepairerConfig{Interval: interval, Logger: slog.New(slog.DiscardHandler)})
	if _, err := rep.Setup(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	runtest.Go(t, rep.Run)
	return rep
}

// Setup creates everything, then finds nothing to do, then updates in place
// what a changed config asks for, naming each setting old → new.
func TestSetupCreatesThenUpdates(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := ctxFor(t, 20*time.Second)
	topo := topology.Topology{Subjects: subj}
	changes, err := topo.Setup(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 16 {
		t.Fatalf("first setup made %d changes, want 16 creations: %v", len(changes), changes)
	}
	for _, c := range changes {
		if !c.Created {
			t.Fatalf("first setup: %v", c)
		}
	}
	if changes, err = topo.Setup(ctx, js); err != nil || len(changes) != 0 {
		t.Fatalf("second setup: %v, %v; want nothing to do", changes, err)
	}

	topo.ResultsMaxAge = 2 * time.Hour
	topo.DuplicateWindow = time.Minute
	topo.CommandIDMaxAge = 48 * time.Hour
	changes, err = topo.Setup(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range changes {
		if c.Created {
			t.Fatalf("created %s on an update", c.Name)
		}
		got[c.Name] = c.String()
	}
	want := map[string]string{
		messages.StreamCommands:     "updated stream PROXY_CMDS: duplicate_window 2m0s → 1m0s",
		messages.StreamResults:      "updated stream PROXY_RESULTS: max_age 24h0m0s → 2h0m0s, duplicate_window 2m0s → 1m0s",
		messages.StreamDead:         "updated stream PROXY_DEAD: duplicate_window 2m0s → 1m0s",
		messages.StreamPoolCommands: "updated stream PROXY_POOLCMDS: duplicate_window 2m0s → 1m0s",
		messages.StreamHostCommands: "updated stream PROXY_HOSTCMDS: duplicate_window 2m0s → 1m0s",
		messages.BucketCommands:     "updated bucket PROXY_CMDIDS: ttl 168h0m0s → 48h0m0s",
	}
	if len(got) != len(want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	st, err := js.Stream(ctx, messages.StreamResults)
	if err != nil || st.CachedInfo().Config.MaxAge != 2*time.Hour {
		t.Fatalf("PROXY_RESULTS after the update: %+v, %v", st.CachedInfo().Config, err)
	}
}

// PROXY_BANS lets each entry carry its TTL and leaves a marker when one
// expires; a bucket made without those gets them in place.
func TestBansBucketHasPerKeyTTL(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := ctxFor(t, 20*time.Second)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketBans, History: 1}); err != nil {
		t.Fatal(err)
	}
	changes, err := (topology.Topology{Subjects: subj}).Setup(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var updated string
	for _, c := range changes {
		if c.Name == messages.BucketBans {
			updated = c.String()
		}
	}
	if want := "updated bucket PROXY_BANS: allow_msg_ttl false → true, limit_marker_ttl 0 → 10m0s"; updated != want {
		t.Errorf("set-up of an old PROXY_BANS: %q, want %q", updated, want)
	}
	st, err := js.Stream(ctx, topology.BucketStream(messages.BucketBans))
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != messages.BansMarkerTTL {
		t.Errorf("PROXY_BANS: allow_msg_ttl %v, marker TTL %s", c.AllowMsgTTL, c.SubjectDeleteMarkerTTL)
	}
	kv, err := js.KeyValue(ctx, messages.BucketBans)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "k", []byte("v"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatalf("a key with its own TTL: %v", err)
	}
}

// A setting JetStream cannot change in place is refused, and Setup names it.
func TestSetupNamesARefusedSetting(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := ctxFor(t, 20*time.Second)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: messages.StreamDead, Subjects: []string{subj.DeadAll()}, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	changes, err := topology.Topology{Subjects: subj}.Setup(ctx, js)
	var re *topology.RefusedError
	if !errors.As(err, &re) || re.Name != messages.StreamDead || len(re.Refused) != 1 || re.Refused[0].Field != "storage" {
		t.Fatalf("setup over a memory PROXY_DEAD: err = %v, want a refusal naming storage", err)
	}
	if !strings.Contains(err.Error(), "storage Memory → File") {
		t.Errorf("error %q does not say what it would have changed", err)
	}
	// What it could change, it changed; the rest was created.
	var updated []string
	for _, c := range changes {
		if !c.Created {
			updated = append(updated, c.String())
		}
	}
	if len(updated) != 1 || !strings.Contains(updated[0], "max_age unlimited → 720h0m0s") {
		t.Fatalf("updates %v, want PROXY_DEAD's max_age applied beside the refused storage", updated)
	}
}

// The repairer recreates what was deleted, each stream above the last
// sequence it saw, so sequences keep growing.
func TestRepairerRecreatesAboveTheLastSequence(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	rep := startRepairer(t, js, 50*time.Millisecond)
	ctx := ctxFor(t, 30*time.Second)
	for range 3 {
		if _, err := js.Publish(ctx, subj.State("p1"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if n := rep.Check(ctx); n != 0 { // a look at PROXY_EVENTS at sequence 3
		t.Fatalf("a check with nothing missing recreated %d", n)
	}
	if err := js.DeleteStream(ctx, messages.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, messages.BucketDesired); err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	poll.Until(t, "PROXY_EVENTS back", 10*time.Second, func() bool {
		st, err := js.Stream(ctx, messages.StreamEvents)
		if err == nil {
			info = st.CachedInfo()
		}
		return err == nil
	})
	if info.State.FirstSeq != 3+topology.FirstSeqMargin {
		t.Fatalf("recreated PROXY_EVENTS starts at %d, want above 3 (+ margin)", info.State.FirstSeq)
	}
	poll.Until(t, "PROXY_DESIRED back", 10*time.Second, func() bool {
		_, err := js.KeyValue(ctx, messages.BucketDesired)
		return err == nil
	})
	poll.Until(t, "two repairs counted", 10*time.Second, func() bool { return rep.Repairs() == 2 })
}

// A host's work consumer is created in memory, and one an earlier release
// made on file is taken as it is: the server cannot change a consumer's
// storage, so comparing it would refuse to start every worker of such a
// deployment.
func TestWorkConsumerInMemoryAndAFileOneKept(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := ctxFor(t, 20*time.Second)
	topo := topology.Topology{Subjects: subj}
	if _, err := topo.Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	cons, diffs, err := topology.EnsureConsumer(ctx, js, messages.StreamWork, topo.WorkConsumerConfig("h1"))
	if err != nil || len(diffs) != 0 {
		t.Fatalf("create work-h1: %v, %v", diffs, err)
	}
	if !cons.CachedInfo().Config.MemoryStorage {
		t.Fatal("work-h1 was created on file, want memory")
	}

	old := topo.WorkConsumerConfig("h2")
	old.MemoryStorage = false
	if _, err := js.CreateConsumer(ctx, messages.StreamWork, old); err != nil {
		t.Fatal(err)
	}
	cons, diffs, err = topology.EnsureConsumer(ctx, js, messages.StreamWork, topo.WorkConsumerConfig("h2"))
	if err != nil || len(diffs) != 0 {
		t.Fatalf("ensure the file consumer work-h2: %v, %v; want it taken as it is", diffs, err)
	}
	if cons.CachedInfo().Config.MemoryStorage {
		t.Fatal("work-h2 changed storage")
	}
}
