package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// eventView is the worker process's view of the last state event of every
// proxy, by host, for the observation passes to choose the proxies they
// look at: a pass reads only its own host's entries, so its cost does not
// grow with the whole event stream.
//
// One long-lived ordered consumer on the state subjects of PROXY_EVENTS
// feeds it: first the last event of every subject, then every event as it
// is stored. It may lag behind the stream: a pass only chooses ids from it,
// and observeOne reads each one's last event again under its lock.
//
// A "deleted" event removes the proxy from the view: the stream drops it
// after DeletedTTL without telling consumers, and to a pass a deleted
// proxy and one with no event are looked at alike (see observe).
//
// It keeps of each event only what a pass chooses and compares by, its
// state, seq and address (viewedEvent), and one copy of each host's name:
// whole events cost about 700 bytes a proxy, 35 MB with 50,000 proxies
// (BenchmarkEventViewOf50000; 170 bytes now, 8 MB). And it keeps only the
// proxies of the hosts the worker pulls (keep): every worker reads every
// event, but holds its share of the fleet, not the fleet (a tenth of it
// with ten workers: 9 MB of each worker's heap at 50,000 before). A host
// it comes to pull makes the view anew, from the last event of every
// proxy, as at start: passes wait for it to catch up, as at start.
//
// Any error the consumer reports (its consumer deleted, as when the stream
// is deleted and made anew; heartbeats missed; a reset that failed) makes
// the view anew from a fresh consumer: the ordered consumer's own reset
// would resume after the last stream sequence it saw, which is wrong for a
// stream made anew.
type eventView struct {
	js   jetstream.JetStream
	subj messages.Subjects
	// prefix is that of the events' subjects, before the id.
	prefix string
	log    *slog.Logger
	retry  time.Duration

	// keep says which hosts' proxies the view holds: those whose run
	// this worker pulls or means to (nil: every host). A host it comes
	// to want makes the view anew (refollow), one it gives up is dropped.
	keep  func(host string) bool
	again chan struct{} // refollow's request, for follow

	mu     sync.Mutex
	host   map[string]string                 // id → host of its last event
	byHost map[string]map[string]viewedEvent // host → id → last event
	names  map[string]string                 // every host name seen, once
	ready  chan struct{}                     // closed once caught up; made anew with the view
}

// viewedEvent is what the view keeps of a proxy's last event.
type viewedEvent struct {
	State string // one of the messages.State constants, or "" for another
	Seq   uint64
	IP    string
}

func newEventView(js jetstream.JetStream, subj messages.Subjects, retry time.Duration, log *slog.Logger) *eventView {
	return &eventView{js: js, subj: subj, prefix: strings.TrimSuffix(subj.StateAll(), ">"), log: log, retry: retry, again: make(chan struct{}, 1),
		host: map[string]string{}, byHost: map[string]map[string]viewedEvent{}, names: map[string]string{}, ready: make(chan struct{})}
}

// errRefollow ends a follow that refollow asked to make the view anew.
var errRefollow = errors.New("the view is made anew for a host it now keeps")

// run keeps the view until ctx is done.
func (v *eventView) run(ctx context.Context) {
	followAgain(ctx, "event view", v.retry, v.log, func(ctx context.Context) error {
		for {
			if err := v.follow(ctx); !errors.Is(err, errRefollow) {
				return err
			}
		}
	})
}

// refollow asks for the view to be made anew: the worker wants a host it
// did not (the view holds no events of it). Requests while one waits are
// one.
func (v *eventView) refollow() {
	select {
	case v.again <- struct{}{}:
	default:
	}
}

// drop forgets host's proxies: the worker gave the host up.
func (v *eventView) drop(host string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for id := range v.byHost[host] {
		delete(v.host, id)
	}
	delete(v.byHost, host)
}

// reset empties the view and marks it not caught up.
func (v *eventView) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.ready:
		v.ready = make(chan struct{})
	default:
	}
	clear(v.host)
	clear(v.byHost)
}

func (v *eventView) caughtUp() {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.ready:
	default:
		close(v.ready)
	}
}

// follow makes the view anew and keeps it until ctx is done or the
// consumer reports an error.
func (v *eventView) follow(ctx context.Context) error {
	v.reset()
	cctx, cancel := context.WithTimeout(ctx, v.js.Options().DefaultTimeout)
	defer cancel()
	cons, err := v.js.OrderedConsumer(cctx, messages.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{v.subj.StateAll()},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	info, err := cons.Info(cctx)
	if err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	if info.NumPending == 0 {
		v.caughtUp()
	}
	failed := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		v.apply(m.Subject(), m.Data())
		if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
			v.caughtUp()
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		select {
		case failed <- err:
		default:
		}
	}))
	if err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	defer func() {
		cc.Stop()
		<-cc.Closed()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-v.again:
		return errRefollow
	case err := <-failed:
		return fmt.Errorf("follow events: %w", err)
	}
}

// apply records one event, published on subject.
//
// An event of a proxy the view does not hold, on a host it does not keep,
// changes nothing: it is passed over on its id (the subject's and the
// body's) and host, read without decoding the body. With ten workers,
// nine events in ten a worker sees are such, and decoding them all was a
// twentieth of a worker's CPU at 50,000 proxies.
func (v *eventView) apply(subject string, data []byte) {
	if v.keep != nil && strings.HasPrefix(subject, v.prefix) {
		id := subject[len(v.prefix):]
		host, okHost := topString(data, "host")
		bodyID, okID := topString(data, "id")
		if okHost && okID && bodyID == id && !v.keep(host) {
			v.mu.Lock()
			_, held := v.host[id]
			v.mu.Unlock()
			if !held {
				return
			}
		}
	}
	var ev struct { // the fields the view keeps: the rest is not decoded
		ID    string `json:"id"`
		State string `json:"state"`
		Host  string `json:"host"`
		Seq   uint64 `json:"seq"`
		IP    string `json:"ip"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.ID == "" {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if h, ok := v.host[ev.ID]; ok {
		delete(v.byHost[h], ev.ID)
		if len(v.byHost[h]) == 0 {
			delete(v.byHost, h)
		}
		delete(v.host, ev.ID)
	}
	if ev.State == messages.StateDeleted || v.keep != nil && !v.keep(ev.Host) {
		return
	}
	host, ok := v.names[ev.Host] // the one copy of the host's name
	if !ok {
		host = ev.Host
		v.names[host] = host
	}
	m := v.byHost[host]
	if m == nil {
		m = map[string]viewedEvent{}
		v.byHost[host] = m
	}
	m[ev.ID] = viewedEvent{State: knownState(ev.State), Seq: ev.Seq, IP: ev.IP}
	v.host[ev.ID] = host
}

// knownState is s as the messages constant of that state (so the view
// holds no copy of it), or "" for a state it does not know.
func knownState(s string) string {
	for _, k := range []string{messages.StateRunning, messages.StateProvisioning, messages.StateFailed, messages.StateDeleting} {
		if s == k {
			return k
		}
	}
	return ""
}

// errViewBehind: the view has not caught up with the stream yet.
var errViewBehind = errors.New("the event view has not caught up yet")

// await waits until the view has caught up or ctx is done.
func (v *eventView) await(ctx context.Context) error {
	v.mu.Lock()
	ready := v.ready
	v.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return errViewBehind
	}
}

// onHost returns a copy of the last events of host's proxies, or false if
// the view is not caught up (it was made anew since await).
func (v *eventView) onHost(host string) (map[string]viewedEvent, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.ready:
		return maps.Clone(v.byHost[host]), true
	default:
		return nil, false
	}
}

// has reports whether id has a last event in the view (not "deleted").
func (v *eventView) has(id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.host[id]
	return ok
}

// followAgain runs follow until ctx is done: a follow that ends (its watch
// or consumer gone) is begun anew after retry. The views of PROXY_HOSTS and
// PROXY_EVENTS keep themselves this way.
func followAgain(ctx context.Context, what string, retry time.Duration, log *slog.Logger, follow func(context.Context) error) {
	for {
		err := follow(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Warn(what+": made anew", "err", err)
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
