package rotation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/bans"
	"proxyfleet/messages"
)

// Bans: Run follows PROXY_BANS (a KV watch) into a bans.Set beside the
// rotation, so Banned answers from memory, and Ban asks health (on
// <prefix>.ban) to store a ban every follower then sees. A ban this
// process asks for holds here at once, before health has stored it. A
// missing bucket (set-up not run since bans came) or a refused read is
// logged and tried again with backoff; meanwhile Banned answers from
// what was read, nothing at first.

// Banned reports whether addr is banned for site now; site is the
// request's site, as bans.Site gives it once per request. O(1), no
// allocation.
func (r *Rotation) Banned(addr netip.Addr, site string) bool {
	now := r.cfg.Now()
	r.banMu.RLock()
	defer r.banMu.RUnlock()
	return r.bans.Banned(addr, site, now)
}

// ActiveBans counts the bans held that are not over: O(bans).
func (r *Rotation) ActiveBans() int {
	now := r.cfg.Now()
	r.banMu.RLock()
	defer r.banMu.RUnlock()
	return r.bans.Active(now)
}

// EachBan calls f for every ban held that is not over, in no order,
// holding the bans' read lock: f must not call r. O(bans held).
func (r *Rotation) EachBan(f func(addr netip.Addr, site string)) {
	now := r.cfg.Now()
	r.banMu.RLock()
	defer r.banMu.RUnlock()
	r.bans.Each(now, f)
}

// BansReady is closed once PROXY_BANS has been read whole the first time.
func (r *Rotation) BansReady() <-chan struct{} { return r.bansReady }

// Ban bans addr for the site of host (bans.Site) for d, as a library's
// report (source "library"): see AddBan. It waits for health's answer
// at most 10s.
func (r *Rotation) Ban(addr, host string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := r.AddBan(ctx, bans.Request{Address: addr, Site: host, For: messages.Duration(d), Source: bans.SourceLibrary})
	return err
}

// AddBan asks health to store the ban of req (Op and V are set here;
// an empty Source is "library", an empty By this process's Reporter)
// and returns it as stored. The ban holds in this process at once, even
// if the request then fails. A request refused is a *messages.FieldError
// naming the field; no health process answering is an error saying so.
func (r *Rotation) AddBan(ctx context.Context, req bans.Request) (bans.Ban, error) {
	body, req, err := req.Add(bans.SourceLibrary, cut(r.cfg.Reporter, bans.MaxBy)).Encode()
	if err != nil {
		return bans.Ban{}, fmt.Errorf("rotation: ban: %w", err)
	}
	r.HoldBan(bans.Ban{Address: req.Address}.Addr(), req.Site, req.For.D())
	reply, err := r.askBan(ctx, body)
	if err != nil {
		return bans.Ban{}, err
	}
	b, err := reply.Stored()
	if err != nil {
		return bans.Ban{}, fmt.Errorf("rotation: ban: %w", err)
	}
	return b, nil
}

// HoldBan bans addr for site (as bans.Site gives it) for d in this
// process only, at once: what AddBan does before it asks health. A
// caller that asks in the background (a gateway on a rule's ban) holds
// the ban first, so its next pick already passes addr over.
func (r *Rotation) HoldBan(addr netip.Addr, site string, d time.Duration) {
	now := r.cfg.Now()
	r.banMu.Lock()
	defer r.banMu.Unlock()
	if n := r.bans.Add(addr, site, now.Add(d), now); n > 0 {
		r.log.Warn("bans: the most held reached; the bans ending first were dropped", "dropped", n, "max", r.cfg.MaxBans)
	}
}

// RemoveBan asks health to lift the ban of addr for the site of host; it
// is lifted here at once.
func (r *Rotation) RemoveBan(ctx context.Context, addr, host string) error {
	body, req, err := bans.Request{V: messages.Version, Op: bans.OpRemove, Address: addr, Site: host, By: cut(r.cfg.Reporter, bans.MaxBy)}.Encode()
	if err != nil {
		return fmt.Errorf("rotation: unban: %w", err)
	}
	r.banMu.Lock()
	r.bans.Remove(bans.Ban{Address: req.Address}.Addr(), req.Site)
	r.banMu.Unlock()
	_, err = r.askBan(ctx, body)
	return err
}

// askBan sends one request on <prefix>.ban and decodes the answer.
func (r *Rotation) askBan(ctx context.Context, body []byte) (bans.Reply, error) {
	reply, err := AskBan(ctx, r.nc, r.subj, body)
	if err != nil {
		return reply, fmt.Errorf("rotation: %w", err)
	}
	return reply, nil
}

// AskBan sends body, a bans.Request as Encode made it, on <prefix>.ban
// over nc and returns health's answer (bans.DecodeReply: a refusal is a
// *messages.FieldError). No health process answering is an error saying
// so. For a program that asks without following the rotation (the CLI).
func AskBan(ctx context.Context, nc *nats.Conn, subj messages.Subjects, body []byte) (bans.Reply, error) {
	msg, err := nc.RequestWithContext(ctx, subj.Ban(), body)
	if errors.Is(err, nats.ErrNoResponders) {
		return bans.Reply{}, fmt.Errorf("ban: no health process answers %s", subj.Ban())
	}
	if err != nil {
		return bans.Reply{}, fmt.Errorf("ban: %w", err)
	}
	reply, err := bans.DecodeReply(msg.Data)
	if err != nil {
		return reply, fmt.Errorf("ban: %w", err)
	}
	return reply, nil
}

// followBans keeps r.bans current from PROXY_BANS until ctx ends,
// watching again (with backoff) whenever a watch cannot start or ends.
func (r *Rotation) followBans(ctx context.Context) {
	wait := r.cfg.RetryMax / 50
	var since, logged time.Time
	for {
		err := r.watchBans(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		switch {
		case since.IsZero():
			since, logged = now, now
			r.log.Info("bans: waiting for "+messages.BucketBans, "err", err)
		case now.Sub(logged) >= missingRepeat:
			logged = now
			r.log.Error("bans: cannot follow "+messages.BucketBans+" (has set-up run, may this user read it?); bans known are kept",
				"for", now.Sub(since).Round(time.Second), "err", err)
		}
		t := time.NewTimer(wait + rand.N(wait/5+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, r.cfg.RetryMax)
	}
}

// watchBans follows one watch of the bucket until ctx ends (nil) or the
// watch fails. The bans read whole at its start replace those held.
func (r *Rotation) watchBans(ctx context.Context) error {
	js, err := jetstream.New(r.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	kv, err := js.KeyValue(octx, messages.BucketBans)
	cancel()
	if err != nil {
		return fmt.Errorf("bind bucket %s: %w", messages.BucketBans, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", messages.BucketBans, err)
	}
	defer func() { _ = w.Stop() }()
	fresh := bans.NewSet(r.cfg.MaxBans)
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch of %s closed", messages.BucketBans)
			}
			now := r.cfg.Now()
			if e == nil { // the bucket is read whole
				r.banMu.Lock()
				r.bans, fresh = fresh, nil
				r.banMu.Unlock()
				r.bansReadyOnce.Do(func() { close(r.bansReady) })
				continue
			}
			if fresh != nil {
				applyBan(fresh, e, now, r)
				continue
			}
			r.banMu.Lock()
			applyBan(r.bans, e, now, r)
			r.bansExpire(now)
			r.banMu.Unlock()
		}
	}
}

// applyBan applies one entry of the bucket to s; an entry that is not a
// valid ban under its own key is skipped.
func applyBan(s *bans.Set, e jetstream.KeyValueEntry, now time.Time, r *Rotation) {
	if e.Operation() != jetstream.KeyValuePut {
		if addr, site, err := bans.ParseKey(e.Key()); err == nil {
			s.Remove(addr, site)
		}
		return
	}
	b, err := bans.DecodeBan(e.Value())
	if err == nil && b.Key() != e.Key() {
		err = fmt.Errorf("stored under %q, its key is %q", e.Key(), b.Key())
	}
	if err != nil {
		r.log.Debug("bans: an entry that is not a ban skipped", "key", e.Key(), "err", err)
		return
	}
	if n := s.Add(b.Addr(), b.Site, b.Until, now); n > 0 {
		r.log.Warn("bans: the most held reached; the bans ending first were dropped", "dropped", n, "max", r.cfg.MaxBans)
	}
}

// bansExpire drops the bans over from memory, at most once a second;
// with r.banMu held. The bucket needs no sweep: its entries expire.
func (r *Rotation) bansExpire(now time.Time) {
	if now.Before(r.bansNextExpire) {
		return
	}
	r.bans.Expire(now)
	r.bansNextExpire = now.Add(time.Second)
}
