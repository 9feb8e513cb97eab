package pool

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"proxyfleet/messages"
)

// The plan is the controller's decision for one pool in one pass, a pure
// function of the pool's record, what is observed of its members (the
// rotation, their last state events, the sites their egress addresses are
// banned on), the hosts' room and the clock. The pass (pass.go) writes
// what it decides and publishes the commands.

// observed is what a pass saw of one member.
type observed struct {
	// in: the member is in the rotation.
	in bool
	// ev is its last state event (nil: none, or not read: a member in
	// the rotation is not read).
	ev *messages.StateEvent
}

// planEnv is what a plan depends on besides the record.
type planEnv struct {
	now time.Time
	obs map[string]observed
	// bans counts, by member id, the distinct sites any of the member's
	// egress addresses is banned for now (nil, or a member absent: none
	// known). Read only for a pool with recycle_after_bans.
	bans map[string]int
	// hosts returns the hosts' room, read once per pass and only if some
	// pool creates.
	hosts func() []hostRoom
	// newID returns a fresh member id suffix; rand a float in [0, 1).
	newID func() string
	rand  func() float64
	// backoffInitial and backoffMax pace creations once a pool's
	// failures reach size+surge.
	backoffInitial, backoffMax time.Duration
}

// answer is a pending command's final answer.
type answer struct {
	p               messages.PoolPending
	outcome, reason string
}

// retirement is a member the plan decided to delete, for the log and the
// metrics; cause is a recycle's (messages.RecycleAge, ...).
type retirement struct {
	id, why, cause, reason string
}

// planned is what a plan decided.
type planned struct {
	rec     messages.PoolRecord
	answers []answer
	retired []retirement
	created []string
	dropped []string
	// burned are the members this pass found burned by their bans.
	burned []string
	// gone: the pool is deleted and has no member left: once its pending
	// commands are answered, its record goes.
	gone bool
	// backingOff: creations wait for the backoff after failures.
	backingOff bool
}

// plan decides one pass for the pool in rec (which it does not change).
func plan(rec *messages.PoolRecord, env planEnv) planned {
	p := planned{rec: cloneRecord(rec)}
	r := &p.rec
	now := env.now
	rt := r.ReadyTimeout.D()
	if rt <= 0 {
		rt = messages.DefaultPoolReadyTimeout
	}

	// What became of each member since the last pass.
	kept := r.Members[:0]
	for _, m := range r.Members {
		o := env.obs[m.ID]
		if m.Retired != nil {
			if retiredGone(r.Name, m, o, now, rt) {
				p.dropped = append(p.dropped, m.ID)
				continue
			}
			kept = append(kept, m)
			continue
		}
		if o.in {
			if m.Ready.IsZero() {
				m.Ready = now
				// A member that enters the rotation ends the failure
				// streak: the spec works.
				r.Failures = 0
			}
			m.Left = time.Time{}
		} else if !m.Ready.IsZero() && m.Left.IsZero() {
			m.Left = now
		}
		kept = append(kept, m)
	}
	r.Members = kept
	for i := range r.Members {
		m := &r.Members[i]
		if m.Retired != nil {
			continue
		}
		if why := broken(r.Name, *m, env.obs[m.ID], now, rt); why != "" {
			p.retire(m, now, messages.RetireBroken, why)
			r.Failures++
			r.LastFailure = now
			r.Reason = m.ID + ": " + why
		}
	}

	if r.Op == messages.OpDelete {
		for i := range r.Members {
			if r.Members[i].Retired == nil {
				p.retire(&r.Members[i], now, messages.RetireDelete, "the pool is deleted")
			}
		}
		p.setState(messages.PoolDeleting, "", now)
		p.gone = len(r.Members) == 0
		p.answer()
		return p
	}

	// Burned: a member whose addresses are banned on recycle_after_bans
	// sites at once is due, and stays due (its record says on how many)
	// whatever becomes of the bans meanwhile.
	if n := r.RecycleAfterBans; n > 0 {
		for i := range r.Members {
			m := &r.Members[i]
			if k := env.bans[m.ID]; m.Retired == nil && m.BannedOn == 0 && k >= n {
				m.BannedOn = k
				p.burned = append(p.burned, m.ID)
			}
		}
	}

	fresh, old := p.split(now)
	size := r.Size
	in := func(m *messages.PoolMember) bool { return env.obs[m.ID].in }
	// Shrink: the fresh members beyond size go, those not in the rotation
	// first, then the oldest.
	if n := len(fresh) - size; n > 0 {
		slices.SortStableFunc(fresh, func(a, b *messages.PoolMember) int {
			if c := cmpBool(in(a), in(b)); c != 0 {
				return c
			}
			return a.Created.Compare(b.Created)
		})
		for _, m := range fresh[:n] {
			p.retire(m, now, messages.RetireShrink, fmt.Sprintf("the pool's size is %d", size))
		}
		fresh = fresh[n:]
	}

	// Recycle, make-before-break: an old member (due for its age, a
	// recycle, a new spec or hosts) is kept while it fills a place no
	// fresh member in the rotation fills yet, and one in the rotation goes
	// only if the rotation keeps min_ready of the pool.
	readyFresh, ready := 0, 0
	for _, m := range fresh {
		if in(m) {
			readyFresh++
		}
	}
	for _, m := range append(slices.Clone(fresh), old...) {
		if in(m) {
			ready++
		}
	}
	keepOld := min(max(size-readyFresh, 0), len(old))
	slices.SortStableFunc(old, func(a, b *messages.PoolMember) int {
		if c := cmpBool(in(a), in(b)); c != 0 {
			return c // those out of the rotation first: they serve nobody
		}
		return a.Deadline(r.MaxAge.D()).Compare(b.Deadline(r.MaxAge.D()))
	})
	drop := len(old) - keepOld
	var stay []*messages.PoolMember
	for _, m := range old {
		if drop == 0 || (in(m) && ready-1 < r.MinReady) {
			stay = append(stay, m)
			continue
		}
		if in(m) {
			ready--
		}
		cause, why := r.DueCause(*m, now)
		p.retireFor(m, now, messages.RetireRecycle, cause, why)
		drop--
	}
	old = stay

	// Create what is missing: up to size fresh members, at most
	// size+surge live ones; while failures keep coming, fewer.
	threshold := size + r.Surge
	need := size - len(fresh)
	n := min(need, threshold-len(fresh)-len(old))
	unproven := 0
	for _, m := range fresh {
		if !in(m) && m.Ready.IsZero() {
			unproven++
		}
	}
	for _, m := range old {
		if !in(m) && m.Ready.IsZero() {
			unproven++
		}
	}
	if r.Failures >= threshold && threshold > 0 {
		p.backingOff = true
		if unproven > 0 || now.Before(r.LastFailure.Add(backoff(r.Failures-threshold, env.backoffInitial, env.backoffMax))) {
			n = 0
		} else {
			n = min(n, 1) // one at a time, to see whether the spec works again
		}
	} else {
		// Creations not yet proven and failures since the last success
		// never exceed size+surge together.
		n = min(n, threshold-r.Failures-unproven)
	}
	noRoom := ""
	if n > 0 {
		var hosts []string
		for _, m := range r.Members {
			if m.Retired == nil {
				hosts = append(hosts, m.Host)
			}
		}
		pl := newPlacer(env.hosts(), hosts, r.Spec.Hosts)
		for range n {
			host, why := pl.place()
			if host == "" {
				noRoom = why
				break
			}
			p.create(host, now, env)
		}
	}

	switch {
	case p.backingOff:
		p.setState(messages.PoolDegraded, r.Reason, now)
	case noRoom != "":
		p.setState(messages.PoolDegraded, noRoom, now)
	case len(old) > 0:
		p.setState(messages.PoolRecycling, "", now)
	case ready < size || len(fresh) != size || need > 0:
		p.setState(messages.PoolFilling, "", now)
	default:
		p.setState(messages.PoolReady, "", now)
	}
	p.answer()
	return p
}

// retiredGone reports whether a retired member is gone: its delete's
// deleted event came, or its delete was stored twice the ready timeout
// ago and it is nowhere to be seen (a lost event: the stored delete is
// carried out whatever becomes of the record).
func retiredGone(pool string, m messages.PoolMember, o observed, now time.Time, rt time.Duration) bool {
	if o.ev != nil && o.ev.State == messages.StateDeleted && o.ev.CommandID == messages.MemberDeleteID(pool, m.ID) {
		return true
	}
	return m.Retired.Published && !o.in && now.Sub(m.Retired.At) >= 2*rt
}

// broken says why a live member is to be replaced, or "".
func broken(pool string, m messages.PoolMember, o observed, now time.Time, rt time.Duration) string {
	if ev := o.ev; ev != nil {
		switch {
		case ev.State == messages.StateFailed && ev.CommandID == messages.MemberCreateID(pool, m.ID):
			if ev.Reason != "" {
				return "failed: " + ev.Reason
			}
			return "failed"
		case ev.State == messages.StateDeleting || ev.State == messages.StateDeleted:
			return "deleted by command " + ev.CommandID + ", not by the pool"
		}
	}
	if o.in {
		return ""
	}
	if m.Ready.IsZero() && now.Sub(m.Created) >= rt {
		return fmt.Sprintf("not in the rotation within ready_timeout %s of its create", rt)
	}
	if !m.Left.IsZero() && now.Sub(m.Left) >= rt {
		return fmt.Sprintf("out of the rotation for ready_timeout %s", rt)
	}
	return ""
}

// backoff is the wait before the next creation after k failures beyond
// the threshold: initial, doubled with each, at most max.
func backoff(k int, initial, maxWait time.Duration) time.Duration {
	d := initial
	for range k {
		if d >= maxWait/2 {
			return maxWait
		}
		d *= 2
	}
	return min(d, maxWait)
}

// split returns the live members: fresh ones and those due for
// recycling (old), as pointers into p.rec.
func (p *planned) split(now time.Time) (fresh, old []*messages.PoolMember) {
	for i := range p.rec.Members {
		m := &p.rec.Members[i]
		switch {
		case m.Retired != nil:
		case func() bool { due, _ := p.rec.Due(*m, now); return due }():
			old = append(old, m)
		default:
			fresh = append(fresh, m)
		}
	}
	return fresh, old
}

func (p *planned) retire(m *messages.PoolMember, now time.Time, why, reason string) {
	p.retireFor(m, now, why, "", reason)
}

// retireFor is retire with a recycle's cause.
func (p *planned) retireFor(m *messages.PoolMember, now time.Time, why, cause, reason string) {
	m.Retired = &messages.PoolRetire{At: now, Why: why, Reason: reason}
	p.retired = append(p.retired, retirement{id: m.ID, why: why, cause: cause, reason: reason})
}

// create adds a member on host, with a fresh id (never one of the
// record's) and its own jitter.
func (p *planned) create(host string, now time.Time, env planEnv) {
	r := &p.rec
	var id string
	for {
		id = r.Name + "-" + env.newID()
		if _, taken := r.Member(id); !taken {
			break
		}
	}
	m := messages.PoolMember{ID: id, Host: host, Created: now, Jitter: env.rand() * messages.PoolJitter, Spec: r.Spec.Hash()}
	i, _ := slices.BinarySearchFunc(r.Members, id, func(m messages.PoolMember, id string) int { return cmp.Compare(m.ID, id) })
	r.Members = slices.Insert(r.Members, i, m)
	p.created = append(p.created, id)
}

func (p *planned) setState(state, reason string, now time.Time) {
	r := &p.rec
	if r.State != state {
		r.State, r.StateSince = state, now
	}
	if reason != "" {
		r.Reason = reason
	}
}

// answer decides the final answer of each pending command that has one
// now: a set or delete that a newer one replaced is superseded; a set is
// done once the pool is ready, failed once it is degraded; a delete is done
// once nothing is left; a recycle once no member it named is left.
func (p *planned) answer() {
	r := &p.rec
	for _, pd := range r.Pending {
		switch pd.Op {
		case messages.OpPoolSet, messages.OpPoolDelete:
			switch {
			case pd.Seq < r.Seq:
				p.answers = append(p.answers, answer{pd, messages.OutcomeSuperseded, fmt.Sprintf("command %s (sequence %d) is newer", r.CommandID, r.Seq)})
			case pd.Op == messages.OpPoolDelete && p.gone:
				p.answers = append(p.answers, answer{pd, messages.OutcomeDone, "every member is deleted"})
			case pd.Op == messages.OpPoolSet && r.State == messages.PoolReady:
				p.answers = append(p.answers, answer{pd, messages.OutcomeDone, fmt.Sprintf("%d members in the rotation", r.Size)})
			case pd.Op == messages.OpPoolSet && r.State == messages.PoolDegraded:
				p.answers = append(p.answers, answer{pd, messages.OutcomeFailed, "degraded: " + r.Reason})
			}
		case messages.OpPoolRecycle:
			named := false
			for _, m := range r.Members {
				named = named || m.Recycle == pd.CommandID
			}
			if !named {
				p.answers = append(p.answers, answer{pd, messages.OutcomeDone, "every member named was replaced"})
			}
		}
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// cloneRecord copies rec deeply enough to change its members and pending
// commands.
func cloneRecord(rec *messages.PoolRecord) messages.PoolRecord {
	r := *rec
	r.Members = slices.Clone(rec.Members)
	for i := range r.Members {
		if rt := r.Members[i].Retired; rt != nil {
			c := *rt
			r.Members[i].Retired = &c
		}
	}
	r.Pending = slices.Clone(rec.Pending)
	return r
}
