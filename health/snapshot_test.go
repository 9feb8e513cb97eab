package health_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// TestSnapshotTooLarge: a rotation whose snapshot does not fit in a
// message is announced on the snapshot's subject with a notice (no
// proxies: truncated, its size, the feed's subject), counted, and logged
// at error level once; once it fits again, snapshots carry the proxies,
// and that is logged once too.
func TestSnapshotTooLarge(t *testing.T) {
	r := newRig(t)
	logger, logs := captureLog(t)
	h := r.start(health.Config{Logger: logger, SnapshotMaxBytes: 1500})
	for i := range 30 {
		r.publish(event(fmt.Sprintf("p%02d", i), 1, messages.StateRunning, fmt.Sprintf("198.18.100.%d", i+1)))
	}
	waitFor(t, "a notice instead of the snapshot", func() bool {
		s := r.snapshots()
		return len(s) > 0 && s[len(s)-1].Truncated && s[len(s)-1].Size == 30
	})
	s := r.snapshots()
	notice := s[len(s)-1]
	if notice.Proxies != nil || notice.Feed != subj.RotationChanges() || notice.Bytes <= 1500 {
		t.Fatalf("notice %+v", notice)
	}
	if m := h.Metrics(); !m.SnapshotTooLarge || m.SnapshotsTooLarge == 0 || m.SnapshotBytes <= 1500 {
		t.Fatalf("metrics %+v", m)
	}
	// More changes while it does not fit: no more error lines.
	for i := range 5 {
		r.publish(event(fmt.Sprintf("p%02d", i), 2, messages.StateRunning, fmt.Sprintf("198.18.101.%d", i+1)))
	}
	waitFor(t, "the changes in a notice", func() bool {
		s := r.snapshots()
		return h.Metrics().SnapshotsTooLarge >= 2 && s[len(s)-1].Version == h.Metrics().RotationVersion
	})
	for i := range 25 {
		r.publish(event(fmt.Sprintf("p%02d", i), 3, messages.StateDeleted, ""))
	}
	waitFor(t, "a whole snapshot again", func() bool {
		s := r.snapshots()
		return len(s) > 0 && !s[len(s)-1].Truncated && len(s[len(s)-1].Proxies) == 5
	})
	out := logs.String()
	if n := strings.Count(out, "level=ERROR"); n != 1 || !strings.Contains(out, "no longer fits in one snapshot") {
		t.Fatalf("%d error lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "fits in one snapshot again"); n != 1 {
		t.Fatalf("%d lines saying it fits again, want 1", n)
	}
	if h.Metrics().SnapshotTooLarge {
		t.Fatal("still too large by the metric")
	}
}

// TestSnapshotPacedByItsBytes: a snapshot waits the time its predecessor's
// bytes take at SnapshotRate when that is longer than SnapshotInterval,
// and then carries the latest version. The bound checked is a lower one,
// which a slow machine only makes easier to meet.
func TestSnapshotPacedByItsBytes(t *testing.T) {
	r := newRig(t)
	var (
		mu    sync.Mutex
		times []time.Time
		sizes []int
	)
	sub, err := r.nc.Subscribe(subj.Rotation(), func(m *nats.Msg) {
		mu.Lock()
		times, sizes = append(times, time.Now()), append(sizes, len(m.Data))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const rate = 4096
	h := r.start(health.Config{SnapshotInterval: 10 * time.Millisecond, SnapshotRate: rate})
	for i := range 100 {
		r.publish(event(fmt.Sprintf("p%03d", i), 1, messages.StateRunning, fmt.Sprintf("198.18.100.%d", i+1)))
	}
	waitFor(t, "a snapshot of all 100", func() bool {
		s := r.snapshots()
		return len(s) > 0 && len(s[len(s)-1].Proxies) == 100
	})
	// The rig's subscription and this one each get every snapshot, in
	// their own time: read the last one only once this one has it too.
	waitFor(t, "this subscription to have every snapshot", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(times) == len(r.snapshots())
	})
	mu.Lock()
	before := len(times)
	prevAt, prevBytes := times[before-1], sizes[before-1]
	mu.Unlock()
	r.publish(event("p000", 2, messages.StateRunning, "198.18.101.1"))
	waitFor(t, "the change in a snapshot", func() bool {
		s := r.snapshots()
		return len(s) > 0 && s[len(s)-1].Version == h.Metrics().RotationVersion && s[len(s)-1].Proxies[0].Addr == "198.18.101.1:3128"
	})
	mu.Lock()
	gap := times[len(times)-1].Sub(prevAt)
	mu.Unlock()
	// The snapshot of 100 is about 7.5 KB: the next waits about 1.8s,
	// not the 10ms interval. Half of it leaves room for a late delivery
	// of the first.
	wait := time.Duration(float64(prevBytes) / rate * float64(time.Second))
	if wait < time.Second || gap < wait/2 {
		t.Fatalf("the snapshot after one of %d bytes came %s after it, want at least %s (%d bytes at %d a second)", prevBytes, gap, wait/2, prevBytes, rate)
	}
}
