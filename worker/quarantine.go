package worker

import (
	"context"
	"sync"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Quarantine: a host whose calls keep failing transiently (Config's
// QuarantineFailures within QuarantineWindow) is quarantined for a
// cool-down. Its state lives in its PROXY_HOSTS record, so every intake
// sees it (placement skips the host) and a new owner takes it over. While
// it lasts, the host's work waits: the executor holds each item before it
// runs (kept in progress, as any item waiting for a slot), so it spends no
// attempt and no delivery. Handing items back with NakWithDelay instead
// would count every cool-down against the consumer's MaxDeliver, the
// server's backstop, which a long outage would exhaust; and ceasing to pull
// the host would make the server pin its work to another worker, which
// would call the failing host again. When the cool-down ends, the owner
// probes the host with one List: success ends the quarantine, failure
// doubles the cool-down (up to QuarantineMaxCoolDown). The owner notices
// the end of a cool-down in the items it holds, and in the host's
// observation ticks, which arrive every ObserveInterval even when no other
// work does.
//
// An operator's quarantine (a host command, hostcmd.go) is a quarantine
// without a cool-down (HostRecord.Manual): no probe ends it, only a
// release, and it holds the host's work whether or not automatic
// quarantine is enabled. Whoever applies a host command writes the record;
// the owner takes the change from its host view (which follows the
// bucket): a guard whose picture disagrees with the view's reads the
// record again, before each item and, while work waits, every
// recheckInterval. The guard's own writes never undo another writer's
// change: a new quarantine is written only over a host not quarantined,
// a probe's outcome only over the quarantine it probed; otherwise the
// guard takes the record as it is.

// recheckInterval bounds how long work held on a quarantined host waits
// before its guard looks at the host view again.
const recheckInterval = time.Second

// hostGuard keeps one host's failures and quarantine in one worker. Its
// clock is the wall clock: it waits on real timers.
type hostGuard struct {
	w    *Worker
	host string
	prov Provider // the host's provider itself, for the probe

	mu       sync.Mutex
	loaded   bool                // the record was read once
	q        messages.HostRecord // the quarantine fields, as last read or written
	failures []time.Time         // transient failures within the window
	probing  bool
	changed  chan struct{} // closed and replaced when q changes
	// The last cool-down and when it ended, so a host that fails again
	// soon after it came back starts from a longer one.
	lastCoolDown time.Duration
	leftAt       time.Time
}

func newHostGuard(w *Worker, host string, prov Provider) *hostGuard {
	return &hostGuard{w: w, host: host, prov: prov, q: messages.HostRecord{State: messages.HostOK}, changed: make(chan struct{})}
}

// enabled reports whether automatic quarantine is on: failures counted,
// cool-downs probed. An operator's quarantine holds either way.
func (g *hostGuard) enabled() bool { return g.w.cfg.QuarantineFailures > 0 }

// holds reports whether q holds the host's work.
func (g *hostGuard) holds(q messages.HostRecord) bool {
	return q.Manual() || (q.Quarantined() && g.enabled())
}

// follow reads the host's record again when the host view says the host
// is (or is not) quarantined and g says otherwise: another worker applied
// a host command, or quarantined or released it.
func (g *hostGuard) follow(ctx context.Context) {
	q, ok := g.w.hostView.quarantined(g.host)
	if !ok {
		return
	}
	g.mu.Lock()
	differs := q != g.q.Quarantined()
	g.mu.Unlock()
	if differs {
		g.load(ctx, true)
	}
}

// set replaces the quarantine fields of q; g.mu is held.
func (g *hostGuard) set(rec messages.HostRecord) {
	was := g.q.State
	g.q.State, g.q.Since, g.q.Until, g.q.CoolDownMS, g.q.Reason = rec.State, rec.Since, rec.Until, rec.CoolDownMS, rec.Reason
	if was == messages.HostQuarantined && !rec.Quarantined() {
		g.failures = nil
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// load reads the host's record into g; loaded once, unless again.
func (g *hostGuard) load(ctx context.Context, again bool) {
	g.mu.Lock()
	skip := g.loaded && !again
	g.mu.Unlock()
	if skip {
		return
	}
	rec, _, err := g.w.readHost(ctx, g.host)
	if err != nil {
		return // as it was; the next tick reads again
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.loaded = true
	if rec.State != g.q.State || !rec.Until.Equal(g.q.Until) || !rec.Since.Equal(g.q.Since) || rec.Reason != g.q.Reason {
		switch {
		case rec.Manual() && !g.q.Manual():
			g.w.log.Warn("host is quarantined by an operator: its work waits until released", "host", g.host, "reason", rec.Reason)
		case rec.Quarantined() && !g.q.Quarantined():
			g.w.log.Warn("host is quarantined: its work waits", "host", g.host, "until", rec.Until, "reason", rec.Reason)
		case !rec.Quarantined() && g.q.Quarantined():
			g.w.log.Warn("host is out of quarantine: its work runs", "host", g.host)
		}
		g.set(rec)
	}
}

// note counts a transient failure of one of the host's calls (a call
// cancelled by its caller is not the host's fault), and quarantines the
// host when they are too many.
func (g *hostGuard) note(ctx context.Context, err error) {
	if err == nil || !g.enabled() || ctx.Err() != nil || fleet.ClassOf(err) != fleet.ClassTransient {
		return
	}
	now := time.Now()
	cfg := g.w.cfg
	g.mu.Lock()
	if g.q.Quarantined() {
		g.mu.Unlock()
		return
	}
	keep := g.failures[:0]
	for _, t := range g.failures {
		if now.Sub(t) < cfg.QuarantineWindow {
			keep = append(keep, t)
		}
	}
	g.failures = append(keep, now)
	if len(g.failures) < cfg.QuarantineFailures {
		g.mu.Unlock()
		return
	}
	cd := cfg.QuarantineCoolDown
	if !g.leftAt.IsZero() && now.Sub(g.leftAt) < cfg.QuarantineMaxCoolDown {
		cd = min(2*g.lastCoolDown, cfg.QuarantineMaxCoolDown) // it failed again soon after it came back
	}
	n := len(g.failures)
	q := messages.HostRecord{State: messages.HostQuarantined, Since: now.UTC(), Until: now.Add(cd).UTC(),
		CoolDownMS: cd.Milliseconds(), Reason: oneLine(err.Error())}
	g.set(q)
	g.mu.Unlock()
	g.w.log.Warn("host quarantined: placement skips it and its work waits", "host", g.host, "failures", n,
		"window", cfg.QuarantineWindow, "cool_down", cd, "err", err)
	g.write(ctx, q, func(rec messages.HostRecord) bool { return !rec.Quarantined() })
}

// write records the quarantine fields of q in the host's record if the
// record, as stored, is one over which q may be written (over: judged on
// the record the compare-and-set writes over); otherwise another writer's
// change stands and g takes the record as it is.
func (g *hostGuard) write(ctx context.Context, q messages.HostRecord, over func(messages.HostRecord) bool) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	kept := false
	err := g.w.updateHost(wctx, g.host, func(rec *messages.HostRecord) error {
		if !over(*rec) {
			kept = true
			return errNoChange
		}
		kept = false
		rec.State, rec.Since, rec.Until, rec.CoolDownMS, rec.Reason = q.State, q.Since, q.Until, q.CoolDownMS, q.Reason
		return nil
	})
	if err != nil {
		g.w.log.Error("record the host's quarantine state", "host", g.host, "state", q.State, "err", err)
		return
	}
	if kept {
		g.w.log.Info("host's record changed by another writer: kept as it is", "host", g.host, "state", q.State)
		g.load(wctx, true)
	}
}

// await returns once the host is not quarantined (probing it when its
// cool-down is over, if no one else is), or with an error once ctx ends or
// the worker drains (the item goes back, for the next owner).
func (g *hostGuard) await(ctx context.Context) error {
	g.load(ctx, false)
	g.follow(ctx)
	for {
		g.mu.Lock()
		if !g.holds(g.q) {
			g.mu.Unlock()
			return nil
		}
		wait, ch := time.Until(g.q.Until), g.changed
		if g.q.Manual() {
			wait = recheckInterval // no probe: a release ends it
		} else if wait <= 0 && !g.probing {
			g.probing = true
			g.mu.Unlock()
			g.probe(ctx)
			continue
		}
		g.mu.Unlock()
		if wait <= 0 {
			wait = time.Second // another call probes: it signals
		}
		t := time.NewTimer(min(wait, recheckInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-g.w.draining:
			t.Stop()
			return errStopped
		case <-ch:
		case <-t.C:
			g.follow(ctx)
		}
		t.Stop()
	}
}

// tick runs on each observation tick: it reads the host's record again
// (another owner may have quarantined or probed it), probes the host if its
// cool-down is over, and reports whether it is (still) quarantined.
func (g *hostGuard) tick(ctx context.Context) bool {
	if g.enabled() {
		g.load(ctx, true)
	} else {
		g.load(ctx, false)
		g.follow(ctx)
	}
	g.mu.Lock()
	probe := g.enabled() && g.q.Quarantined() && !g.q.Manual() && !g.probing && !time.Now().Before(g.q.Until)
	if probe {
		g.probing = true
	}
	g.mu.Unlock()
	if probe {
		g.probe(ctx)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holds(g.q)
}

// probe makes one cheap call (List) to a quarantined host whose cool-down
// is over: success ends the quarantine, a failure doubles the cool-down.
// The caller has set g.probing.
func (g *hostGuard) probe(ctx context.Context) {
	cfg := g.w.cfg
	pctx, cancel := context.WithTimeout(ctx, max(cfg.QuarantineCoolDown, 10*time.Second))
	_, err := g.prov.List(pctx)
	cancel()
	now := time.Now()
	g.mu.Lock()
	g.probing = false
	if ctx.Err() != nil {
		g.mu.Unlock()
		return // stopping: the next owner probes
	}
	cd := time.Duration(g.q.CoolDownMS) * time.Millisecond
	probed := g.q
	var q messages.HostRecord
	if err == nil {
		q = messages.HostRecord{State: messages.HostOK, Since: now.UTC()}
		g.lastCoolDown, g.leftAt = cd, now
	} else {
		cd = min(max(2*cd, cfg.QuarantineCoolDown), cfg.QuarantineMaxCoolDown)
		q = messages.HostRecord{State: messages.HostQuarantined, Since: g.q.Since, Until: now.Add(cd).UTC(),
			CoolDownMS: cd.Milliseconds(), Reason: oneLine(err.Error())}
	}
	since := g.q.Since
	g.set(q)
	g.mu.Unlock()
	if err == nil {
		g.w.log.Warn("host out of quarantine: a probe succeeded", "host", g.host, "quarantined_for", now.Sub(since).Round(time.Millisecond))
	} else {
		g.w.log.Warn("host still failing: quarantine extended", "host", g.host, "cool_down", cd, "err", err)
	}
	g.write(ctx, q, func(rec messages.HostRecord) bool {
		return rec.Quarantined() && !rec.Manual() && rec.Until.Equal(probed.Until)
	})
}

// oneLine bounds a reason kept in the host's record.
func oneLine(s string) string {
	if len(s) > 300 {
		s = s[:297] + "..."
	}
	return s
}

// guarded is a host's provider that tells the host's guard of every
// failure. It is Provider only: an optional interface the host's provider
// may also implement is to be asserted on Unwrap's.
type guarded struct {
	Provider
	g *hostGuard
}

// Unwrap returns the host's provider itself.
func (p guarded) Unwrap() Provider { return p.Provider }

func (p guarded) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	in, err := p.Provider.Create(ctx, spec)
	p.g.note(ctx, err)
	return in, err
}

func (p guarded) Get(ctx context.Context, id string) (fleet.Instance, error) {
	in, err := p.Provider.Get(ctx, id)
	p.g.note(ctx, err)
	return in, err
}

func (p guarded) Delete(ctx context.Context, id string) error {
	err := p.Provider.Delete(ctx, id)
	p.g.note(ctx, err)
	return err
}

func (p guarded) List(ctx context.Context) ([]fleet.Instance, error) {
	in, err := p.Provider.List(ctx)
	p.g.note(ctx, err)
	return in, err
}

// quarantined reports whether the view holds host's record and whether
// that record says the host is quarantined.
func (v *hostView) quarantined(host string) (q, ok bool) {
	if v == nil {
		return false, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r, ok := v.recs[host]
	if !v.ready || !ok || r.rev == 0 {
		return false, false
	}
	return r.quarantined, true
}
