package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// A host's record in PROXY_HOSTS (messages.HostRecord) is changed only with
// compare-and-set on its revision. Within a worker, one writer per host
// applies every change: it takes the changes that arrived while it wrote
// the last batch, reads the record, applies them and writes them as one (so
// fifty intakes reserving at once cost a few reads and writes, not fifty
// serial ones), and reads again and applies them again after losing a race
// to another worker. A batch is stored only by a compare-and-set on the
// revision it was judged on, so every change is judged on the record as it
// is: it starts from the newest record the worker knows and reads afresh
// when that was behind, and a change found unneeded on a record it knew
// (a reservation already there) is judged again on a fresh read.

// errNoChange, from an edit, leaves the record as it is.
var errNoChange = errors.New("no change")

// errStopped answers a change asked of a stopped worker.
var errStopped = errors.New("worker stopped")

// hostBatch is the most changes a writer takes into one write, and the
// changes that wait for it: a burst of creates spreads over the hosts, and
// every worker has a writer for each host of the catalog.
const hostBatch = 64

// The outcomes of a host record's write (metrics.hostWrites).
const (
	hostWriteStored   = "stored"
	hostWriteStale    = "stale"
	hostWriteConflict = "conflict"
)

// maxHostWrites bounds the compare-and-set attempts of one batch.
const maxHostWrites = 100

// hostEdit is one change: edit changes the record and returns nil, or
// returns an error (errNoChange included) without having changed it.
type hostEdit struct {
	edit func(*messages.HostRecord) error
	done chan error // buffered: the writer never waits for the caller
}

// hostWriter applies the changes of one host's record.
type hostWriter struct {
	w       *Worker
	host    string
	reqs    chan hostEdit
	running bool // its goroutine runs (see wake); under w.writersMu

	// The last record read, as stored and decoded: a read that finds the
	// same bytes skips decoding them again (with a thousand proxies they
	// are tens of KiB of JSON, and intake reads every host's record for
	// each create it places).
	readMu  sync.Mutex
	readRaw []byte
	readRec messages.HostRecord
}

// startWriters makes a writer for every host of the catalog and opens
// stageWriters; stopping that stage (drain, or stopWriters) ends them. A
// writer's goroutine runs only while it has changes to make (wake): a
// worker of a catalog of 500 hosts pulls its share of them, and a
// goroutine parked for each of the others cost its stack for nothing.
func (w *Worker) startWriters() {
	w.writers = map[string]*hostWriter{}
	for _, h := range w.catalog.Hosts {
		w.writers[h] = &hostWriter{w: w, host: h, reqs: make(chan hostEdit, hostBatch)}
	}
	w.life.open(stageWriters)
}

func (w *Worker) stopWriters() { w.life.stop(stageWriters) }

// wake starts hw's goroutine unless it runs: called after each change is
// queued, so a change never waits without one (run ends only when it
// finds none queued, under the same lock).
func (hw *hostWriter) wake() {
	w := hw.w
	w.writersMu.Lock()
	defer w.writersMu.Unlock()
	if hw.running {
		return
	}
	hw.running = w.life.goIn(stageWriters, hw.run)
}

// idle ends the writer's run if no change is queued.
func (hw *hostWriter) idle() bool {
	hw.w.writersMu.Lock()
	defer hw.w.writersMu.Unlock()
	if len(hw.reqs) > 0 {
		return false
	}
	hw.running = false
	return true
}

// updateHost applies edit to host's record (see hostEdit) and returns its
// error (nil for errNoChange), or the write's. A caller whose ctx ends
// stops waiting; its change may still be made.
func (w *Worker) updateHost(ctx context.Context, host string, edit func(*messages.HostRecord) error) error {
	hw := w.writers[host]
	if hw == nil {
		return fmt.Errorf("host %s: not in the catalog", host)
	}
	e := hostEdit{edit: edit, done: make(chan error, 1)}
	select {
	case hw.reqs <- e:
		hw.wake()
	case <-ctx.Done():
		return ctx.Err()
	case <-w.life.done(stageWriters):
		return errStopped
	}
	select {
	case err := <-e.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-w.life.done(stageWriters):
		return errStopped
	}
}

func (hw *hostWriter) run(ctx context.Context) {
	for {
		var batch []hostEdit
		select {
		case <-ctx.Done():
			return
		case e := <-hw.reqs:
			batch = append(batch, e)
		}
	more:
		for len(batch) < cap(hw.reqs) {
			select {
			case e := <-hw.reqs:
				batch = append(batch, e)
			default:
				break more
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		errs := hw.apply(wctx, batch)
		cancel()
		for i, e := range batch {
			e.done <- errs[i]
		}
		if hw.idle() {
			return
		}
	}
}

// apply makes the changes of batch in one write and returns each one's
// error.
func (hw *hostWriter) apply(ctx context.Context, batch []hostEdit) []error {
	w := hw.w
	errs := make([]error, len(batch))
	all := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// The first attempt starts from the newest record this worker knows
	// (its view's, which holds its own writes at once) instead of reading
	// it: the compare-and-set on its revision stores the batch only if the
	// record is still that one, so the edits were judged on the record as
	// it is. A guess that was behind loses the write and reads afresh, as
	// after losing a race; a batch that changed nothing on a guess is
	// judged again on a fresh read. (A read for every batch was most of
	// the reads of host records, a record of a hundred proxies a read.)
	guess := true
	for attempt := 0; attempt < maxHostWrites; attempt++ {
		rec, rev, ok := w.hostView.latest(hw.host)
		var err error
		if !guess || !ok {
			guess = false
			if rec, rev, err = w.readHost(ctx, hw.host); err != nil {
				return all(err)
			}
		}
		if rec.State == "" {
			rec.State = messages.HostOK
		}
		// The record read or viewed is shared: the edits change a copy.
		rec.Proxies = maps.Clone(rec.Proxies)
		if rec.Proxies == nil {
			rec.Proxies = map[string]uint64{}
		}
		changed := false
		for i, e := range batch {
			errs[i] = e.edit(&rec)
			switch {
			case errs[i] == nil:
				changed = true
			case errors.Is(errs[i], errNoChange):
				errs[i] = nil
			}
		}
		if !changed && rev != 0 {
			if guess {
				guess = false
				continue
			}
			return errs
		}
		rec.V, rec.Host, rec.MaxProxies, rec.At = messages.Version, hw.host, w.catalog.maxProxies(hw.host), time.Now().UTC()
		rec.Plan = w.catalog.planConfig(hw.host)
		if rec.Since.IsZero() {
			rec.Since = rec.At
		}
		b, _ := json.Marshal(rec)
		var wrote uint64
		if rev == 0 {
			wrote, err = w.hosts.Create(ctx, hw.host, b)
		} else {
			wrote, err = w.hosts.Update(ctx, hw.host, b, rev)
		}
		if err == nil {
			w.metrics.hostWrites.WithLabelValues(hostWriteStored).Inc()
			// What the next read finds, unless another worker writes: the
			// view's record of that revision (put here), or without a view
			// this copy. Both would keep every record the worker wrote
			// twice, the stored bytes once more.
			hw.readMu.Lock()
			if w.hostView != nil {
				hw.readRec, hw.readRaw = messages.HostRecord{}, nil
			} else {
				hw.readRec, hw.readRaw = rec, b
			}
			hw.readMu.Unlock()
			w.hostView.put(hw.host, rec, wrote) // this worker's next placements see it at once
			return errs
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSeq(err) {
			return all(fmt.Errorf("write host record of %s: %w", hw.host, err))
		}
		if guess {
			w.metrics.hostWrites.WithLabelValues(hostWriteStale).Inc()
			guess = false // the view was behind: read it, at once
			continue
		}
		w.metrics.hostWrites.WithLabelValues(hostWriteConflict).Inc()
		// Another worker wrote it: read it again, after a short random
		// pause that spreads the writers' retries.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond) * int64(min(attempt+1, 10)))))
		select {
		case <-ctx.Done():
			t.Stop()
			return all(ctx.Err())
		case <-t.C:
		}
	}
	return all(fmt.Errorf("write host record of %s: lost the race %d times", hw.host, maxHostWrites))
}

// readHost reads host's record from the server; a host with none has an
// empty one (revision 0). Every read asks the server; a record of the
// bytes read last is not decoded again. The record's Proxies map is
// shared with other readers: never change it.
func (w *Worker) readHost(ctx context.Context, host string) (messages.HostRecord, uint64, error) {
	// No Plan here: a record is decoded into rec, and decoding into a
	// plan would write into the catalog's.
	rec := messages.HostRecord{V: messages.Version, Host: host, MaxProxies: w.catalog.maxProxies(host), State: messages.HostOK}
	e, err := w.hosts.Get(ctx, host)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rec.Plan = w.catalog.planConfig(host)
		return rec, 0, nil
	}
	if err != nil {
		return rec, 0, fmt.Errorf("read host record of %s: %w", host, err)
	}
	hw := w.writers[host]
	if viewed, ok := w.hostView.at(host, e.Revision()); ok {
		// Decoded by the view already: no decode, and no copy kept here
		// (with 500 hosts of 100 proxies, a second copy of every record
		// in every worker).
		if hw != nil {
			hw.readMu.Lock()
			hw.readRec, hw.readRaw = messages.HostRecord{}, nil
			hw.readMu.Unlock()
		}
		return viewed, e.Revision(), nil
	}
	if hw != nil {
		hw.readMu.Lock()
		cached, ok := hw.readRec, hw.readRaw != nil && bytes.Equal(hw.readRaw, e.Value())
		hw.readMu.Unlock()
		if ok {
			return cached, e.Revision(), nil
		}
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, 0, fmt.Errorf("decode host record of %s: %w", host, err)
	}
	if rec.State == "" {
		rec.State = messages.HostOK
	}
	if hw != nil {
		hw.readMu.Lock()
		hw.readRec, hw.readRaw = rec, e.Value()
		hw.readMu.Unlock()
	}
	return rec, e.Revision(), nil
}
