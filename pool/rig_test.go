package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"proxyfleet/addrplan"
	"proxyfleet/client"
	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/pool"
	"proxyfleet/rotation"
	"proxyfleet/sim"
	"proxyfleet/topology"
	"proxyfleet/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var subj = messages.NewSubjects("")

// rig is a fleet on sim hosts in one process: an embedded nats-server
// set up as `proxyfleet setup` would, a worker, a health process, pool
// controllers, a client, and a follower of the rotation that samples it
// every 100 ms.
type rig struct {
	t      *testing.T
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	cl     *client.Client
	dir    string
	hosts  []string
	drv    map[string]*sim.Driver
	rot    *rotation.Rotation
	log    *slog.Logger
	ctrls  []*pool.Controller
	runs   []*runtest.Running
	sample *sampler
	// reg, if set, gets the metrics of the next controller started.
	reg prometheus.Registerer

	mu sync.Mutex
	// createCmds are the create commands published, by proxy id: each
	// publish's command id and when it was seen.
	createCmds map[string][]published
}

type published struct {
	cmdID string
	at    time.Time
}

func newRig(t *testing.T, hosts ...string) *rig {
	t.Helper()
	return newRigPlans(t, nil, hosts...)
}

// newRigPlans is newRig whose hosts have the address plans of plans (by
// host; nil: none).
func newRigPlans(t *testing.T, plans map[string]addrplan.Config, hosts ...string) *rig {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	r := &rig{t: t, srv: srv, nc: nc, js: js, dir: t.TempDir(), hosts: hosts, drv: map[string]*sim.Driver{},
		createCmds: map[string][]published{}}
	level := slog.LevelWarn
	if os.Getenv("POOL_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	r.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx := ctxFor(t, 20*time.Second)
	if _, err := (topology.Topology{Subjects: subj}).Setup(ctx, js); err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe(subj.CreateAll(), func(m *nats.Msg) {
		id := strings.TrimPrefix(m.Subject, subj.Prefix+".cmd.create.")
		r.mu.Lock()
		r.createCmds[id] = append(r.createCmds[id], published{m.Header.Get(jetstream.MsgIDHeader), time.Now()})
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	provs := map[string]worker.Provider{}
	for _, h := range hosts {
		d, err := sim.New(sim.Config{Host: h, Dir: filepath.Join(r.dir, h), BootDelay: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		r.drv[h], provs[h] = d, d
	}
	cat := worker.Catalog{Hosts: hosts, Images: []string{"img"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128}
	for h, pc := range plans {
		p, err := addrplan.New(h, pc)
		if err != nil {
			t.Fatal(err)
		}
		if cat.Plans == nil {
			cat.Plans = map[string]*addrplan.Plan{}
		}
		cat.Plans[h] = p
	}
	w, err := worker.New(r.conn(), worker.Config{
		Subjects: subj, Catalog: cat,
		Providers: provs, PollInterval: 10 * time.Millisecond, CheckInterval: 200 * time.Millisecond,
		ObserveInterval: 200 * time.Millisecond, MaxAttempts: 3, Logger: r.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, w.Run, w.Started(), time.Minute)
	h, err := health.New(r.conn(), health.Config{Subjects: subj, HTTPAddr: health.NoHTTP, Logger: r.log, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, h.Run, h.Started(), time.Minute)
	if r.cl, err = client.New(nc, ""); err != nil {
		t.Fatal(err)
	}
	if r.rot, err = rotation.Follow(ctx, nc, rotation.Config{Subjects: subj, Logger: r.log}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.rot.Close() })
	r.sample = startSampler(t, r.rot)
	return r
}

// conn is a JetStream context on a connection of its own.
func (r *rig) conn() jetstream.JetStream {
	_, js := r.srv.Connect(r.t)
	return js
}

// controller starts a pool controller on a connection of its own; stop
// closes that connection first when crash is set (no lease released).
func (r *rig) controller(id string) (*pool.Controller, *nats.Conn, *runtest.Running) {
	r.t.Helper()
	nc, err := nats.Connect(r.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	var hs []pool.Host
	for _, h := range r.hosts {
		hs = append(hs, pool.Host{Name: h, MaxProxies: 100})
	}
	c, err := pool.New(nc, pool.Config{
		Subjects: subj, ID: id, Hosts: hs, Images: []string{"img"}, DefaultImage: "img",
		Interval: 200 * time.Millisecond, LeaseTTL: time.Second, BackoffInitial: 500 * time.Millisecond, BackoffMax: 2 * time.Second,
		CheckInterval: 200 * time.Millisecond, Logger: r.log.With("controller", id), Registry: r.reg,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	run := runtest.Start(r.t, c.Run, c.Started(), time.Minute)
	r.ctrls = append(r.ctrls, c)
	r.runs = append(r.runs, run)
	return c, nc, run
}

// set publishes a pool set and, with wait, waits for its final answer.
func (r *rig) set(cmd messages.PoolSet, wait bool) client.Outcome {
	r.t.Helper()
	ctx := ctxFor(r.t, time.Minute)
	o, err := r.cl.PoolSet(ctx, cmd, "", wait)
	if err != nil {
		r.t.Fatalf("pool set %s: %v (%+v)", cmd.Name, err, o)
	}
	return o
}

// pool reads a pool's status.
func (r *rig) pool(name string) (client.PoolStatus, error) {
	ctx := ctxFor(r.t, 10*time.Second)
	return r.cl.Pool(ctx, name)
}

// inRotation lists the members of pool name in the rotation now.
func (r *rig) inRotation(name string) []string {
	var out []string
	for _, p := range r.rot.Proxies() {
		if strings.HasPrefix(p.ID, name+"-") {
			out = append(out, p.ID)
		}
	}
	return out
}

// waitReady waits until the pool has n members in the rotation and its
// record says ready with n live members.
func (r *rig) waitReady(name string, n int, bound time.Duration) client.PoolStatus {
	r.t.Helper()
	var st client.PoolStatus
	var err error
	if !poll.WaitEvery(bound, 50*time.Millisecond, func() bool {
		st, err = r.pool(name)
		return err == nil && st.Record.State == messages.PoolReady && st.Summary.Live == n && st.Summary.Ready == n &&
			len(r.inRotation(name)) == n
	}) {
		r.t.Fatalf("pool %s not ready with %d within %s: %+v, %v (in the rotation: %d)", name, n, bound, st.Summary, err, len(r.inRotation(name)))
	}
	return st
}

// domains lists the sim domains of every host.
func (r *rig) domains() []string {
	var out []string
	for _, h := range r.hosts {
		names, _ := filepath.Glob(filepath.Join(r.dir, h, "domains", "*.json"))
		for _, n := range names {
			out = append(out, strings.TrimSuffix(filepath.Base(n), ".json"))
		}
	}
	slices.Sort(out)
	return out
}

// hostOf is the host a domain is on ("" if none).
func (r *rig) hostOf(id string) string {
	for _, h := range r.hosts {
		if _, err := os.Stat(filepath.Join(r.dir, h, "domains", id+".json")); err == nil {
			return h
		}
	}
	return ""
}

// creates counts the sim hosts' creates (creates.log) per id.
func (r *rig) creates() map[string]int {
	out := map[string]int{}
	for _, h := range r.hosts {
		b, _ := os.ReadFile(filepath.Join(r.dir, h, "creates.log"))
		for line := range strings.Lines(string(b)) {
			if id, _, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
				out[id]++
			}
		}
	}
	return out
}

// desired reads every record of PROXY_DESIRED.
func (r *rig) desired() map[string]messages.Desired {
	ctx := ctxFor(r.t, 10*time.Second)
	kv, err := r.js.KeyValue(ctx, messages.BucketDesired)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]messages.Desired{}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return out
	}
	if err != nil {
		r.t.Fatal(err)
	}
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if err != nil {
			r.t.Fatal(err)
		}
		var d messages.Desired
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			r.t.Fatal(err)
		}
		out[k] = d
	}
	return out
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// sampler records, every 100 ms, which members of each pool the rotation
// holds.
type sampler struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at      time.Time
	members map[string][]string // by pool (the id's prefix before its suffix)
}

func startSampler(t *testing.T, rot *rotation.Rotation) *sampler {
	s := &sampler{}
	runtest.Go(t, func(ctx context.Context) error {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			smp := sample{at: time.Now(), members: map[string][]string{}}
			for _, p := range rot.Proxies() {
				if i := strings.LastIndexByte(p.ID, '-'); i > 0 {
					smp.members[p.ID[:i]] = append(smp.members[p.ID[:i]], p.ID)
				}
			}
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	})
	return s
}

// since returns the samples taken after t.
func (s *sampler) since(t time.Time) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sample
	for _, smp := range s.samples {
		if smp.at.After(t) {
			out = append(out, smp)
		}
	}
	return out
}

// fewest is the fewest members of pool name in any sample after t, and
// when.
func (s *sampler) fewest(name string, t time.Time) (int, time.Time, int) {
	least, at, n := -1, time.Time{}, 0
	for _, smp := range s.since(t) {
		n++
		if c := len(smp.members[name]); least < 0 || c < least {
			least, at = c, smp.at
		}
	}
	return least, at, n
}

// createsOf returns the first publish of each member of pool name's
// create, in order, and whether any member's create had two command ids.
func (r *rig) createsOf(name string) (first []published, twice []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ps := range r.createCmds {
		if !strings.HasPrefix(id, name+"-") {
			continue
		}
		first = append(first, ps[0])
		for _, p := range ps[1:] {
			if p.cmdID != ps[0].cmdID {
				twice = append(twice, fmt.Sprintf("%s: %s and %s", id, ps[0].cmdID, p.cmdID))
			}
		}
	}
	slices.SortFunc(first, func(a, b published) int { return a.at.Compare(b.at) })
	return first, twice
}

// pollWait is poll.WaitEvery at 50 ms: conditions here read buckets.
func pollWait(bound time.Duration, cond func() bool) bool {
	return poll.WaitEvery(bound, 50*time.Millisecond, cond)
}
