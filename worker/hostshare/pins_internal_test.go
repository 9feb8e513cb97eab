package hostshare

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/messages"
)

// An Unpinner's unpins are at most UnpinAtOnce at a time (a further one
// waits for a slot until its context ends; a free slot is taken whatever
// its context says), on the handle of the work stream, looked up until a
// lookup succeeds and then kept. How often the stream is looked up is a
// budget (BenchmarkUnpinLookups in package worker, bench section budgets).
func TestUnpinsAreBoundedOnTheirStream(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := NewUnpinner(js)
	if _, err := u.Stream(ctx); err == nil {
		t.Fatalf("stream %s found before it was made", messages.StreamWork)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: messages.StreamWork, Subjects: []string{"test.work.>"}}); err != nil {
		t.Fatal(err)
	}
	first, err := u.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if name := first.CachedInfo().Config.Name; name != messages.StreamWork {
		t.Errorf("the handle is %s's, want %s's", name, messages.StreamWork)
	}
	if again, err := u.Stream(ctx); err != nil || again != first {
		t.Errorf("a second call: %v, %v; want the handle kept", again, err)
	}

	var releases []func()
	for range UnpinAtOnce {
		release, err := u.slot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := u.slot(short); err == nil {
		t.Fatalf("slot %d of %d: taken, want it to wait until its context ends", UnpinAtOnce+1, UnpinAtOnce)
	}
	releases[0]()
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if _, err := u.slot(done); err != nil {
		t.Errorf("a free slot with an ended context: %v, want it taken", err)
	}
}
