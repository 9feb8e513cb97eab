package worker_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

const reasonRedrive = "re-creating: domain gone"

// TestObservationReDrivesAProxyWhoseDomainIsGone: a running proxy's domain
// destroyed and undefined behind the system's back (the sim's domain file
// removed; its volume stays) is made again through a work item, with
// provisioning events saying why, and runs again for the same command;
// one disappearance makes one re-drive. Also when an observation pass saw
// the domain shut off (and reported it failed) before it was undefined.
func TestObservationReDrivesAProxyWhoseDomainIsGone(t *testing.T) {
	for _, shutOffFirst := range []bool{false, true} {
		name := "undefined"
		if shutOffFirst {
			name = "shut off, then undefined"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t, "h1")
			w := r.startWorker(func(c *worker.Config) { c.ObserveInterval = 100 * time.Millisecond })
			r.create("p1", "c1", "")
			r.create("p2", "c2", "")
			r.waitOutcome("c1", messages.OutcomeDone)
			r.waitOutcome("c2", messages.OutcomeDone)
			before, _ := r.lastEvent("p1")
			neighbour, _ := r.lastEvent("p2")

			if shutOffFirst {
				d, err := sim.New(sim.Config{Host: "h1", Dir: r.hostDir("h1")})
				if err != nil {
					t.Fatal(err)
				}
				if err := d.Stop("p1"); err != nil {
					t.Fatal(err)
				}
				r.waitFor("p1 failed", 10*time.Second, func() bool {
					ev, _ := r.lastEvent("p1")
					return ev.State == messages.StateFailed
				})
			}
			if err := os.Remove(filepath.Join(r.hostDir("h1"), "domains", "p1.json")); err != nil {
				t.Fatal(err)
			}
			r.waitFor("p1 running again", 10*time.Second, func() bool {
				ev, _ := r.lastEvent("p1")
				return ev.State == messages.StateRunning && ev.Seq > before.Seq
			})
			ev, _ := r.lastEvent("p1")
			if ev.CommandID != "c1" || ev.Host != "h1" || ev.IP != before.IP {
				t.Errorf("running again as %+v, want command c1 on h1 at %s", ev, before.IP)
			}
			if !r.domainExists("h1", "p1") {
				t.Error("no domain after the re-drive")
			}
			r.mu.Lock()
			var after []messages.StateEvent
			for _, e := range r.events["p1"] {
				switch {
				case e.Seq <= before.Seq:
				case e.State != messages.StateFailed:
					after = append(after, e)
				case !shutOffFirst:
					t.Errorf("reported failed although it is wanted running: %+v", e)
				}
			}
			r.mu.Unlock()
			if len(after) < 2 || after[0].State != messages.StateProvisioning || after[0].Reason != reasonRedrive {
				t.Fatalf("events after the domain went: %+v, want provisioning %q first", after, reasonRedrive)
			}
			for _, e := range after {
				if e.State == messages.StateProvisioning && e.Reason != reasonRedrive {
					t.Errorf("a provisioning event of the re-drive says %q, want %q", e.Reason, reasonRedrive)
				}
			}
			if n := len(readLines(filepath.Join(r.hostDir("h1"), "creates.log"))) / 2; n != 3 {
				t.Errorf("creates.log has %d creates, want p1, p2 and p1's re-create", n)
			}
			if n := w.Stats().Snapshot()["redriven"]; n != 1 {
				t.Errorf("redriven = %d, want 1", n)
			}
			if ev2, _ := r.lastEvent("p2"); ev2.Seq != neighbour.Seq {
				t.Errorf("neighbour p2 changed: %+v after %+v", ev2, neighbour)
			}
		})
	}
}

// TestVolumeSweepRemovesOldOrphansOnly: the host's observation pass removes
// a volume with no domain older than the grace; it leaves a fresh one, one
// whose id is wanted on this host (its create failed: a new command's
// converge deals with it), a running proxy's, and files that are not
// volumes of ours. A proxy whose create failed is not re-driven.
func TestVolumeSweepRemovesOldOrphansOnly(t *testing.T) {
	r := newRig(t, "h1")
	dir := r.hostDir("h1")
	// A create that failed for good: desired is a create on h1.
	w1 := r.startWorker()
	if err := sim.InjectFault(dir, sim.Fault{Op: "create", ID: "wanted", Class: fleet.ClassPermanent, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r.create("wanted", "w1", "")
	r.create("runs", "r1", "")
	r.waitOutcome("w1", messages.OutcomeFailed)
	r.waitOutcome("r1", messages.OutcomeDone)
	if err := r.stopWorker(w1); err != nil {
		t.Fatal(err)
	}
	failed, _ := r.lastEvent("wanted")

	old := time.Now().Add(-time.Hour)
	plant := func(name string, mtime time.Time) string {
		t.Helper()
		p := filepath.Join(dir, "volumes", name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	orphan := plant("orphan.disk", old)
	keep := []string{
		plant("fresh.disk", time.Now()),
		plant("wanted.disk", old),
		plant("Not_Ours.disk", old),
		plant("notes.txt", old),
	}
	runs := filepath.Join(dir, "volumes", "runs.disk")
	if err := os.Chtimes(runs, old, old); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, runs)

	w := r.startWorker(func(c *worker.Config) {
		c.ObserveInterval = 100 * time.Millisecond
		c.SweepGrace = time.Minute
	})
	r.waitFor("a volume sweep", 10*time.Second, func() bool { return w.Stats().Snapshot()["volumes_swept"] > 0 })
	if _, err := os.Stat(orphan); err == nil {
		t.Error("the old orphan is still there")
	}
	for _, p := range keep {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("swept what it must keep: %v", err)
		}
	}
	st := w.Stats().Snapshot()
	if st["volumes_swept"] != 1 || st["redriven"] != 0 {
		t.Errorf("stats %v, want volumes_swept 1 and redriven 0", st)
	}
	if ev, _ := r.lastEvent("wanted"); ev.Seq != failed.Seq {
		t.Errorf("the failed create was looked at again: %+v after %+v", ev, failed)
	}
}
