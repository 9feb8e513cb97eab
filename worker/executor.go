package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

func classOf(err error) fleet.Class {
	c := fleet.ClassOf(err)
	if c == fleet.ClassNotFound {
		return fleet.ClassPermanent
	}
	return c
}

// RetryInfo describes one transient failure handed back with NakWithDelay.
type RetryInfo struct {
	Host    string
	ID      string
	Attempt int
	Delay   time.Duration
	Err     error
}

// executor converges the proxies of one host.
type executor struct {
	w     *Worker
	host  string
	prov  Provider // the host's, telling guard of its failures
	guard *hostGuard
	// unrecorded are the reservations reconcileRoom found with no
	// recorded command.
	unrecorded unrecordedRoom
	// known says whether the record holds every domain's room and slots
	// (awaitRoomKnown).
	known roomKnown
	// volumesSweptAt is when the last volume sweep of the host started
	// (UnixNano; redrive.go).
	volumesSweptAt atomic.Int64
	// ran remembers the proxies that ran and whose last event is one
	// the observation pass published (redrive.go).
	ran ranMemo
	// boots guesses when a new proxy of the host is up (awaitRunning).
	boots bootGuess
}

// handle converges the proxy of one work item. It never returns without
// acking, terminating or naking msg.
func (e *executor) handle(ctx context.Context, msg jetstream.Msg) {
	w := e.w
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Term()
		return
	}
	_, id, err := w.subj.ParseWork(msg.Subject())
	if err != nil {
		_ = msg.Term()
		return
	}
	if id == observeToken {
		if e.guard.tick(ctx) {
			_ = msg.Ack() // quarantined: nothing to observe
			return
		}
		if err := e.observe(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("observation pass", "host", e.host, "err", err)
		}
		_ = msg.Ack() // the next tick comes anyway
		return
	}
	if meta.NumDelivered > 1 {
		w.log.Info("work redelivered", "host", e.host, "id", id, "delivery", meta.NumDelivered)
	} else {
		w.log.Debug("work", "host", e.host, "id", id)
	}
	// A quarantined host's work waits here, in progress, spending no
	// attempt (see quarantine.go).
	if err := e.guard.await(ctx); err != nil {
		_ = msg.NakWithDelay(0) // stopping
		return
	}
	// On a host with a plan nothing converges before the record holds the
	// slots of every domain on the host.
	if err := e.awaitRoomKnown(ctx); err != nil {
		e.retryOrFail(ctx, msg, meta, nil, id, fleet.Transient(err), time.Time{})
		return
	}
	unlock, err := w.locks.lock(ctx, id)
	if err != nil {
		_ = msg.NakWithDelay(0) // stopping
		return
	}
	defer unlock()

	d, err := w.readDesiredSince(ctx, id, workSeq(msg.Data()))
	if errors.Is(err, ErrDesiredBehind) {
		// Never act on a record older than the command that made this
		// work: it may say delete where a newer create is recorded, and
		// the work item, one per subject, would be acked and gone.
		e.retryOrFail(ctx, msg, meta, nil, id, err, time.Time{})
		return
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_ = msg.Ack() // nothing is wanted of this id
		return
	}
	if err != nil {
		e.retryOrFail(ctx, msg, meta, nil, id, err, time.Time{})
		return
	}
	why := itemReason(msg.Data(), d)
	// When intake accepted the command, for the latency of its answer
	// (commandSeconds); none for a re-drive, whose command was answered
	// long ago.
	accepted := d.At
	if why != "" {
		accepted = time.Time{}
	}
	if err := e.converge(ctx, d, why, accepted); err != nil {
		e.retryOrFail(ctx, msg, meta, d, id, err, accepted)
		return
	}
	if err := msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		w.log.Debug("ack work", "id", id, "err", err)
	}
	w.stats.converged.Add(1)
}

// owns reports whether this host is where d wants the proxy.
func (e *executor) owns(d *messages.Desired) bool {
	return d.Op == messages.OpCreate && d.Host == e.host
}

// converge makes the host match d. why, if set, is the reason of the
// provisioning event of a create (a re-drive's); accepted is when intake
// accepted d's command (zero: its answer is not timed).
func (e *executor) converge(ctx context.Context, d *messages.Desired, why string, accepted time.Time) error {
	obs, err := e.prov.Get(ctx, d.ID)
	present := err == nil
	if err != nil && !isNotFound(err) {
		// A read error proves nothing about the proxy: never a reason
		// to replace or delete it. The provider's class decides whether
		// it is retried.
		return fmt.Errorf("get %s: %w", d.ID, err)
	}
	if !e.owns(d) {
		return e.remove(ctx, d, present)
	}
	if present && obs.SpecHash == d.SpecHash && obs.State != messages.StateFailed {
		if obs.State == messages.StateRunning && obs.IP != "" {
			// Nothing to do: republish what is there.
			if err := e.publish(ctx, d, messages.StateRunning, obs, ""); err != nil {
				return err
			}
			return e.done(ctx, d, accepted)
		}
		return e.awaitRunning(ctx, d, accepted, time.Time{})
	}
	// Only a proxy holding room here gets a domain here.
	netw, err := e.ensureRoom(ctx, d, present)
	if err != nil {
		return err
	}
	reason := nonEmpty(why, "creating")
	if present {
		reason = "replacing: spec changed"
		if obs.SpecHash == d.SpecHash {
			reason = "replacing: " + nonEmpty(obs.Reason, "domain is not running")
		}
	}
	if present {
		// The old domain goes only once "provisioning" is stored: until
		// then readers may take it for running.
		if err := e.publish(ctx, d, messages.StateProvisioning, fleet.Instance{}, reason); err != nil {
			return err
		}
		if err := e.prov.Delete(ctx, d.ID); err != nil {
			return fmt.Errorf("delete %s for replacement: %w", d.ID, err)
		}
		e.w.stats.creates.Add(1)
		created := time.Now()
		if err := e.create(ctx, d, netw); err != nil {
			return err // the provider's error names the create and the id
		}
		return e.awaitRunning(ctx, d, accepted, created)
	}
	// Nothing is there: "provisioning" is published while the create
	// runs, and stored before "running" is (that one waits for it). A
	// failed publish fails the attempt after the create, as a failed
	// create does; the next attempt finds the domain and waits for it.
	published := make(chan error, 1)
	go func() { published <- e.publish(ctx, d, messages.StateProvisioning, fleet.Instance{}, reason) }()
	e.w.stats.creates.Add(1)
	created := time.Now()
	err = e.create(ctx, d, netw)
	if perr := <-published; err == nil {
		err = perr
	}
	if err != nil {
		return err // the provider's error names the create and the id
	}
	return e.awaitRunning(ctx, d, accepted, created)
}

// create runs the provider's Create, turning what it reports of long work
// (a base image transfer) into provisioning events whose reason says what
// is happening, at most every Config.ProgressEvery.
//
// The publisher of those events starts with the first report: most
// creates report nothing (a base image already on the host, a sim host),
// and a goroutine and a ticker for each create running at once in a
// burst would be memory for nothing. A report after Create returned is
// dropped.
func (e *executor) create(ctx context.Context, d *messages.Desired, netw fleet.Network) error {
	var (
		latest  atomic.Pointer[string]
		mu      sync.Mutex
		started bool // the publisher runs (or ran)
		ended   bool // Create returned
		wg      sync.WaitGroup
	)
	done := make(chan struct{})
	pctx := fleet.WithProgress(ctx, func(msg string) {
		latest.Store(&msg)
		mu.Lock()
		defer mu.Unlock()
		if started || ended {
			return
		}
		started = true
		wg.Go(func() {
			t := time.NewTicker(e.w.cfg.ProgressEvery)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					if m := latest.Swap(nil); m != nil {
						_ = e.publish(ctx, d, messages.StateProvisioning, fleet.Instance{}, *m)
					}
				}
			}
		})
	})
	spec := e.spec(d)
	spec.Network = netw
	_, err := e.prov.Create(pctx, spec)
	mu.Lock()
	ended = true
	mu.Unlock()
	close(done)
	wg.Wait()
	return err
}

// egressOf lists the addresses a proxy's plan gave it, as its running
// event carries them (messages.CompactEgress).
func egressOf(in fleet.Instance) []string {
	if len(in.Egress) == 0 {
		return nil
	}
	return messages.CompactEgress(in.Egress)
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (e *executor) spec(d *messages.Desired) fleet.Spec {
	return fleet.Spec{ID: d.ID, Image: d.Image, CPUs: d.CPUs, MemoryMiB: d.MemoryMiB, Labels: d.Labels, CommandID: d.CommandID, SpecHash: d.SpecHash}
}

// firstPoll is the pause before the first read of a booting proxy; each
// pause after it doubles, up to Config.PollInterval.
const firstPoll = 100 * time.Millisecond

// awaitRunning polls Get under the ready budget until the proxy runs with an
// address. The pauses between reads start at firstPoll and double up to
// PollInterval: a proxy that has its address soon is seen soon (a sim host,
// a fast boot), and a long boot costs no more reads than at PollInterval
// alone, give or take a few. The address is seen at most one pause (and
// at most twice the time waited so far) after it shows. The first read
// comes after the first pause: the caller has just created the proxy, or
// read it booting, and a read at once finds it booting still
// (TestBootWaitPollsSoonAfterCreate). After a Create, the first pause is
// longer where the host's boots so far say the proxy cannot be up yet
// (bootGuess), up to PollInterval.
//
// created is when this attempt's Create began (zero if it made none): the
// time from then until the proxy is seen running is observed
// (createRunningSeconds). accepted is as for converge.
func (e *executor) awaitRunning(ctx context.Context, d *messages.Desired, accepted, created time.Time) error {
	w := e.w
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ReadyTimeout)
	defer cancel()
	pause := min(firstPoll, w.cfg.PollInterval)
	t := time.NewTimer(e.boots.firstRead(created, time.Now(), pause, w.cfg.PollInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fleet.Transient(fmt.Errorf("proxy %s not running with an address within %s: %w", d.ID, w.cfg.ReadyTimeout, ctx.Err()))
		case <-t.C:
			pause = min(2*pause, w.cfg.PollInterval)
			t.Reset(pause)
		}
		obs, err := e.prov.Get(ctx, d.ID)
		switch {
		case isNotFound(err):
			return fleet.Transient(fmt.Errorf("proxy %s vanished while starting", d.ID))
		case err != nil && ctx.Err() == nil && fleet.IsTransient(err):
			// A transient read error while waiting: poll again.
		case err != nil:
			return fmt.Errorf("get %s: %w", d.ID, err)
		case obs.State == messages.StateRunning && obs.IP != "":
			if !created.IsZero() {
				w.metrics.createRunning.Observe(time.Since(created).Seconds())
				e.boots.observe(time.Since(created))
			}
			if err := e.publish(ctx, d, messages.StateRunning, obs, ""); err != nil {
				return err
			}
			return e.done(ctx, d, accepted)
		case obs.State == messages.StateFailed:
			return fleet.Transient(fmt.Errorf("proxy %s stopped while starting: %s", d.ID, nonEmpty(obs.Reason, "domain is not running")))
		}
	}
}

// remove deletes the proxy from this host. Only the host a delete was
// dispatched to reports it; a host the proxy moved away from cleans up
// quietly, because the proxy lives on elsewhere.
//
// Delete runs whether or not a domain is there: a delete interrupted after
// the domain went (a call abandoned on a deadline) leaves the proxy's
// volumes, and only the provider's Delete, which converges every artifact
// of the id, removes them. "deleted" is reported only after it succeeded.
func (e *executor) remove(ctx context.Context, d *messages.Desired, present bool) error {
	report := d.Op == messages.OpDelete && d.Host == e.host
	if present && report {
		if err := e.publish(ctx, d, messages.StateDeleting, fleet.Instance{}, ""); err != nil {
			return err
		}
	}
	if err := e.prov.Delete(ctx, d.ID); err != nil {
		return fmt.Errorf("delete %s: %w", d.ID, err)
	}
	e.known.forget(d.ID)
	// Gone from here: its room is free (unless a newer command placed it
	// here again).
	if err := e.w.release(ctx, e.host, d.ID, d.Seq); err != nil {
		return fleet.Transient(err)
	}
	if !report {
		return nil
	}
	if err := e.publish(ctx, d, messages.StateDeleted, fleet.Instance{}, ""); err != nil {
		return err
	}
	return e.done(ctx, d, d.At)
}

// done answers d's command done; accepted is as for converge.
func (e *executor) done(ctx context.Context, d *messages.Desired, accepted time.Time) error {
	err := e.w.answer(ctx, messages.Result{ID: d.ID, CommandID: d.CommandID, Op: d.Op, Outcome: messages.OutcomeDone}, accepted)
	return fleet.Transient(err) // NATS trouble is worth a retry
}

func (e *executor) publish(ctx context.Context, d *messages.Desired, state string, obs fleet.Instance, reason string) error {
	ev := messages.StateEvent{
		ID: d.ID, State: state, Host: e.host, CommandID: d.CommandID, CommandSeq: d.Seq, Reason: reason,
	}
	if state == messages.StateRunning {
		ev.IP, ev.Source, ev.Port = obs.IP, obs.Source, e.w.cfg.ProxyPort
		ev.Egress = egressOf(obs)
	}
	if d.Op == messages.OpCreate {
		ev.Labels = d.Labels
	}
	_, err := e.w.events.Publish(ctx, ev)
	if errors.Is(err, errEventSuperseded) {
		// A newer command has reported on this proxy: what this one
		// would say is old news. Its work goes on; the newer
		// command's work converges after it.
		e.w.log.Info("event not published: a newer command has reported", "host", e.host, "id", d.ID, "state", state, "err", err)
		return nil
	}
	if err != nil {
		return fleet.Transient(err)
	}
	return nil
}

// retryOrFail hands a transiently failed work item back with a backoff
// delay, or fails the command: at once for a permanent error, after
// MaxAttempts for a transient one (with a dead letter). accepted is as for
// converge.
func (e *executor) retryOrFail(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, d *messages.Desired, id string, cause error, accepted time.Time) {
	w := e.w
	attempt := int(meta.NumDelivered)
	class := classOf(cause)
	if ctx.Err() != nil {
		// Stopping: hand the work back for the next owner.
		_ = msg.NakWithDelay(0)
		return
	}
	if class == fleet.ClassTransient && attempt < w.cfg.MaxAttempts {
		delay := w.cfg.Backoff.Delay(attempt)
		w.log.Warn("retrying", "host", e.host, "id", id, "attempt", attempt, "delay", delay, "err", cause)
		if w.cfg.OnRetry != nil {
			w.cfg.OnRetry(RetryInfo{Host: e.host, ID: id, Attempt: attempt, Delay: delay, Err: cause})
		}
		w.stats.retries.Add(1)
		w.metrics.retries.WithLabelValues(string(class), "work").Inc()
		_ = msg.NakWithDelay(delay)
		return
	}
	w.log.Error("failed", "host", e.host, "id", id, "attempt", attempt, "class", class, "err", cause)
	if d != nil {
		e.fail(ctx, d, attempt, class, cause, accepted)
	}
	w.stats.failed.Add(1)
	_ = msg.Term()
}

// fail ends a command that cannot succeed. What it may touch (see "What a
// failed command may touch" in docs/ARCHITECTURE.md):
//
//   - it deletes only a domain that this command made on this host (the
//     mark's command id; a provider sees only its own host entry's domains)
//     and that is not running with an address. A proxy that runs is never
//     deleted by a failure, whatever failed: a read, a publish, a wait;
//   - it publishes "failed" only when no healthy proxy is there: a proxy
//     that runs keeps its state and its place in the rotation, and a proxy
//     that cannot be read keeps its last state (a read error is not news);
//   - the result says failed, with the class and reason; a transient cause
//     also leaves a dead letter.
func (e *executor) fail(ctx context.Context, d *messages.Desired, attempt int, class fleet.Class, cause error, accepted time.Time) {
	w := e.w
	id := d.ID
	publishState := true
	if e.owns(d) {
		publishState = e.undoCreate(ctx, d)
	}
	if publishState {
		ev := messages.StateEvent{ID: id, State: messages.StateFailed, Host: e.host, CommandID: d.CommandID,
			CommandSeq: d.Seq, Reason: cause.Error(), Class: string(class)}
		if _, err := w.events.Publish(ctx, ev); err != nil && !errors.Is(err, errEventSuperseded) {
			w.log.Error("publish failed state", "id", id, "err", err)
		}
	}
	if class == fleet.ClassTransient {
		body, _ := json.Marshal(d)
		w.deadLetter(ctx, id, d.CommandID, d.Op, d.Seq, attempt, cause, body, accepted)
		return
	}
	if err := w.answer(ctx, messages.Result{ID: id, CommandID: d.CommandID, Op: d.Op,
		Outcome: messages.OutcomeFailed, Reason: cause.Error(), Class: string(class)}, accepted); err != nil {
		w.log.Error("publish failed result", "id", id, "err", err)
	}
}

// undoCreate removes what the failed create d made, if anything, and
// reports whether the proxy may be reported failed: true when nothing
// healthy is left of it, false when it runs, or cannot be read and was last
// seen running here.
func (e *executor) undoCreate(ctx context.Context, d *messages.Desired) bool {
	w := e.w
	in, err := e.prov.Get(ctx, d.ID)
	switch {
	case isNotFound(err):
		return true
	case err != nil:
		// Unreadable: nothing is deleted, and a proxy last seen running
		// here keeps that state (a read error is not news). One never
		// seen running (a new proxy on a host that refuses us) is failed.
		w.log.Warn("failed create: proxy unreadable, left as it is", "host", e.host, "id", d.ID, "err", err)
		last, _, lerr := w.events.last(ctx, d.ID)
		return lerr == nil && !(last.State == messages.StateRunning && last.Host == e.host)
	case in.State == messages.StateRunning && in.IP != "":
		w.log.Info("failed command: the proxy runs, left as it is", "host", e.host, "id", d.ID,
			"command_id", d.CommandID, "made_by", in.CommandID)
		return false
	case in.CommandID != d.CommandID:
		w.log.Info("failed create: the domain is not this command's, left as it is", "host", e.host, "id", d.ID,
			"command_id", d.CommandID, "made_by", in.CommandID)
		return true
	}
	if err := e.prov.Delete(ctx, d.ID); err != nil {
		w.log.Error("clean up failed create", "host", e.host, "id", d.ID, "err", err)
	}
	return true
}

func isNotFound(err error) bool { return fleet.ClassOf(err) == fleet.ClassNotFound }
