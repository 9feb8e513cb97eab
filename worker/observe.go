package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/fleet"
	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// observeToken is the id token of a host's observation tick. It is not a
// valid proxy id (ids never start with '_'), so it cannot collide.
const observeToken = "_observe"

// Observation: each host's owner re-reads its proxies on an interval and
// publishes a state event only when what it sees differs from the last
// event, so a VM that dies or loses its address behind the system's back is
// seen within an interval.
//
// The tick travels as a work item, proxy.work.<host>._observe, so the
// worker pinned to the host, and only that one, runs the pass: ownership
// needs no second mechanism. Every worker publishes ticks for the hosts it
// pulls (its share, any backup, all of them without a view of the
// membership: the owner is among the pullers); the message id names the
// interval window, so JetStream stores one tick per window however many
// workers publish it, and the work stream's one-message-per-subject rule
// collapses a backlog. (Every worker published the ticks of every host it
// can execute before: with 500 hosts and 10 workers, 5,000 publishes an
// interval, ten for each tick stored, and a goroutine per host in each.)

// tickLoop publishes, every ObserveInterval, an observation tick for each
// host of runs the worker pulls then, until ctx is done.
func (w *Worker) tickLoop(ctx context.Context, runs []*consumerRun) {
	t := time.NewTicker(w.cfg.ObserveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		window := strconv.FormatInt(w.now().UnixNano()/int64(w.cfg.ObserveInterval), 10)
		pctx, cancel := context.WithTimeout(ctx, w.cfg.ObserveInterval)
		for _, c := range runs {
			if !c.pulling.Load() || pctx.Err() != nil {
				continue
			}
			m := nats.NewMsg(w.subj.Work(c.host, observeToken))
			m.Header.Set(jetstream.MsgIDHeader, "observe-"+c.host+"-"+window)
			if _, err := w.js.PublishMsg(pctx, m); err != nil && ctx.Err() == nil {
				w.log.Debug("publish observation tick", "host", c.host, "err", err)
			}
		}
		cancel()
	}
}

// observe runs one observation pass over the proxies this host should run.
func (e *executor) observe(ctx context.Context) error {
	w := e.w
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ObserveInterval)
	defer cancel()
	if w.cfg.ObserveInterval <= 0 {
		return errors.New("observation pass: observation is off in this worker")
	}
	select {
	case w.observing <- struct{}{}:
		defer func() { <-w.observing }()
	case <-ctx.Done():
		// The worker's other hosts' passes took the interval: this one
		// is skipped, the next tick comes.
		w.log.Debug("observation pass skipped: others ran all the interval", "host", e.host)
		return nil
	}
	// The proxies that hold room here and the domains here are the ones
	// whose events can put them here: the pass reads those events only,
	// never the whole stream's.
	rec, _, err := w.readHost(ctx, e.host)
	if err != nil {
		return fmt.Errorf("observation pass on %s: %w", e.host, err)
	}
	since := e.known.mark()
	insts, listErr := e.prov.List(ctx)
	if listErr != nil {
		// The proxies with events are still looked at; nothing is swept.
		w.log.Warn("observation pass: list", "host", e.host, "err", listErr)
	}
	candidates := make([]string, 0, len(rec.Proxies)+len(insts))
	for id := range rec.Proxies {
		candidates = append(candidates, id)
	}
	for _, in := range insts {
		if _, ok := rec.Proxies[in.ID]; !ok {
			candidates = append(candidates, in.ID)
		}
	}
	last, err := w.lastEvents(ctx, candidates)
	if err != nil {
		return fmt.Errorf("observation pass on %s: %w", e.host, err)
	}
	// The last events that put a proxy here, "deleted" ones aside.
	events := make(map[string]viewedEvent, len(last))
	for id, ev := range last {
		if ev.Host == e.host && ev.State != messages.StateDeleted {
			events[id] = ev
		}
	}
	w.stats.observePasses.Add(1)
	w.stats.observeEventsRead.Add(int64(len(events)))
	// The proxies to look at: those whose last event puts them here and
	// running (or starting), those that ran and were last reported failed
	// by an observation (their domain may go: re-drive), and the domains
	// here with no event at all (PROXY_EVENTS was lost and made anew:
	// nothing else would ever report them again). A domain here whose
	// last event is "deleted", or puts it on another host, is left: a
	// converge is (or was) under way, and observeOne would leave it too;
	// an orphan is the sweep's to remove.
	e.ran.prune(events) // it remembers only proxies of this host
	var ids []string
	for id, ev := range events {
		if ev.State == messages.StateRunning || ev.State == messages.StateProvisioning ||
			ev.State == messages.StateFailed && e.ran.valid(id, ev.Seq) {
			ids = append(ids, id)
		}
	}
	for _, in := range insts {
		if _, ok := last[in.ID]; !ok {
			ids = append(ids, in.ID)
		}
	}
	// The list's summaries that say running with an address (the sim's
	// do; kvm's never say running): one that shows what the last event
	// says spares the proxy its read.
	running := make(map[string]string)
	for _, in := range insts {
		if in.State == messages.StateRunning && in.IP != "" {
			running[in.ID] = in.IP
		}
	}
	var changed int
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ev, ok := events[id]; ok && ev.State == messages.StateRunning && ev.IP != "" && running[id] == ev.IP {
			continue
		}
		if ev, ok := events[id]; ok && e.unchanged(ctx, id, ev) {
			continue
		}
		ok, err := e.observeOne(ctx, id)
		if err != nil {
			w.log.Debug("observe", "host", e.host, "id", id, "err", err)
			continue
		}
		if ok {
			changed++
		}
	}
	swept := 0
	if listErr == nil {
		w.metrics.sweeps.WithLabelValues("domains").Inc()
		swept = e.sweep(ctx, insts)
		swept += e.sweepVolumes(ctx)
		if err := e.reconcileRoom(ctx, insts, since); err != nil {
			w.log.Debug("observation pass", "host", e.host, "err", err)
		}
	}
	w.log.Debug("observation pass", "host", e.host, "proxies", len(ids), "changed", changed, "swept", swept)
	if listErr != nil {
		return fmt.Errorf("list %s: %w", e.host, listErr)
	}
	return nil
}

// sweep removes the host's orphans: domains this project made here whose
// desired state is not to run here (a delete or a move whose work item was
// lost, say). A domain whose proxy has no desired record at all is left
// alone and logged: without a record there is no proof it is unwanted, and
// a lost or misnamed bucket must not delete a fleet.
//
// The desired records of all the domains are read first, in one batched
// direct get, and a domain whose record places it here is passed over:
// only the others are looked at one by one, under their locks, so the
// records cost a pass a request a batch, not a request a proxy. A batch
// that fails leaves every domain to be looked at one by one.
func (e *executor) sweep(ctx context.Context, insts []fleet.Instance) int {
	w := e.w
	wanted, err := e.wantedHere(ctx, insts)
	if err != nil {
		w.log.Debug("sweep: read desired records", "host", e.host, "err", err)
	}
	swept := 0
	for _, in := range insts {
		if ctx.Err() != nil {
			return swept
		}
		if wanted[in.ID] {
			continue
		}
		ok, err := e.sweepOne(ctx, in.ID)
		if err != nil {
			w.log.Warn("sweep", "host", e.host, "id", in.ID, "err", err)
			continue
		}
		if ok {
			swept++
		}
	}
	return swept
}

// wantedHere reads the desired records of insts in batches and returns the
// ids whose record says to run here. A deleted or purged record, or one
// that does not decode, is not among them.
func (e *executor) wantedHere(ctx context.Context, insts []fleet.Instance) (map[string]bool, error) {
	w := e.w
	wanted := make(map[string]bool, len(insts))
	err := jsapi.LastOfKeys(ctx, jsapi.New(w.js), messages.BucketDesired, insts, instanceID, func(id string, value []byte, deleted bool) {
		if deleted {
			return
		}
		var d messages.Desired
		if json.Unmarshal(value, &d) == nil && e.owns(&d) {
			wanted[id] = true
		}
	})
	if err != nil {
		return wanted, fmt.Errorf("read desired records: %w", err)
	}
	return wanted, nil
}

func instanceID(in fleet.Instance) string { return in.ID }

func (e *executor) sweepOne(ctx context.Context, id string) (bool, error) {
	w := e.w
	unlock, err := w.locks.lock(ctx, id)
	if err != nil {
		return false, err
	}
	defer unlock()
	d, err := w.readDesired(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		w.log.Warn("a domain of ours with no desired state: left alone", "host", e.host, "id", id)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if e.owns(d) {
		return false, nil
	}
	// The read above may come from a replica that is behind (an old
	// delete where a newer create is recorded): before deleting, the
	// leader must say the same.
	if d, err = w.readDesiredFromLeader(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		return false, err
	}
	if e.owns(d) {
		w.log.Info("sweep: a replica's read was behind; the leader wants it here", "host", e.host, "id", id)
		return false, nil
	}
	// The pass listed the domains before it took the lock: a delete's
	// work may have removed this one since. Nothing is swept then.
	if _, err := e.prov.Get(ctx, id); isNotFound(err) {
		return false, nil
	}
	if err := e.prov.Delete(ctx, id); err != nil {
		return false, err
	}
	e.known.forget(id)
	w.stats.swept.Add(1)
	w.metrics.swept.WithLabelValues("domain").Inc()
	w.log.Info("swept an orphan", "host", e.host, "id", id, "desired", d.Op, "desired_host", d.Host)
	return true, nil
}

// unchanged reports whether id's domain shows what its last event, as the
// pass read it, says, so that observeOne would publish nothing: running at
// the event's address, or provisioning, for an event of either; present in
// any state, or unreadable, for a failed one (observeOne looks at a proxy
// an observation reported failed only to re-drive it when its domain is
// gone). Such a proxy costs the pass one read of its domain, and no read
// of its desired record or last event; one that differs, or whose domain
// is gone, is looked at under its lock, its record and last event read
// afresh. An event stored after the pass read it is looked at on the next
// pass.
//
// A proxy whose summary in the pass's list says running at the address
// its last event gives is not read again: its domain showed, when the
// pass listed it, what the event says, and a change since is seen on the
// next pass, as one after a read would be.
//
// The read runs under id's lock, as every provider call on a proxy does
// (work for one id never overlaps, reads included); a proxy whose lock is
// taken is being converged, which reports what it finds, and counts as
// unchanged for this pass.
func (e *executor) unchanged(ctx context.Context, id string, ev viewedEvent) bool {
	unlock, ok := e.w.locks.tryLock(id)
	if !ok {
		return true
	}
	obs, err := e.prov.Get(ctx, id)
	unlock()
	switch {
	case isNotFound(err):
		return false
	case err != nil:
		return true // unreadable is not changed: observeOne would publish nothing
	case ev.State == messages.StateFailed:
		return true
	}
	ip := ""
	if obs.State == messages.StateRunning {
		ip = obs.IP
	}
	return obs.State == ev.State && ip == ev.IP
}

// observeOne re-reads one proxy under its lock and publishes what changed.
// It reports whether it published.
func (e *executor) observeOne(ctx context.Context, id string) (bool, error) {
	w := e.w
	unlock, err := w.locks.lock(ctx, id)
	if err != nil {
		return false, err
	}
	defer unlock()
	d, err := w.readDesired(ctx, id)
	if err != nil {
		return false, err
	}
	if !e.owns(d) {
		return false, nil // a command is moving or deleting it; its work item reports
	}
	last, lastSeq, err := w.events.last(ctx, id)
	if err != nil {
		return false, err
	}
	// ran: it ran here for this command, and nothing but observation
	// passes has reported it since.
	ran := lastSeq != 0 && (last.State == messages.StateRunning || e.ran.valid(id, last.Seq))
	if lastSeq != 0 && (last.CommandID != d.CommandID || last.Host != e.host ||
		(last.State != messages.StateRunning && last.State != messages.StateProvisioning && !ran)) {
		return false, nil // a converge is (or was) under way; it reports
	}
	obs, err := e.prov.Get(ctx, id)
	if lastSeq == 0 && (err != nil || obs.CommandID != d.CommandID) {
		// No event on record: report only a domain made for the
		// command that is wanted; anything else is a converge's to fix.
		return false, err
	}
	var ev messages.StateEvent
	switch {
	case isNotFound(err) && ran:
		// It ran here for the command that is wanted, and its domain is
		// gone (destroyed and undefined behind the system's back).
		e.ran.forget(id)
		return e.redrive(ctx, d)
	case isNotFound(err):
		// Not made yet, or its create is waiting for a retry: the
		// converge reports for itself.
		return false, nil
	case err != nil:
		// An unreadable proxy is not a changed one: nothing is published.
		return false, err
	case last.State == messages.StateFailed:
		// Reported failed (shut off) and still there: a command's to
		// replace, as before.
		return false, nil
	default:
		ev = messages.StateEvent{State: obs.State, Reason: obs.Reason}
		if obs.State == messages.StateRunning {
			ev.IP, ev.Source, ev.Port = obs.IP, obs.Source, w.cfg.ProxyPort
			ev.Egress = egressOf(obs)
		}
		if obs.State == messages.StateFailed {
			ev.Class = string(fleet.ClassPermanent)
		}
	}
	if ev.State == last.State && ev.IP == last.IP {
		return false, nil
	}
	ev.ID, ev.Host, ev.CommandID, ev.CommandSeq, ev.Labels = id, e.host, d.CommandID, d.Seq, d.Labels
	if ev.State == messages.StateProvisioning && ev.Reason == "" {
		ev.Reason = "no address"
	}
	pub, err := w.events.Publish(ctx, ev)
	if errors.Is(err, errEventSuperseded) {
		return false, nil // d was read before a newer command: its work reports
	}
	if err != nil {
		return false, err
	}
	if ran {
		e.ran.set(id, pub.Seq)
	}
	w.log.Info("observed a change", "host", e.host, "id", id, "was", last.State, "now", ev.State, "ip", ev.IP, "reason", ev.Reason)
	return true, nil
}
