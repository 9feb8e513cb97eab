package worker

import (
	"context"

	"proxyfleet/worker/hostshare"
)

// sharing is what the worker needs of the sharing of the hosts over the
// live workers: a hostshare.Membership, which keeps the worker's record in
// PROXY_WORKERS, follows everyone's and tells each host's run whether to
// pull (consumerRun.Want).
type sharing interface {
	// Run claims the hosts pulled without a pin, writes the record, then
	// heartbeats and follows the membership until ctx ends.
	Run(ctx context.Context)
	// Changed says a run's pin, or whether it pulls, changed: the record
	// is written at once. It does not block.
	Changed()
	// Viewed reports whether the records have been read once (until then
	// every host is pulled).
	Viewed() bool
	// Mine is the hosts assigned to this worker, as last computed.
	Mine() []string
	// Draining writes the record as draining, and Leave deletes it, each
	// within ctx, once Run has returned.
	Draining(ctx context.Context)
	Leave(ctx context.Context)
}

// join writes the worker's record and reads everyone's (see
// hostshare.Join), telling each of hostRuns whether to pull its host, and
// has each run report a change of its pin or its pulls to the membership.
// It fails only when PROXY_WORKERS cannot be bound.
func (w *Worker) join(ctx context.Context, hostRuns map[string]*consumerRun) error {
	hosts := make(map[string]hostshare.Host, len(hostRuns))
	for h, c := range hostRuns {
		hosts[h] = c
	}
	m, err := hostshare.Join(ctx, w.life.ctx(stageMembers), w.js, hostshare.Config{
		ID: w.cfg.ID, Hosts: hosts, Subjects: w.subj,
		Heartbeat: w.cfg.Heartbeat, Liveness: w.cfg.Liveness,
		Unpins: w.unpins, StrayUnpinned: w.metrics.strayPins.Inc,
		Now: w.now, Log: w.log,
	})
	if err != nil {
		return err
	}
	for _, c := range hostRuns {
		c.changed = m.Changed
	}
	w.members = m
	return nil
}
