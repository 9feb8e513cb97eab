package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Re-drive and volume sweeps, the parts of the observation pass (observe.go)
// that act rather than report.
//
// Re-drive: a proxy that ran here for the command that is wanted and whose
// domain is gone (destroyed and undefined behind the system's back) is made
// again through the same path as a command: a work item for it, run by the
// executor under the id's lock with the usual retries.
//
// Only what ran is re-driven. "It ran" is: its last event is this host's
// "running" for the desired record's command, or its last event is one an
// observation pass of this executor published after it saw the proxy so
// (the domain shut off before it was undefined: "failed"; or the guest lost
// its address: "provisioning"). The executor remembers the seq of those
// events (ranMemo); any other event since (a converge's, another worker's)
// ends the memory. A re-drive's own event is "provisioning", from which a
// proxy with no domain is left to its converge, so one disappearance makes
// one re-drive; a create that fails (permanently, or out of attempts)
// reports "failed", which observation never looks at again. So nothing is
// re-driven in a loop: a proxy is re-driven again only after it ran again.
// The memory is this process's: a proxy reported failed by one worker whose
// domain is undefined after the host moved to another stays failed, as a
// command's failure would.

// reasonRedrive is the reason of a re-drive's provisioning events.
const reasonRedrive = "re-creating: domain gone"

// workItem is the body of a work item. The executor reads the desired
// record, not the item; Reason, set by a re-drive, is what the converge's
// provisioning event says instead of "creating" when Seq is still the
// desired record's.
type workItem struct {
	V      int    `json:"v"`
	ID     string `json:"id"`
	Seq    uint64 `json:"seq"`
	Reason string `json:"reason,omitempty"`
}

// itemReason is the reason a work item carries for the desired record d.
func itemReason(body []byte, d *messages.Desired) string {
	var it workItem
	if json.Unmarshal(body, &it) != nil || it.Seq != d.Seq {
		return ""
	}
	return it.Reason
}

// redrive dispatches a work item that makes d's proxy again, then says so
// in a provisioning event. The item goes first: an event without its item
// would leave the proxy provisioning with nothing to make it, while an item
// whose event was not published still converges and reports. The item's
// converge waits for the id's lock, which the caller holds.
func (e *executor) redrive(ctx context.Context, d *messages.Desired) (bool, error) {
	w := e.w
	b, _ := json.Marshal(workItem{V: messages.Version, ID: d.ID, Seq: d.Seq, Reason: reasonRedrive})
	m := nats.NewMsg(w.subj.Work(e.host, d.ID))
	m.Data = b
	if _, err := w.js.PublishMsg(ctx, m); err != nil {
		return false, fmt.Errorf("re-drive %s: dispatch: %w", d.ID, err)
	}
	w.stats.redriven.Add(1)
	w.metrics.redrives.Inc()
	w.log.Warn("domain gone behind our back: re-creating it", "host", e.host, "id", d.ID, "command_id", d.CommandID)
	ev := messages.StateEvent{ID: d.ID, Host: e.host, CommandID: d.CommandID, CommandSeq: d.Seq, State: messages.StateProvisioning, Reason: reasonRedrive, Labels: d.Labels}
	if _, err := w.events.Publish(ctx, ev); err != nil && !errors.Is(err, errEventSuperseded) {
		return false, fmt.Errorf("re-drive %s: %w", d.ID, err)
	}
	return true, nil
}

// Volume sweeps: when the host's provider is a Sweeper, the observation
// pass asks it, at most every SweepGrace/4, to remove the volumes nothing
// has used for SweepGrace. A proxy's volumes are removed only while the
// worker holds the id (claimVolumes), so never under a converge of it.

// sweepVolumes runs the provider's volume sweep if it is due, and returns
// how many volumes it removed.
func (e *executor) sweepVolumes(ctx context.Context) int {
	w := e.w
	p := e.prov
	if g, ok := p.(interface{ Unwrap() Provider }); ok {
		p = g.Unwrap() // the host's own provider, not the quarantine's wrapper
	}
	s, ok := p.(Sweeper)
	if !ok || w.cfg.SweepGrace < 0 {
		return 0
	}
	now := w.now().UnixNano()
	last := e.volumesSweptAt.Load()
	if last != 0 && now-last < int64(w.cfg.SweepGrace/4) {
		return 0
	}
	if !e.volumesSweptAt.CompareAndSwap(last, now) {
		return 0 // another pass of this host is at it
	}
	w.metrics.sweeps.WithLabelValues("volumes").Inc()
	removed, err := s.SweepVolumes(ctx, w.cfg.SweepGrace, e.claimVolumes)
	for _, name := range removed {
		w.log.Info("swept an unused volume", "host", e.host, "volume", name)
	}
	if err != nil && ctx.Err() == nil {
		w.log.Warn("volume sweep", "host", e.host, "err", err)
	}
	w.stats.volumesSwept.Add(int64(len(removed)))
	w.metrics.swept.WithLabelValues("volume").Add(float64(len(removed)))
	return len(removed)
}

// claimVolumes lets the sweeper remove id's volumes, holding the id until
// release, unless a create of id on this host is (or will be) worked on:
// its converge removes what an earlier attempt left, or uses it. An id
// whose lock is held (a converge or observation of it is running) is kept,
// and so is one whose desired record cannot be read. An id with no desired
// record at all may be swept: the sweeper only removes volumes that have no
// domain, so nothing that runs is lost.
func (e *executor) claimVolumes(ctx context.Context, id string) (func(), bool) {
	w := e.w
	unlock, ok := w.locks.tryLock(id)
	if !ok {
		return nil, false
	}
	d, err := w.readDesired(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		w.log.Debug("volume sweep: desired state unreadable, kept", "host", e.host, "id", id, "err", err)
		unlock()
		return nil, false
	case e.owns(d):
		unlock()
		return nil, false
	}
	return unlock, true
}

// ranMemo remembers, per proxy id, the seq of the last event an observation
// pass published for a proxy that ran (see "Only what ran", above).
type ranMemo struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (r *ranMemo) set(id string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]uint64{}
	}
	r.m[id] = seq
}

// valid reports whether the event of id with seq is one remembered.
func (r *ranMemo) valid(id string, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.m[id]
	return ok && s == seq
}

func (r *ranMemo) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// prune forgets every id whose last event is not the one remembered.
func (r *ranMemo) prune(last map[string]viewedEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, seq := range r.m {
		if ev, ok := last[id]; !ok || ev.Seq != seq {
			delete(r.m, id)
		}
	}
}
