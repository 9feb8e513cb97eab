package hostshare

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"time"

	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Sharing hosts over workers. Every worker computes, from the same
// membership (the live, active records of PROXY_WORKERS), the same
// assignment of hosts to workers, and pulls only the hosts assigned to it;
// the pinned consumer of each host still guarantees one owner at a time
// while the workers' views of the membership disagree.

// member is one record of the membership as a watcher of PROXY_WORKERS saw
// it.
type member struct {
	rec messages.WorkerRecord
	// stored is the server's time of the KV entry: the backstop of a
	// record whose own time is wrong (see liveMembers).
	stored time.Time
	// pulls is the set of the hosts the record says it pulls or owns
	// (nil: look in the record).
	pulls map[string]struct{}
	// The record's lists as they were stored (see decode).
	rawHosts, rawPulling, rawOwned []byte
}

// liveMembers returns the records hosts are shared over at now, sorted by
// id: those of active workers whose time (At, the writer's clock) is
// younger than liveness by the view's clock (viewClock): the reader's
// clock, or the newest time the view holds if that is older, so that a
// view that lags (its watch behind a loaded server) ages every record
// alike and counts none dead for its own lag. A record the bucket's TTL
// would have removed (stored longer ago than topology.WorkersTTL) is not live
// whatever its time says: that is the backstop against a writer whose clock
// runs ahead. self, this worker's own record, is always a member (its
// writes may fail while it runs).
func liveMembers(recs map[string]member, self messages.WorkerRecord, now time.Time, liveness time.Duration) []messages.WorkerRecord {
	out := []messages.WorkerRecord{self}
	at := viewClock(recs, now)
	for id, m := range recs {
		switch {
		case id == self.ID, m.rec.State != messages.WorkerActive,
			at.Sub(m.rec.At) >= liveness, now.Sub(m.stored) >= topology.WorkersTTL:
			continue
		}
		out = append(out, m.rec)
	}
	slices.SortFunc(out, func(a, b messages.WorkerRecord) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// viewClock is the time the records are judged at: now, or the newest
// time (At) of an active record of the view if that is older. Every
// worker renews its record every heartbeat, this one's own among them, so
// a view that is up to date holds a record about a heartbeat old and
// judges at about now; one whose watch fell behind (a server too loaded
// to deliver in time) judges at the time it has reached, and one whose
// watch stopped judges at the time it stopped (the membership notices a
// watch that delivers nothing and reads the records again: see run).
// So a view that lags counts nobody dead for its own lag: judged by now
// alone, every worker of a loaded fleet would count the others dead as
// soon as its view lagged by Liveness, and pull every host.
func viewClock(recs map[string]member, now time.Time) time.Time {
	var newest time.Time
	for _, m := range recs {
		if m.rec.State == messages.WorkerActive && m.rec.At.After(newest) {
			newest = m.rec.At
		}
	}
	if newest.IsZero() || newest.After(now) {
		return now
	}
	return newest
}

// weight is the rendezvous weight of worker id for host: the worker with
// the highest weight among those that can execute a host is its first
// choice.
func weight(host, id string) uint64 {
	sum := sha256.Sum256([]byte(host + "\x00" + id))
	return binary.BigEndian.Uint64(sum[:8])
}

// assign shares the hosts the members can execute over them: a rendezvous
// (highest random weight) assignment with bounded load. Pairs of a host and
// a worker that can execute it are taken by decreasing weight, each host
// going to the first worker of its pairs that owns fewer than
// ceil(H/W) hosts (H hosts, W members that execute at least one). When
// every member can execute every host, that bound always leaves room, so
// no worker owns more than ceil(H/W); when some cannot, a host every
// eligible worker of which is full goes to its first choice anyway, so no
// host is left without an owner.
//
// It depends on nothing but the members' ids and hosts, so every worker
// computes the same assignment from the same membership, and a host moves
// only when the membership changes. A worker joining takes only hosts it
// wins (or that full workers shed); a worker leaving frees only its own.
func assign(members []messages.WorkerRecord) map[string]string {
	type pair struct {
		w        uint64
		host, id string
	}
	var pairs []pair
	hosts := map[string]bool{}
	workers := 0
	for _, m := range members {
		if len(m.Hosts) > 0 {
			workers++
		}
		for _, h := range m.Hosts {
			hosts[h] = true
			pairs = append(pairs, pair{weight(h, m.ID), h, m.ID})
		}
	}
	out := make(map[string]string, len(hosts))
	if workers == 0 {
		return out
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		return cmp.Or(cmp.Compare(b.w, a.w), cmp.Compare(a.host, b.host), cmp.Compare(a.id, b.id))
	})
	limit := (len(hosts) + workers - 1) / workers
	load := map[string]int{}
	for _, p := range pairs {
		if _, ok := out[p.host]; !ok && load[p.id] < limit {
			out[p.host] = p.id
			load[p.id]++
		}
	}
	for _, p := range pairs { // hosts only full workers can execute
		if _, ok := out[p.host]; !ok {
			out[p.host] = p.id
			load[p.id]++
		}
	}
	return out
}
