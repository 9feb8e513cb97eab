package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

func TestCreateGetDeleteList(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := New(Config{Host: "h1", Dir: t.TempDir(), BootDelay: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.Get(ctx, "p1"); !errors.Is(err, fleet.ErrNotFound) {
		t.Fatalf("get before create: %v", err)
	}
	in, err := d.Create(ctx, fleet.Spec{ID: "p1", CommandID: "c1", SpecHash: "h"})
	if err != nil || in.State != messages.StateProvisioning {
		t.Fatalf("create: %+v %v", in, err)
	}
	// Idempotent: the marked domain is found, not made again.
	if in, err := d.Create(ctx, fleet.Spec{ID: "p1", CommandID: "c2", SpecHash: "h2"}); err != nil || in.CommandID != "c1" {
		t.Fatalf("second create: %+v %v", in, err)
	}
	now = now.Add(time.Minute)
	in, err = d.Get(ctx, "p1")
	if err != nil || in.State != messages.StateRunning || in.IP != SimIP("p1") || in.SpecHash != "h" {
		t.Fatalf("get after boot: %+v %v", in, err)
	}
	if err := d.Stop("p1"); err != nil {
		t.Fatal(err)
	}
	if in, _ := d.Get(ctx, "p1"); in.State != messages.StateFailed {
		t.Fatalf("stopped domain: %+v", in)
	}
	list, err := d.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := d.Delete(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "p1"); err != nil {
		t.Fatalf("delete of an absent proxy: %v", err)
	}
	if list, _ := d.List(ctx); len(list) != 0 {
		t.Fatalf("list after delete: %+v", list)
	}
}

func TestInjectedFaults(t *testing.T) {
	dir := t.TempDir()
	d, _ := New(Config{Host: "h1", Dir: dir})
	ctx := context.Background()
	if err := InjectFault(dir, Fault{Op: "create", ID: "p1", Class: fleet.ClassTransient, Count: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		_, err := d.Create(ctx, fleet.Spec{ID: "p1"})
		if !fleet.IsTransient(err) || !errors.Is(err, ErrInjected) {
			t.Fatalf("call %d: %v, want an injected transient error", i, err)
		}
	}
	if _, err := d.Create(ctx, fleet.Spec{ID: "p2"}); err != nil {
		t.Fatalf("other id: %v", err)
	}
	if _, err := d.Create(ctx, fleet.Spec{ID: "p1"}); err != nil {
		t.Fatalf("after the faults ran out: %v", err)
	}
	_ = InjectFault(dir, Fault{Op: "delete", Class: fleet.ClassPermanent, Count: -1})
	for range 3 {
		if err := d.Delete(ctx, "p1"); fleet.ClassOf(err) != fleet.ClassPermanent {
			t.Fatalf("delete: %v, want permanent", err)
		}
	}
	if err := ClearFaults(dir); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
}

// TestOverlapIsRecorded: two calls for one id at once are serialised and
// the second records the overlap, which is what tests rely on to prove the
// worker never overlaps them.
func TestOverlapIsRecorded(t *testing.T) {
	dir := t.TempDir()
	d, _ := New(Config{Host: "h1", Dir: dir, Delay: 100 * time.Millisecond})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = d.Get(context.Background(), "p1") }()
	}
	wg.Wait()
	if _, err := os.Stat(filepath.Join(dir, "overlaps.log")); err != nil {
		t.Fatalf("no overlap recorded: %v", err)
	}
	// Calls for different ids do not count.
	dir2 := t.TempDir()
	d2, _ := New(Config{Host: "h1", Dir: dir2, Delay: 50 * time.Millisecond})
	for _, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = d2.Get(context.Background(), id) }()
	}
	wg.Wait()
	if _, err := os.Stat(filepath.Join(dir2, "overlaps.log")); err == nil {
		t.Fatal("overlap recorded for different ids")
	}
}

func TestCancelledCallIsTransient(t *testing.T) {
	d, _ := New(Config{Host: "h1", Dir: t.TempDir(), Delay: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Get(ctx, "p1"); !fleet.IsTransient(err) {
		t.Fatalf("cancelled get: %v, want transient", err)
	}
}

// TestOverlapAcrossDrivers: two drivers of one directory (two processes'
// in the tests that run workers as processes) exclude each other's calls
// for one id, and record the overlap; for different ids they do not.
func TestOverlapAcrossDrivers(t *testing.T) {
	dir := t.TempDir()
	a, _ := New(Config{Host: "h1", Dir: dir, Delay: 100 * time.Millisecond})
	b, _ := New(Config{Host: "h1", Dir: dir, Delay: 100 * time.Millisecond})
	defer a.Close()
	defer b.Close()
	var wg sync.WaitGroup
	for _, d := range []*Driver{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = d.Get(context.Background(), "p1") }()
	}
	wg.Wait()
	if _, err := os.Stat(filepath.Join(dir, "overlaps.log")); err != nil {
		t.Fatalf("no overlap recorded: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "overlaps.log")); err != nil {
		t.Fatal(err)
	}
	for i, d := range []*Driver{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = d.Get(context.Background(), fmt.Sprintf("q%d", i)) }()
	}
	wg.Wait()
	if _, err := os.Stat(filepath.Join(dir, "overlaps.log")); err == nil {
		t.Fatal("overlap recorded for different ids")
	}
}

// TestBusyWhileACallRuns: Busy says whether a call holds an id's lock.
func TestBusyWhileACallRuns(t *testing.T) {
	dir := t.TempDir()
	d, _ := New(Config{Host: "h1", Dir: dir, Delay: 300 * time.Millisecond})
	defer d.Close()
	if busy, err := Busy(dir, "p1"); err != nil || busy {
		t.Fatalf("before any call: busy %v, %v", busy, err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = d.Get(context.Background(), "p1") }()
	poll.Until(t, "the call to show as busy", 10*time.Second, func() bool {
		busy, err := Busy(dir, "p1")
		return err == nil && busy
	})
	if busy, _ := Busy(dir, "p2"); busy {
		t.Error("p2 busy while only p1 has a call")
	}
	<-done
	if busy, err := Busy(dir, "p1"); err != nil || busy {
		t.Fatalf("after the call: busy %v, %v", busy, err)
	}
}

// A static proxy's Get gives every egress address; List gives a summary:
// its address of record, and no egress list to expand.
func TestStaticEgressGetAndList(t *testing.T) {
	now := time.Now()
	d, err := New(Config{Host: "h1", Dir: t.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v6 := make([]netip.Addr, 16)
	for i, a := 0, netip.MustParseAddr("2001:db8:101::10"); i < len(v6); i, a = i+1, a.Next() {
		v6[i] = a
	}
	n := fleet.Network{MAC: "52:54:00:00:00:01", IPv4: netip.MustParseAddr("198.18.101.5"), IPv6: v6}
	if _, err := d.Create(ctx, fleet.Spec{ID: "p1", CommandID: "c1", Network: n}); err != nil {
		t.Fatal(err)
	}
	in, err := d.Get(ctx, "p1")
	if err != nil || in.State != messages.StateRunning || in.IP != "198.18.101.5" || !slices.Equal(in.Egress, n.Egress()) {
		t.Fatalf("get: %+v %v", in, err)
	}
	list, err := d.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "p1" || list[0].IP != "198.18.101.5" || list[0].Egress != nil {
		t.Fatalf("list: %+v %v", list, err)
	}
	v6only := fleet.Network{IPv6: v6}
	if _, err := d.Create(ctx, fleet.Spec{ID: "p2", CommandID: "c2", Network: v6only}); err != nil {
		t.Fatal(err)
	}
	if list, err := d.List(ctx); err != nil || len(list) != 2 || list[1].IP != "2001:db8:101::10" {
		t.Fatalf("list of an IPv6-only proxy: %+v %v", list, err)
	}
}
