package worker

import (
	"context"
	"testing"
	"time"

	"proxyfleet/messages"
)

// A worker's unpins are at most unpinAtOnce at a time, on the handle of
// the stream they unpin on. How often the stream is looked up is a budget
// (BenchmarkUnpinLookups, bench section budgets).
func TestUnpinsAreBoundedOnTheirStream(t *testing.T) {
	_, _, js, ctx := setUpTopology(t)
	var u unpinner
	for range 5 {
		st, err := u.stream(ctx, js, messages.StreamWork)
		if err != nil {
			t.Fatal(err)
		}
		if name := st.CachedInfo().Config.Name; name != messages.StreamWork {
			t.Errorf("the handle of %s is %s's", messages.StreamWork, name)
		}
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
