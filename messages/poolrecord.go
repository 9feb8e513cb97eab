package messages

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// The record of a pool, in BucketPools.

// Pool states (PoolRecord.State).
const (
	PoolReady     = "ready"     // size members in the rotation, none due for recycling
	PoolFilling   = "filling"   // members missing from the rotation, being made
	PoolRecycling = "recycling" // old members being replaced, make-before-break
	PoolDegraded  = "degraded"  // creations keep failing (backing off), or no host has room
	PoolDeleting  = "deleting"  // deleted: its members go, then the record
)

// Why a member was retired (PoolRetire.Why).
const (
	RetireBroken  = "broken"  // failed, or out of the rotation for ready_timeout
	RetireRecycle = "recycle" // too old, or recycled on demand: replaced first
	RetireShrink  = "shrink"  // the pool was made smaller
	RetireDelete  = "delete"  // the pool was deleted
)

// PoolRecord is a pool's record, the value of its key (the pool name) in
// BucketPools: the last set (or delete) applied, with its command's
// PROXY_POOLCMDS sequence, and every member the controller made. Every
// writer (the controllers applying commands, the active controller's
// passes) reads it and writes it back with compare-and-set on the key's
// revision, so no write is lost and two controllers can never both add a
// member: a member is in the record before its create is published.
type PoolRecord struct {
	V    int    `json:"v"`
	Name string `json:"name"`
	// Op is "set" or "delete" (deleting: its members go, then the
	// record).
	Op string `json:"op"`
	// Seq and CommandID are the last set's or delete's: a set or delete
	// with a lower PROXY_POOLCMDS sequence is superseded.
	Seq       uint64 `json:"seq"`
	CommandID string `json:"command_id"`
	// Applied is the highest sequence of any command applied (a recycle
	// too), so that a command delivered again is not applied twice.
	Applied  uint64 `json:"applied,omitempty"`
	Size     int    `json:"size"`
	MinReady int    `json:"min_ready"`
	Surge    int    `json:"surge"`
	// MaxAge 0: members are never recycled for their age.
	MaxAge       Duration `json:"max_age"`
	ReadyTimeout Duration `json:"ready_timeout"`
	// RecycleAfterBans 0: members are never recycled for their bans.
	RecycleAfterBans int      `json:"recycle_after_bans,omitempty"`
	Spec             PoolSpec `json:"spec,omitzero"`
	// Members, sorted by id.
	Members []PoolMember `json:"members,omitempty"`
	// Pending are the commands waiting for their final answer: the last
	// set or delete (done when the pool is ready, or gone; failed when it
	// is degraded) and each recycle (done when the members it named are
	// gone).
	Pending []PoolPending `json:"pending,omitempty"`
	// Failures counts members retired broken since a member last entered
	// the rotation: from size+surge on, creations back off (one at a time,
	// after a delay that doubles with each further failure).
	Failures    int       `json:"failures,omitempty"`
	LastFailure time.Time `json:"last_failure,omitzero"`
	// State is what the active controller last made of the pool, since
	// StateSince; Reason says why it is degraded (or was last degraded).
	State      string    `json:"state"`
	StateSince time.Time `json:"state_since,omitzero"`
	Reason     string    `json:"reason,omitempty"`
	At         time.Time `json:"at"`
}

// PoolMember is one member of a pool, recorded before its create is
// published.
type PoolMember struct {
	ID   string `json:"id"`
	Host string `json:"host"`
	// Created is when the controller decided to make it.
	Created time.Time `json:"created"`
	// Jitter is the share of max_age taken off its deadline, in [0,
	// PoolJitter).
	Jitter float64 `json:"jitter,omitempty"`
	// Published says its create is stored in PROXY_CMDS; a member not
	// published is published again (with the same command id, so at most
	// one create ever takes effect).
	Published bool `json:"published,omitempty"`
	// Ready is when it first entered the rotation; Left when it last left
	// it (zero while it is in it).
	Ready time.Time `json:"ready,omitzero"`
	Left  time.Time `json:"left,omitzero"`
	// Recycle is the command id of the pool recycle that marked it (due
	// now, as if it were old).
	Recycle string `json:"recycle,omitempty"`
	// BannedOn is the number of sites its egress addresses were banned on
	// at once when the controller found it burned (at least the pool's
	// recycle_after_bans): due now, as if it were old. 0: not burned.
	BannedOn int `json:"banned_on,omitempty"`
	// Spec is the hash of the spec it was made with (PoolSpec.Hash): a
	// set that changes the spec has the members of the old one replaced,
	// make-before-break.
	Spec string `json:"spec,omitempty"`
	// Retired is set once the controller decided to delete it.
	Retired *PoolRetire `json:"retired,omitempty"`
}

// Causes of a recycle: why a member is due (PoolRecord.DueCause), the
// values of the cause label of the pools' recycles metric.
const (
	RecycleCommand = "command" // named by a pool recycle
	RecycleBans    = "bans"    // its addresses banned on recycle_after_bans sites
	RecycleSpec    = "spec"    // made with another spec
	RecycleHosts   = "hosts"   // on a host spec.hosts no longer names
	RecycleAge     = "age"     // older than max_age
)

// RecycleCauses lists every cause of a recycle, for metrics.
var RecycleCauses = []string{RecycleCommand, RecycleBans, RecycleSpec, RecycleHosts, RecycleAge}

// PoolRetire is a member's deletion: when, why, and whether its delete is
// stored.
type PoolRetire struct {
	At        time.Time `json:"at"`
	Why       string    `json:"why"`
	Reason    string    `json:"reason,omitempty"`
	Published bool      `json:"published,omitempty"`
}

// PoolPending is a command waiting for its final answer.
type PoolPending struct {
	CommandID string `json:"command_id"`
	Op        string `json:"op"`
	Seq       uint64 `json:"seq,omitempty"`
}

// MemberCreateID is the command id (Nats-Msg-Id) of member id's create:
// derived from the id, so a create published again is a duplicate.
func MemberCreateID(pool, id string) string { return "pool/" + pool + "/" + id + "/create" }

// MemberDeleteID is the command id of member id's delete.
func MemberDeleteID(pool, id string) string { return "pool/" + pool + "/" + id + "/delete" }

// Member returns the member id of r, if any.
func (r *PoolRecord) Member(id string) (*PoolMember, bool) {
	i, ok := slices.BinarySearchFunc(r.Members, id, func(m PoolMember, id string) int {
		switch {
		case m.ID < id:
			return -1
		case m.ID > id:
			return 1
		}
		return 0
	})
	if !ok {
		return nil, false
	}
	return &r.Members[i], true
}

// Deadline is when m is due for recycling under maxAge (zero: never).
func (m PoolMember) Deadline(maxAge time.Duration) time.Time {
	if maxAge <= 0 {
		return time.Time{}
	}
	return m.Created.Add(time.Duration(float64(maxAge) * (1 - m.Jitter)))
}

// PoolSummary counts a pool's members as `proxyfleet pool ls` shows them.
type PoolSummary struct {
	Size int `json:"size"`
	// Live are the members not being deleted; Ready those of them in the
	// rotation; Creating those that never were yet; Recycling those due
	// for replacement (old, or named by a recycle); Retiring those being
	// deleted.
	Live      int `json:"live"`
	Ready     int `json:"ready"`
	Creating  int `json:"creating"`
	Recycling int `json:"recycling"`
	// Banned are those of Recycling due for their bans
	// (recycle_after_bans).
	Banned   int `json:"banned"`
	Retiring int `json:"retiring"`
	// Oldest is when the oldest live member was made (zero: none).
	Oldest time.Time `json:"oldest,omitzero"`
}

// Summary counts r's members at now; inRotation says whether a proxy is in
// the rotation.
func (r *PoolRecord) Summary(now time.Time, inRotation func(id string) bool) PoolSummary {
	s := PoolSummary{Size: r.Size}
	for _, m := range r.Members {
		if m.Retired != nil {
			s.Retiring++
			continue
		}
		s.Live++
		in := inRotation(m.ID)
		switch {
		case in:
			s.Ready++
		case m.Ready.IsZero():
			s.Creating++
		}
		switch cause, _ := r.DueCause(m, now); cause {
		case "":
		case RecycleBans:
			s.Banned++
			fallthrough
		default:
			s.Recycling++
		}
		if s.Oldest.IsZero() || m.Created.Before(s.Oldest) {
			s.Oldest = m.Created
		}
	}
	return s
}

// Due reports whether member m of r is due for replacement at now, and
// why (see DueCause).
func (r *PoolRecord) Due(m PoolMember, now time.Time) (bool, string) {
	cause, why := r.DueCause(m, now)
	return cause != "", why
}

// DueCause says why member m of r is due for replacement at now: the
// cause (RecycleCommand, ...; "" when it is not due) and a reason to
// show. In this order: named by a recycle, burned by its bans, made with
// another spec than r's, on a host spec.hosts no longer names, past its
// deadline under max_age.
func (r *PoolRecord) DueCause(m PoolMember, now time.Time) (cause, reason string) {
	switch {
	case m.Recycle != "":
		return RecycleCommand, "recycled by command " + m.Recycle
	case m.BannedOn > 0:
		return RecycleBans, fmt.Sprintf("its addresses are banned on %d sites (recycle_after_bans %d)", m.BannedOn, r.RecycleAfterBans)
	case m.Spec != "" && m.Spec != r.Spec.Hash():
		return RecycleSpec, "made with another spec"
	case len(r.Spec.Hosts) > 0 && !slices.Contains(r.Spec.Hosts, m.Host):
		return RecycleHosts, "its host " + m.Host + " is not in spec.hosts"
	}
	if d := m.Deadline(r.MaxAge.D()); !d.IsZero() && !now.Before(d) {
		return RecycleAge, "older than max_age " + r.MaxAge.D().String()
	}
	return "", ""
}

// Hash identifies what a member is made of (image, sizes, labels; not the
// hosts): a member made with another is replaced.
func (s PoolSpec) Hash() string {
	b, _ := json.Marshal(PoolSpec{Image: s.Image, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB, Labels: s.Labels})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}
