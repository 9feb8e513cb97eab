package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/sim"
	"proxyfleet/worker"
)

var subj = messages.NewSubjects("")

// rig is an embedded server, sim hosts in a temp dir, and a recorder of
// every result and state event.
type rig struct {
	t     testing.TB
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	dir   string
	hosts []string
	// conn are the options every connection of the rig uses (a user).
	conn []nats.Option

	mu      sync.Mutex
	results []messages.Result
	events  map[string][]messages.StateEvent

	runs sync.Map // *worker.Worker → *runtest.Running, of startWorker
}

func newRig(t testing.TB, hosts ...string) *rig {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"h1", "h2"}
	}
	return newRigOn(t, natstest.Start(t), nil, hosts...)
}

// newRigOn is newRig on a server of the caller's, connecting with opt (nil
// for none).
func newRigOn(t testing.TB, srv *natstest.Server, opt nats.Option, hosts ...string) *rig {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"h1", "h2"}
	}
	var conn []nats.Option
	if opt != nil {
		conn = append(conn, opt)
	}
	nc, js := srv.Connect(t, conn...)
	r := &rig{t: t, srv: srv, nc: nc, js: js, dir: t.TempDir(), hosts: hosts, conn: conn, events: map[string][]messages.StateEvent{}}
	record := func(m *nats.Msg) {
		switch {
		case strings.HasPrefix(m.Subject, subj.Prefix+".result."):
			var res messages.Result
			if json.Unmarshal(m.Data, &res) == nil {
				r.mu.Lock()
				r.results = append(r.results, res)
				r.mu.Unlock()
			}
		case strings.HasPrefix(m.Subject, subj.Prefix+".state."):
			var ev messages.StateEvent
			if json.Unmarshal(m.Data, &ev) == nil {
				r.mu.Lock()
				r.events[ev.ID] = append(r.events[ev.ID], ev)
				r.mu.Unlock()
			}
		}
	}
	// Results and events only, as a client would (a core subscriber on a
	// subject makes a JetStream publish to it wait out its timeout, rather
	// than fail at once, while its stream is missing), through one channel
	// so that they are recorded in the order the server sent them.
	msgs := make(chan *nats.Msg, 1<<16)
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case m := <-msgs:
				record(m)
			case <-stop:
				return
			}
		}
	}()
	var subs []*nats.Subscription
	for _, s := range []string{subj.ResultAll(), subj.StateAll()} {
		sub, err := nc.ChanSubscribe(s, msgs)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	t.Cleanup(func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
		close(stop)
		<-stopped
	})
	return r
}

func (r *rig) hostDir(h string) string { return filepath.Join(r.dir, h) }

type workerOpt func(*worker.Config)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("PROXYFLEET_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quietLogger()
}

// startWorker runs a worker on its own connection, executing every host.
func (r *rig) startWorker(opts ...workerOpt) *worker.Worker {
	r.t.Helper()
	return r.startWorkerAs(nil, opts...)
}

// startWorkerAs is startWorker connecting with opt instead of the rig's
// connection options (another user, say); nil means the rig's.
func (r *rig) startWorkerAs(opt nats.Option, opts ...workerOpt) *worker.Worker {
	r.t.Helper()
	conn := r.conn
	if opt != nil {
		conn = []nats.Option{opt}
	}
	// Refusals (a test's user without a permission) are what the test is
	// about; the default handler would print each one.
	conn = append(conn, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	nc, _ := r.srv.Connect(r.t, conn...)
	// A request the server never answers (a refused publish) fails after
	// a second, not the default five.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Second))
	if err != nil {
		r.t.Fatal(err)
	}
	provs := map[string]worker.Provider{}
	for _, h := range r.hosts {
		d, err := sim.New(sim.Config{Host: h, Dir: r.hostDir(h), Delay: time.Millisecond})
		if err != nil {
			r.t.Fatal(err)
		}
		provs[h] = d
	}
	cfg := worker.Config{
		Subjects:  subj,
		Catalog:   worker.Catalog{Hosts: r.hosts, Images: []string{"img", "img2"}, DefaultImage: "img", DefaultCPUs: 1, DefaultMemoryMiB: 128},
		Providers: provs,
		AckWait:   5 * time.Second, MaxAttempts: 5,
		ReadyTimeout: 10 * time.Second, PollInterval: 20 * time.Millisecond,
		PinnedTTL: 2 * time.Second, DrainTimeout: 5 * time.Second,
		Heartbeat: 250 * time.Millisecond, Liveness: 1500 * time.Millisecond,
		Backoff: worker.ExpBackoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:  testLogger(r.t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.setup(ctx, cfg)
	w, err := worker.New(js, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.runs.Store(w, runtest.Start(r.t, w.Run, w.Started(), 10*time.Second))
	return w
}

// stopWorker stops w, started by startWorker: it drains. It returns what
// w's Run returned.
func (r *rig) stopWorker(w *worker.Worker) error {
	r.t.Helper()
	run, _ := r.runs.Load(w)
	return run.(*runtest.Running).Stop()
}

// setup creates the streams and buckets a worker of cfg needs, as
// `proxyfleet setup` does, on the rig's own (admin) connection.
func (r *rig) setup(ctx context.Context, cfg worker.Config) {
	r.t.Helper()
	topo := cfg.Topology
	topo.Subjects = cfg.Subjects
	if _, err := topo.Setup(ctx, r.js); err != nil {
		r.t.Fatalf("setup: %v", err)
	}
}

// publish sends a command body on subject with an optional message id and
// returns its stream sequence.
func (r *rig) publish(subject string, body []byte, msgID string) uint64 {
	r.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = body
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := r.js.PublishMsg(ctx, m)
	if err != nil {
		r.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

func (r *rig) create(id, msgID string, extra string) uint64 {
	return r.publish(subj.Create(id), []byte(fmt.Sprintf(`{"v":1,"id":%q%s}`, id, extra)), msgID)
}

func (r *rig) delete(id, msgID string) uint64 {
	return r.publish(subj.Delete(id), []byte(fmt.Sprintf(`{"v":1,"id":%q}`, id)), msgID)
}

// resultsFor returns the results of one command id.
func (r *rig) resultsFor(cmdID string) []messages.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []messages.Result
	for _, res := range r.results {
		if res.CommandID == cmdID {
			out = append(out, res)
		}
	}
	return out
}

// waitFor polls cond until it holds or the generous bound passes.
func (r *rig) waitFor(what string, bound time.Duration, cond func() bool) {
	r.t.Helper()
	poll.Until(r.t, what, bound, cond)
}

func (r *rig) waitOutcome(cmdID string, outcome string) messages.Result {
	r.t.Helper()
	var got messages.Result
	r.waitFor("result "+outcome+" of "+cmdID, 30*time.Second, func() bool {
		for _, res := range r.resultsFor(cmdID) {
			if res.Outcome == outcome {
				got = res
				return true
			}
		}
		return false
	})
	return got
}

// lastEvent reads the latest event of id from PROXY_EVENTS.
func (r *rig) lastEvent(id string) (messages.StateEvent, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := r.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		r.t.Fatal(err)
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj.State(id))
	if err != nil {
		return messages.StateEvent{}, false
	}
	var ev messages.StateEvent
	if err := json.Unmarshal(raw.Data, &ev); err != nil {
		r.t.Fatal(err)
	}
	return ev, true
}

// deadLetter reads the latest dead letter of id from PROXY_DEAD.
func (r *rig) deadLetter(id string) (messages.DeadLetter, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := r.js.Stream(ctx, messages.StreamDead)
	if err != nil {
		r.t.Fatal(err)
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj.Dead(id))
	if err != nil {
		return messages.DeadLetter{}, false
	}
	var dl messages.DeadLetter
	if err := json.Unmarshal(raw.Data, &dl); err != nil {
		r.t.Fatal(err)
	}
	return dl, true
}

func (r *rig) domainExists(host, id string) bool {
	_, err := os.Stat(filepath.Join(r.hostDir(host), "domains", id+".json"))
	return err == nil
}

func readLines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(strings.ReplaceAll(string(b), "\n", "\n "))
}
