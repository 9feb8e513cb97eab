package health

import (
	"reflect"
	"testing"
	"time"
	"unsafe"

	"proxyfleet/messages"
)

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// step is one input to a fold: an event at the fold clock's time t0+after,
// or a Tick at that time.
type step struct {
	after   time.Duration
	ev      messages.StateEvent
	tick    bool
	changed bool
}

func ev(id string, seq uint64, state, ip string) messages.StateEvent {
	e := messages.StateEvent{V: 1, ID: id, State: state, Host: "h1", IP: ip, Seq: seq}
	if ip != "" {
		e.Port = 3128
	}
	return e
}

func at(e messages.StateEvent, d time.Duration) messages.StateEvent { e.At = t0.Add(d); return e }

func entry(id, addr string, since time.Duration) messages.RotationEntry {
	return messages.RotationEntry{ID: id, Addr: addr, Host: "h1", Since: t0.Add(since)}
}

func TestFold(t *testing.T) {
	const (
		prov    = messages.StateProvisioning
		running = messages.StateRunning
		failed  = messages.StateFailed
		delng   = messages.StateDeleting
		deleted = messages.StateDeleted
		s       = time.Second
	)
	cases := []struct {
		name    string
		grace   time.Duration
		steps   []step
		want    []messages.RotationEntry
		ignored uint64
	}{{
		name: "rise into rotation",
		steps: []step{
			{0, at(ev("p1", 1, prov, ""), 0), false, false},
			{1 * s, at(ev("p1", 2, running, "198.18.100.1"), 1*s), false, true},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 1*s)},
	}, {
		name: "running again with the same address is no change and keeps since",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{5 * s, at(ev("p1", 3, running, "198.18.100.1"), 5*s), false, false},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 0)},
	}, {
		name: "running without an IP does not enter",
		steps: []step{
			{0, at(ev("p1", 2, running, ""), 0), false, false},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "failed removes",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 3, failed, ""), 1*s), false, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "deleting removes",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 3, delng, "198.18.100.1"), 1*s), false, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "deleted removes and its tombstone ignores a late running",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 4, deleted, ""), 1*s), false, true},
			{2 * s, at(ev("p1", 3, running, "198.18.100.1"), 0), false, false},
		},
		want:    []messages.RotationEntry{},
		ignored: 1,
	}, {
		name: "a newer create after deleted comes back",
		steps: []step{
			{0, at(ev("p1", 4, deleted, ""), 0), false, false},
			{1 * s, at(ev("p1", 9, running, "198.18.100.7"), 1*s), false, true},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.7:3128", 1*s)},
	}, {
		name: "duplicate and older events are ignored",
		steps: []step{
			{0, at(ev("p1", 5, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 5, failed, ""), 1*s), false, false},
			{2 * s, at(ev("p1", 4, delng, ""), 2*s), false, false},
			{3 * s, at(ev("p1", 1, prov, ""), 3*s), false, false},
		},
		want:    []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 0)},
		ignored: 3,
	}, {
		name: "out of order across proxies: each id has its own seq",
		steps: []step{
			{0, at(ev("p2", 7, running, "198.18.100.2"), 0), false, true},
			{0, at(ev("p1", 3, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 2, failed, ""), 1*s), false, false},
		},
		want:    []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 0), entry("p2", "198.18.100.2:3128", 0)},
		ignored: 1,
	}, {
		name: "IP change moves the entry",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{3 * s, at(ev("p1", 3, running, "198.18.100.9"), 3*s), false, true},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.9:3128", 3*s)},
	}, {
		name: "unknown state, wrong version, missing id are ignored",
		steps: []step{
			{0, at(ev("p1", 2, "exploded", "198.18.100.1"), 0), false, false},
			{0, func() messages.StateEvent { e := ev("p1", 3, running, "198.18.100.1"); e.V = 2; return e }(), false, false},
			{0, ev("", 3, running, "198.18.100.1"), false, false},
		},
		want:    []messages.RotationEntry{},
		ignored: 3,
	}, {
		name: "no grace: provisioning without IP demotes at once",
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{1 * s, at(ev("p1", 3, prov, ""), 1*s), false, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name:  "grace: keeps address and place, then Tick demotes",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{10 * s, at(ev("p1", 3, prov, ""), 10*s), false, false},
			{20 * s, at(ev("p1", 4, prov, ""), 20*s), false, false}, // does not extend the grace
			{39 * s, messages.StateEvent{}, true, false},
			{40 * s, messages.StateEvent{}, true, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name:  "grace: running again in time keeps since and ends the grace",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{10 * s, at(ev("p1", 3, prov, ""), 10*s), false, false},
			{15 * s, at(ev("p1", 4, running, "198.18.100.1"), 15*s), false, false},
			{60 * s, messages.StateEvent{}, true, false},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 0)},
	}, {
		name:  "grace: one proxy's timeout never drops another",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{0, at(ev("p2", 2, running, "198.18.100.2"), 0), false, true},
			{10 * s, at(ev("p1", 3, prov, ""), 10*s), false, false},
			{20 * s, at(ev("p2", 3, prov, ""), 20*s), false, false},
			{40 * s, messages.StateEvent{}, true, true},
			{45 * s, at(ev("p2", 4, running, "198.18.100.2"), 45*s), false, false},
			{90 * s, messages.StateEvent{}, true, false},
		},
		want: []messages.RotationEntry{entry("p2", "198.18.100.2:3128", 0)},
	}, {
		name:  "grace: an event seen after its grace has passed demotes at once",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{50 * s, at(ev("p1", 3, prov, ""), 10*s), false, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name:  "grace: failed during grace removes at once",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 2, running, "198.18.100.1"), 0), false, true},
			{10 * s, at(ev("p1", 3, prov, ""), 10*s), false, false},
			{11 * s, at(ev("p1", 4, failed, ""), 11*s), false, true},
		},
		want: []messages.RotationEntry{},
	}, {
		name:  "grace: a provisioning for a proxy not in the rotation changes nothing",
		grace: 30 * s,
		steps: []step{
			{0, at(ev("p1", 1, prov, ""), 0), false, false},
			{60 * s, messages.StateEvent{}, true, false},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "an event time in the future is bounded by the clock",
		steps: []step{
			{1 * s, at(ev("p1", 2, running, "198.18.100.1"), time.Hour), false, true},
		},
		want: []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 1*s)},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			f := NewFold(tc.grace, func() time.Time { return now })
			for i, st := range tc.steps {
				now = t0.Add(st.after)
				var got bool
				if st.tick {
					got = f.Tick(now)
				} else {
					got = f.Apply(st.ev)
				}
				if got != st.changed {
					t.Fatalf("step %d (%+v): changed = %v, want %v", i, st, got, st.changed)
				}
			}
			snap := f.Snapshot()
			if !reflect.DeepEqual(snap, tc.want) {
				t.Fatalf("snapshot = %+v\nwant       %+v", snap, tc.want)
			}
			if f.Len() != len(tc.want) {
				t.Fatalf("Len = %d, want %d", f.Len(), len(tc.want))
			}
			if st := f.Stats(); st.Ignored != tc.ignored {
				t.Fatalf("ignored = %d, want %d", st.Ignored, tc.ignored)
			}
		})
	}
}

func TestFoldGraceKeepsAddressAndDeadline(t *testing.T) {
	now := t0
	f := NewFold(30*time.Second, func() time.Time { return now })
	f.Apply(at(ev("p1", 2, messages.StateRunning, "198.18.100.1"), 0))
	if _, ok := f.NextDeadline(); ok {
		t.Fatal("deadline with no grace running")
	}
	now = t0.Add(10 * time.Second)
	f.Apply(at(ev("p1", 3, messages.StateProvisioning, ""), 10*time.Second))
	if !f.InGrace("p1") {
		t.Fatal("p1 not in grace")
	}
	d, ok := f.NextDeadline()
	if !ok || !d.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("NextDeadline = %v %v, want %v", d, ok, t0.Add(40*time.Second))
	}
	want := []messages.RotationEntry{entry("p1", "198.18.100.1:3128", 0)}
	if got := f.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("in grace: snapshot = %+v, want %+v", got, want)
	}
}

func TestFoldSnapshotSortedAndNeverNil(t *testing.T) {
	f := NewFold(0, func() time.Time { return t0 })
	if s := f.Snapshot(); s == nil || len(s) != 0 {
		t.Fatalf("empty snapshot = %#v", s)
	}
	for i, id := range []string{"p3", "p1", "p2"} {
		f.Apply(at(ev(id, 1, messages.StateRunning, "198.18.100."+string(rune('1'+i))), 0))
	}
	var ids []string
	for _, e := range f.Snapshot() {
		ids = append(ids, e.ID)
	}
	if !reflect.DeepEqual(ids, []string{"p1", "p2", "p3"}) {
		t.Fatalf("ids = %v", ids)
	}
}

func TestAddrIPv6(t *testing.T) {
	if got := Addr("fd00::1", 3128); got != "[fd00::1]:3128" {
		t.Fatalf("Addr = %q", got)
	}
}

// cmdEv is ev from command cmd on host.
func cmdEv(id string, seq uint64, state, ip, host, cmd string) messages.StateEvent {
	e := ev(id, seq, state, ip)
	e.Host, e.CommandID = host, cmd
	return e
}

// The agent-restart grace belongs to the command and host that put the
// proxy in the rotation: a provisioning (or address-less running) from
// another command or another host is a new proxy in the making (a
// re-create, a spec change, a move), and the old address leaves at once.
func TestFoldGraceOnlyForTheSameCommandAndHost(t *testing.T) {
	const (
		grace = 30 * time.Second
		s     = time.Second
		ip    = "198.18.100.1"
		addr  = "198.18.100.1:3128"
	)
	type in struct {
		after   time.Duration
		ev      messages.StateEvent
		changed bool
	}
	cases := []struct {
		name    string
		steps   []in
		inGrace bool
		want    []messages.RotationEntry
	}{{
		name: "same command and host: kept on grace",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{10 * s, cmdEv("p1", 3, prov, "", "h1", "c1"), false},
			{20 * s, cmdEv("p1", 4, prov, "", "h1", "c1"), false},
		},
		inGrace: true,
		want:    []messages.RotationEntry{entry("p1", addr, 0)},
	}, {
		name: "a new command's provisioning: out at once",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{10 * s, cmdEv("p1", 3, prov, "", "h1", "c2"), true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "a new command's address-less running: out at once",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{10 * s, cmdEv("p1", 3, running, "", "h1", "c2"), true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "another host's provisioning: out at once",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{10 * s, cmdEv("p1", 3, prov, "", "h2", "c1"), true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "on grace, then a new command: out at once, not at the grace's end",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{10 * s, cmdEv("p1", 3, prov, "", "h1", "c1"), false},
			{11 * s, cmdEv("p1", 4, prov, "", "h1", "c2"), true},
		},
		want: []messages.RotationEntry{},
	}, {
		name: "a retried create that finds it running takes the grace over",
		steps: []in{
			{0, cmdEv("p1", 2, running, ip, "h1", "c1"), true},
			{5 * s, cmdEv("p1", 3, running, ip, "h1", "c2"), false},
			{10 * s, cmdEv("p1", 4, prov, "", "h1", "c2"), false},
		},
		inGrace: true,
		want:    []messages.RotationEntry{entry("p1", addr, 0)},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			f := NewFold(grace, func() time.Time { return now })
			for i, st := range tc.steps {
				now = t0.Add(st.after)
				if got := f.Apply(at(st.ev, st.after)); got != st.changed {
					t.Fatalf("step %d (%s %s %s on %s): changed = %v, want %v", i, st.ev.State, st.ev.IP, st.ev.CommandID, st.ev.Host, got, st.changed)
				}
			}
			if got := f.Snapshot(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("snapshot = %+v\nwant       %+v", got, tc.want)
			}
			if f.InGrace("p1") != tc.inGrace {
				t.Fatalf("in grace = %v, want %v", f.InGrace("p1"), tc.inGrace)
			}
			if _, ok := f.NextDeadline(); ok != tc.inGrace {
				t.Fatalf("a grace deadline = %v, want %v", ok, tc.inGrace)
			}
			if !tc.inGrace && len(f.Targets()) != 0 {
				t.Fatalf("still probed: %+v", f.Targets())
			}
		})
	}
}

// A proxy loaded from PROXY_ROTATION has no known command or host: a
// provisioning from any command starts its grace (the first event names
// them).
func TestFoldSeededProxyGraceWithUnknownCommand(t *testing.T) {
	now := t0
	f := NewFold(30*time.Second, func() time.Time { return now })
	f.Seed("p1", "198.18.100.1:3128", now)
	if f.Apply(cmdEv("p1", 5, messages.StateProvisioning, "", "h1", "c9")) {
		t.Fatal("a seeded proxy's provisioning took it out")
	}
	if !f.InGrace("p1") {
		t.Fatal("the seeded proxy is not on grace")
	}
	// From now on the command is known: another one takes it out.
	now = t0.Add(time.Second)
	if !f.Apply(cmdEv("p1", 6, messages.StateProvisioning, "", "h1", "c10")) || f.Len() != 0 {
		t.Fatal("a new command's provisioning left the seeded proxy in")
	}
}

// A proxy's labels come from its events into the snapshot; new labels on
// a proxy in the rotation (same address) change the snapshot, the same
// ones do not.
func TestFoldCarriesLabels(t *testing.T) {
	f := NewFold(0, func() time.Time { return t0 })
	e := at(ev("p1", 1, messages.StateRunning, "198.18.0.10"), 0)
	e.Labels = map[string]string{"pool": "eu"}
	if !f.Apply(e) {
		t.Fatal("running did not enter")
	}
	if got := f.Snapshot()[0].Labels; !reflect.DeepEqual(got, map[string]string{"pool": "eu"}) {
		t.Fatalf("labels %v, want pool=eu", got)
	}
	e.Seq = 2
	if f.Apply(e) {
		t.Fatal("the same labels again changed the rotation")
	}
	e.Seq, e.Labels = 3, map[string]string{"pool": "us"}
	if !f.Apply(e) {
		t.Fatal("new labels did not change the rotation")
	}
	if got := f.Snapshot()[0].Labels; got["pool"] != "us" {
		t.Fatalf("labels %v, want pool=us", got)
	}
}

// A proxy's egress addresses come from its running events into the
// snapshot; new ones on a proxy in the rotation change it, the same ones
// do not, and a provisioning event (an agent restart) keeps them.
func TestFoldCarriesEgressAddrs(t *testing.T) {
	f := NewFold(0, func() time.Time { return t0 })
	e := at(ev("p1", 1, messages.StateRunning, "198.18.101.5"), 0)
	e.Egress = []string{"198.18.101.5", "2001:db8:101::10/124"}
	if !f.Apply(e) {
		t.Fatal("running did not enter")
	}
	if got := f.Snapshot()[0].EgressAddrs; !reflect.DeepEqual(got, e.Egress) {
		t.Fatalf("egress %v, want %v", got, e.Egress)
	}
	e.Seq = 2
	if f.Apply(e) {
		t.Fatal("the same egress again changed the rotation")
	}
	e.Seq, e.Egress = 3, []string{"198.18.101.5", "2001:db8:101::20/124"}
	if !f.Apply(e) {
		t.Fatal("new egress did not change the rotation")
	}
	if got := f.Snapshot()[0].EgressAddrs; got[1] != "2001:db8:101::20/124" {
		t.Fatalf("egress %v", got)
	}
}

// The fold keeps a proxyState for every proxy of the fleet: it must stay
// within the allocator's 384-byte class on 64-bit platforms (fields that
// padding would grow, and findings nearly every proxy lacks, are where
// they cost nothing).
func TestProxyStateSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes for 64-bit platforms")
	}
	if n := unsafe.Sizeof(proxyState{}); n > 384 {
		t.Errorf("proxyState is %d bytes, more than 384", n)
	}
}
