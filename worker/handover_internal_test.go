package worker

import (
	"context"
	"testing"
	"time"

	"proxyfleet/messages"
)

// A worker's unpins are at most unpinAtOnce at a time, and look the work
// stream up once, however many hosts it hands over: ten workers started
// together hand hundreds of hosts over at once, and a lookup for each,
// with the unpins, timed the unpins out on the busy JetStream API.
func TestUnpinsAreBoundedAndLookTheStreamUpOnce(t *testing.T) {
	_, nc, js, ctx := setUpTopology(t)
	// A synchronous subscription: once a flush returns, every request
	// sent before it is in its queue (a handler might not have run yet).
	sub, err := nc.SubscribeSync("$JS.API.STREAM.INFO." + messages.StreamWork)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var u unpinner
	for range 5 {
		if _, err := u.stream(ctx, js, messages.StreamWork); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, err := sub.Pending(); err != nil {
		t.Fatal(err)
	} else if n != 1 {
		t.Errorf("5 handles of %s: %d lookups, want 1", messages.StreamWork, n)
	}

	var releases []func()
	for range unpinAtOnce {
		release, err := u.slot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := u.slot(short); err == nil {
		t.Fatalf("slot %d of %d: taken, want it to wait until its context ends", unpinAtOnce+1, unpinAtOnce)
	}
	releases[0]()
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if _, err := u.slot(done); err != nil {
		t.Errorf("a free slot with an ended context: %v, want it taken", err)
	}
}
