package pool

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/lease"
	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// A pass of the active controller, pool by pool: observe the members
// (the rotation, and the last state event of each member not in it),
// plan, write the record with compare-and-set (a new member is in the
// record before its create is published), publish the creates and
// deletes not yet stored and the final answers due, and write the record
// again to say so. A publish that fails, or a controller that dies before
// the second write, leaves the command unpublished in the record: the
// next pass (of this controller or of the one that takes over) publishes
// it again with the same Nats-Msg-Id, which JetStream (within its dedupe
// window) or intake (after it, by PROXY_CMDIDS) takes as a duplicate: at
// most one create per member ever takes effect.

// errConflict says a pool's record changed under the pass: it is read
// again and planned anew.
var errConflict = errors.New("the pool's record changed meanwhile")

// pass runs one pass over every pool, while the lease is valid.
func (c *Controller) pass(ctx context.Context, l *lease.Lease) {
	var hosts []hostRoom
	read := false
	hostsOnce := func() []hostRoom {
		if !read {
			hosts, read = c.readHosts(ctx), true
		}
		return hosts
	}
	var banned map[netip.Addr][]string
	bansRead := false
	bansOnce := func() map[netip.Addr][]string {
		if !bansRead {
			banned, bansRead = c.bannedSites(), true
		}
		return banned
	}
	pools := c.snapshot()
	slices.SortFunc(pools, func(a, b entry) int { return cmp.Compare(a.rec.Name, b.rec.Name) })
	for _, e := range pools {
		if !l.Valid() || ctx.Err() != nil {
			return
		}
		created, err := c.passPool(ctx, l, e, hostsOnce, bansOnce)
		switch {
		case errors.Is(err, errConflict):
			c.refresh(ctx, e.rec.Name)
			c.poke()
		case err != nil && ctx.Err() == nil:
			c.log.Warn("pool pass", "pool", e.rec.Name, "err", err)
		}
		// The next pool's placement counts this one's new members.
		for _, h := range created {
			for i := range hosts {
				if hosts[i].name == h {
					hosts[i].used++
				}
			}
		}
	}
}

// passPool runs the pass of one pool and returns the hosts of the members
// it made; banned gives the bans (bannedSites), read once per pass and
// only for a pool with recycle_after_bans.
func (c *Controller) passPool(ctx context.Context, l *lease.Lease, e entry, hosts func() []hostRoom, banned func() map[netip.Addr][]string) ([]string, error) {
	before := e.rec
	now := c.cfg.Now()
	var counts map[string]int
	if before.RecycleAfterBans > 0 && before.Op != messages.OpDelete {
		counts = c.banCounts(&before, banned())
	}
	p := plan(&before, planEnv{
		now: now, obs: c.observe(ctx, &before), bans: counts, hosts: hosts, newID: c.newSuffix, rand: c.cfg.Rand,
		backoffInitial: c.cfg.BackoffInitial, backoffMax: c.cfg.BackoffMax,
	})
	rec, rev := &p.rec, e.rev
	if !sameRecord(&before, rec) {
		if !l.Valid() {
			return nil, nil
		}
		var err error
		if rev, err = c.write(ctx, rec, rev, now); err != nil {
			return nil, err
		}
		c.report(&before, &p)
		c.hook("after-intent", rec.Name, p.created)
	}
	var createdOn []string
	for _, id := range p.created {
		if m, ok := rec.Member(id); ok {
			createdOn = append(createdOn, m.Host)
		}
	}

	// Publish what the record holds and JetStream may not yet.
	flags := false
	for i := range rec.Members {
		if !l.Valid() || c.nc.IsClosed() || ctx.Err() != nil {
			break
		}
		m := &rec.Members[i]
		switch {
		case m.Retired == nil && !m.Published:
			if err := c.publishCreate(ctx, rec, m); err != nil {
				c.log.Warn("publish a pool member's create (published again next pass)", "pool", rec.Name, "id", m.ID, "err", err)
				continue
			}
			m.Published, flags = true, true
		case m.Retired != nil && !m.Retired.Published:
			if err := c.publishDelete(ctx, rec, m); err != nil {
				c.log.Warn("publish a pool member's delete (published again next pass)", "pool", rec.Name, "id", m.ID, "err", err)
				continue
			}
			m.Retired.Published, flags = true, true
		}
	}
	c.hook("after-publish", rec.Name, p.created)
	if p.gone {
		return createdOn, c.gone(ctx, rec, rev, p.answers, now)
	}
	for _, a := range p.answers {
		if err := c.answer(ctx, rec.Name, a.p, a.outcome, a.reason, now); err != nil {
			c.log.Warn("answer a pool command (answered again next pass)", "pool", rec.Name, "command", a.p.CommandID, "err", err)
			continue
		}
		rec.Pending = slices.DeleteFunc(rec.Pending, func(pd messages.PoolPending) bool { return pd.CommandID == a.p.CommandID })
		flags = true
	}
	if flags && l.Valid() {
		if _, err := c.write(ctx, rec, rev, now); err != nil {
			return createdOn, err
		}
	}
	return createdOn, nil
}

// gone deletes the record of a deleted pool none of whose members is left,
// then gives its pending commands their answers: a delete answered done
// finds the record gone. (An answer lost to a crash here is not given
// again: the client's wait ends on its deadline, and `pool get` says the
// pool is gone.)
func (c *Controller) gone(ctx context.Context, rec *messages.PoolRecord, rev uint64, answers []answer, now time.Time) error {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := c.pools.Delete(octx, rec.Name, jetstream.LastRevision(rev)); err != nil {
		if isConflict(err) {
			return errConflict
		}
		return fmt.Errorf("delete the record of pool %s: %w", rec.Name, err)
	}
	c.stored(rec.Name, nil, rev+1)
	c.log.Info("pool deleted: every member is gone", "pool", rec.Name)
	for _, a := range answers {
		var err error
		for range 3 {
			if err = c.answer(ctx, rec.Name, a.p, a.outcome, a.reason, now); err == nil {
				break
			}
		}
		if err != nil {
			c.log.Error("answer a pool command (its record is gone: not answered again)", "pool", rec.Name, "command", a.p.CommandID, "err", err)
		}
	}
	return nil
}

// hook calls Config.Hook at point, if a pass made members.
func (c *Controller) hook(point, pool string, created []string) {
	if c.cfg.Hook != nil && len(created) > 0 {
		c.cfg.Hook(point, pool, created)
	}
}

// observe reads what the plan needs of rec's members: whether each is in
// the rotation, and the last state event of those that are not (and of
// those being deleted).
func (c *Controller) observe(ctx context.Context, rec *messages.PoolRecord) map[string]observed {
	obs := make(map[string]observed, len(rec.Members))
	for _, m := range rec.Members {
		_, in := c.rot.Get(m.ID)
		o := observed{in: in}
		if !in || m.Retired != nil {
			o.ev = c.lastEvent(ctx, m.ID)
		}
		obs[m.ID] = o
	}
	return obs
}

// bannedSites is every ban the rotation follows from PROXY_BANS (package
// rotation keeps them in a bans.Set): the sites each address is banned
// for now.
func (c *Controller) bannedSites() map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	c.rot.EachBan(func(a netip.Addr, site string) { out[a] = append(out[a], site) })
	return out
}

// banCounts counts, for each live member of rec in the rotation, the
// distinct sites its egress addresses are banned for (sitesOf); members
// banned nowhere are absent.
func (c *Controller) banCounts(rec *messages.PoolRecord, banned map[netip.Addr][]string) map[string]int {
	if len(banned) == 0 {
		return nil
	}
	counts := map[string]int{}
	for _, m := range rec.Members {
		if m.Retired != nil {
			continue
		}
		if p, ok := c.rot.Get(m.ID); ok {
			if n := sitesOf(p, banned); n > 0 {
				counts[m.ID] = n
			}
		}
	}
	return counts
}

// sitesOf counts the distinct sites any egress address of p is banned
// for: the addresses its host's plan gave it, and the one health saw it
// leave from (a proxy without a plan has only that one).
func sitesOf(p rotation.Proxy, banned map[netip.Addr][]string) int {
	addrs := p.EgressAddrs
	if a, err := netip.ParseAddr(p.Egress); err == nil && !slices.Contains(addrs, a.Unmap()) {
		addrs = append(slices.Clip(addrs), a.Unmap())
	}
	sites := map[string]bool{}
	for _, a := range addrs {
		for _, s := range banned[a.Unmap()] {
			sites[s] = true
		}
	}
	return len(sites)
}

// lastEvent is id's last state event, nil if it has none or it could not
// be read (a read error proves nothing: the plan acts only on events it
// has, and on time).
func (c *Controller) lastEvent(ctx context.Context, id string) *messages.StateEvent {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	raw, err := c.events.GetLastMsgForSubject(octx, c.subj.State(id))
	if err != nil {
		if !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil {
			c.log.Debug("read a member's last event", "id", id, "err", err)
		}
		return nil
	}
	var ev messages.StateEvent
	if json.Unmarshal(raw.Data, &ev) != nil || ev.ID != id {
		return nil
	}
	return &ev
}

// readHosts reads the room of every configured host.
func (c *Controller) readHosts(ctx context.Context) []hostRoom {
	out := make([]hostRoom, 0, len(c.cfg.Hosts))
	if c.hosts == nil {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		c.hosts, _ = c.js.KeyValue(octx, messages.BucketHosts)
		cancel()
	}
	for _, h := range c.cfg.Hosts {
		hr := hostRoom{name: h.Name, max: h.MaxProxies}
		if c.hosts != nil {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			e, err := c.hosts.Get(octx, h.Name)
			cancel()
			var rec messages.HostRecord
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				hr.unknown = true
			case json.Unmarshal(e.Value(), &rec) != nil:
				hr.unknown = true
			default:
				hr.used, hr.quarantined = len(rec.Proxies), rec.Quarantined()
				if rec.MaxProxies > 0 {
					hr.max = rec.MaxProxies
				}
			}
		}
		out = append(out, hr)
	}
	return out
}

// newSuffix is a member id's random part: PoolSuffixLen lowercase letters
// and digits.
func (c *Controller) newSuffix() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, messages.PoolSuffixLen)
	for i := range b {
		b[i] = alphabet[int(c.cfg.Rand()*float64(len(alphabet)))%len(alphabet)]
	}
	return string(b)
}

// write stores rec over revision rev with compare-and-set and returns the
// new revision; a lost race is errConflict.
func (c *Controller) write(ctx context.Context, rec *messages.PoolRecord, rev uint64, now time.Time) (uint64, error) {
	rec.At = now.UTC()
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	nrev, err := c.pools.Update(octx, rec.Name, b, rev)
	if err != nil {
		if isConflict(err) {
			return 0, errConflict
		}
		return 0, fmt.Errorf("write the record of pool %s: %w", rec.Name, err)
	}
	c.stored(rec.Name, rec, nrev)
	return nrev, nil
}

// refresh reads a pool's record into the view after a lost race.
func (c *Controller) refresh(ctx context.Context, name string) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := c.pools.Get(octx, name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		c.mu.Lock()
		if cur, ok := c.view[name]; ok {
			c.view[name] = entry{rev: cur.rev, gone: true}
		}
		c.mu.Unlock()
	case err != nil:
		c.log.Warn("read a pool's record again", "pool", name, "err", err)
	default:
		c.apply(e)
	}
}

func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// sameRecord reports whether a and b would be stored alike (their At
// aside).
func sameRecord(a, b *messages.PoolRecord) bool {
	x, y := *a, *b
	x.At, y.At = time.Time{}, time.Time{}
	bx, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return bytes.Equal(bx, by)
}

// publishCreate publishes member m's create: the pool's spec, its host,
// the pool's label, and a command id derived from the member.
func (c *Controller) publishCreate(ctx context.Context, rec *messages.PoolRecord, m *messages.PoolMember) error {
	labels := maps.Clone(rec.Spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[messages.PoolLabel] = rec.Name
	body, err := json.Marshal(messages.CreateCommand{V: messages.Version, ID: m.ID, Host: m.Host, Image: rec.Spec.Image,
		CPUs: rec.Spec.CPUs, MemoryMiB: rec.Spec.MemoryMiB, Labels: labels})
	if err != nil {
		return err
	}
	if err := c.publishCommand(ctx, c.subj.Create(m.ID), body, messages.MemberCreateID(rec.Name, m.ID)); err != nil {
		return err
	}
	c.metrics.created(rec.Name)
	return nil
}

// publishDelete publishes member m's delete.
func (c *Controller) publishDelete(ctx context.Context, rec *messages.PoolRecord, m *messages.PoolMember) error {
	body, err := json.Marshal(messages.DeleteCommand{V: messages.Version, ID: m.ID})
	if err != nil {
		return err
	}
	if err := c.publishCommand(ctx, c.subj.Delete(m.ID), body, messages.MemberDeleteID(rec.Name, m.ID)); err != nil {
		return err
	}
	c.metrics.deleted(rec.Name, m.Retired.Why)
	return nil
}

func (c *Controller) publishCommand(ctx context.Context, subject string, body []byte, cmdID string) error {
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, cmdID)
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := c.js.PublishMsg(octx, msg, jetstream.WithExpectStream(messages.StreamCommands)); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// answer publishes a pool command's answer on <prefix>.result.pool.<name>;
// the message id makes the same answer given again a duplicate.
func (c *Controller) answer(ctx context.Context, name string, pd messages.PoolPending, outcome, reason string, now time.Time) error {
	r := messages.Result{V: messages.Version, ID: name, CommandID: pd.CommandID, Op: pd.Op, Outcome: outcome, Reason: reason, At: now.UTC()}
	if outcome == messages.OutcomeFailed {
		r.Class = "transient" // the pool keeps trying
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := c.js.Publish(octx, c.subj.PoolResult(name), b, jetstream.WithMsgID(pd.CommandID+"|"+pd.Op+"|"+outcome)); err != nil {
		return fmt.Errorf("answer %s of pool %s: %w", pd.Op, name, err)
	}
	c.metrics.answered(pd.Op, outcome)
	return nil
}

// report logs what a pass decided: members made and retired, and a change
// of the pool's state, once per change (a degraded pool at warn level,
// with its reason).
func (c *Controller) report(before *messages.PoolRecord, p *planned) {
	rec := &p.rec
	for _, id := range p.created {
		m, _ := rec.Member(id)
		c.log.Info("pool member made", "pool", rec.Name, "id", id, "host", m.Host)
	}
	for _, id := range p.burned {
		m, _ := rec.Member(id)
		c.log.Info("pool member burned: its addresses are banned on too many sites; replacing it", "pool", rec.Name, "id", id,
			"sites", m.BannedOn, "recycle_after_bans", rec.RecycleAfterBans)
	}
	for _, r := range p.retired {
		level := c.log.Info
		switch r.why {
		case messages.RetireBroken:
			level = c.log.Warn
			c.metrics.failed(rec.Name)
		case messages.RetireRecycle:
			c.metrics.recycled(rec.Name, r.cause)
		}
		level("pool member retired", "pool", rec.Name, "id", r.id, "why", r.why, "reason", r.reason)
	}
	if len(p.dropped) > 0 {
		c.log.Debug("pool members gone", "pool", rec.Name, "ids", strings.Join(p.dropped, ","))
	}
	if before.State == rec.State {
		return
	}
	switch {
	case rec.State == messages.PoolDegraded:
		c.log.Warn("pool degraded", "pool", rec.Name, "reason", rec.Reason, "failures", rec.Failures)
	case before.State == messages.PoolDegraded:
		c.log.Warn("pool no longer degraded", "pool", rec.Name, "state", rec.State)
	default:
		c.log.Info("pool "+rec.State, "pool", rec.Name, "was", before.State)
	}
}
