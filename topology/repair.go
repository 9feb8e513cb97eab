package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// RepairerConfig configures a Repairer.
type RepairerConfig struct {
	// Interval between two checks (default 5s).
	Interval time.Duration
	// Timeout bounds one check (default Interval, at least 5s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Repairer keeps the streams and buckets of a topology in place: every
// Interval it checks that each exists and recreates any that was deleted,
// with Setup's settings, logging each repair at error level and counting it.
// It remembers the last sequence it saw of PROXY_CMDS and PROXY_EVENTS and
// recreates them with a first sequence above it (plus FirstSeqMargin), so
// command sequences (which order a proxy's commands) and event seqs (which
// the health fold and watchers order by) keep growing. It needs an admin
// credential; `serve` runs one on its embedded server.
//
// It changes nothing that exists: settings are Setup's business.
type Repairer struct {
	topo Topology
	js   jetstream.JetStream
	cfg  RepairerConfig
	log  *slog.Logger

	repairs atomic.Int64
	mu      sync.Mutex
	seen    map[string]uint64 // last sequence seen, by stream
}

// NewRepairer returns a repairer of t on js. Call Run to run it.
func NewRepairer(js jetstream.JetStream, t Topology, cfg RepairerConfig) *Repairer {
	cfg = cfg.WithDefaults()
	return &Repairer{
		topo: t.WithDefaults(), js: js, cfg: cfg, log: cfg.Logger,
		seen: map[string]uint64{},
	}
}

// Repairs is the number of streams and buckets recreated so far.
func (r *Repairer) Repairs() int64 { return r.repairs.Load() }

// Setup runs Topology.Setup, creating any missing stream above the
// sequences this repairer has seen.
func (r *Repairer) Setup(ctx context.Context) ([]Change, error) {
	return r.topo.setup(ctx, r.js, r.floors())
}

// Run checks every Interval, the first time at once, until ctx is done;
// then it returns nil, having waited for the check running. It fails when
// its NATS connection is closed for good.
func (r *Repairer) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if r.js.Conn().IsClosed() {
			return fmt.Errorf("repairer: %w", nats.ErrConnectionClosed)
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		r.Check(cctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *Repairer) floors() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.seen)
}

// Check looks at every stream and bucket once and recreates what is
// missing. It returns the number recreated.
func (r *Repairer) Check(ctx context.Context) int {
	type item struct {
		kind, name, stream string
		create             func(first func() (uint64, error)) (*Change, error)
	}
	var items []item
	for _, sc := range r.topo.Streams() {
		items = append(items, item{"stream", sc.Name, sc.Name, func(first func() (uint64, error)) (*Change, error) {
			return setupStream(ctx, r.js, sc, first)
		}})
	}
	for _, kc := range r.topo.Buckets() {
		items = append(items, item{"bucket", kc.Bucket, BucketStream(kc.Bucket), func(first func() (uint64, error)) (*Change, error) {
			return setupBucket(ctx, r.js, kc, first)
		}})
	}
	n := 0
	for _, it := range items {
		st, err := r.js.Stream(ctx, it.stream)
		switch {
		case err == nil:
			r.mu.Lock()
			r.seen[it.stream] = max(r.seen[it.stream], st.CachedInfo().State.LastSeq)
			r.mu.Unlock()
			continue
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			if ctx.Err() == nil {
				r.log.Warn("repairer: look up "+it.kind, it.kind, it.name, "err", err)
			}
			continue
		}
		r.mu.Lock()
		floor := r.seen[it.stream]
		r.mu.Unlock()
		c, err := it.create(func() (uint64, error) { return firstSeq(ctx, r.js, it.stream, floor) })
		r.report(it.kind, it.name, c, err)
		if c == nil || !c.Created {
			continue
		}
		n++
		if it.name == messages.BucketRotation {
			r.republishRotation(ctx)
		}
	}
	return n
}

// republishRotation empties PROXY_LEASES after PROXY_ROTATION was
// recreated: the publishing health process loses its lease, takes it again,
// and a process that takes the lease writes the whole rotation anew. (The
// publisher writes only what changed since its last write, so without this
// the proxies already in the rotation would stay missing from the new
// bucket until they change.)
func (r *Repairer) republishRotation(ctx context.Context) {
	st, err := r.js.Stream(ctx, BucketStream(messages.BucketLeases))
	if err == nil {
		err = st.Purge(ctx)
	}
	if err != nil {
		r.log.Error("repairer: empty bucket "+messages.BucketLeases+" so the rotation is written anew", "err", err)
		return
	}
	r.log.Warn("repairer: emptied bucket " + messages.BucketLeases + ": the health publisher takes its lease again and writes the whole rotation")
}

func (r *Repairer) report(kind, name string, c *Change, err error) {
	switch {
	case err != nil:
		r.log.Error(fmt.Sprintf("repairer: %s %s is missing and could not be recreated", kind, name), "err", err)
	case c != nil && c.Created:
		r.repairs.Add(1)
		r.log.Error(fmt.Sprintf("repairer: %s %s was deleted: recreated it", kind, name),
			"first_seq", c.FirstSeq, "repairs", r.repairs.Load())
	}
}
