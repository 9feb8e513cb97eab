package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/messages"
)

// Update is one state event as a Watcher delivers it.
type Update struct {
	Event messages.StateEvent `json:"event"`
	// StreamSeq is the event's PROXY_EVENTS stream sequence. Unlike
	// Event.Seq, which starts over when a proxy is created anew, it orders
	// every event of the fleet.
	StreamSeq uint64 `json:"stream_seq"`
}

// errConsumerStopped ends a watch whose consumer stopped without a reason
// given.
var errConsumerStopped = errors.New("consumer stopped")

// Watcher is a live stream of state events, opened by Watch: Initial is
// the picture it started from, Updates every event after it. It owns one
// goroutine (and the consumer's), which Stop ends.
type Watcher struct {
	initial  []Update
	updates  chan Update
	stop     chan struct{} // closed by Stop
	stopOnce sync.Once
	ended    chan struct{} // closed once err is set
	err      error
	done     chan struct{} // closed when the goroutine and the consumer have stopped
}

// Watch opens a stream of PROXY_EVENTS. It first reads the latest event of
// every proxy to its end, so that a refused or broken read is Watch's
// error rather than an empty stream; Initial returns those events. Then
// Updates delivers every later event, each once and in stream order, until
// ctx ends, Stop is called or the connection closes; Err then says which.
// The caller must call Stop, which waits for what Watch started.
func (c *Client) Watch(ctx context.Context) (*Watcher, error) {
	st, err := c.stream(ctx, messages.StreamEvents)
	if err != nil {
		return nil, err
	}
	// The current picture first, read to its end; then every event after
	// it. Whatever both see is dropped by its stream sequence.
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	startSeq := info.State.LastSeq
	prefix := c.subj.Prefix + ".state."
	decode := func(m jetstream.Msg) (Update, bool) {
		var ev messages.StateEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return Update{}, false
		}
		if ev.ID == "" {
			ev.ID = strings.TrimPrefix(m.Subject(), prefix)
		}
		meta, err := m.Metadata()
		if err != nil {
			return Update{}, false
		}
		return Update{Event: ev, StreamSeq: meta.Sequence.Stream}, true
	}
	var initial []Update
	err = c.readStream(ctx, messages.StreamEvents, c.subj.StateAll(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg) {
		if u, ok := decode(m); ok {
			initial = append(initial, u)
			startSeq = max(startSeq, u.StreamSeq)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch: read the current states: %w", err)
	}
	sort.Slice(initial, func(i, j int) bool { return initial[i].StreamSeq < initial[j].StreamSeq })
	lastSeq := map[string]uint64{}
	for _, u := range initial {
		lastSeq[u.Event.ID] = max(lastSeq[u.Event.ID], u.StreamSeq)
	}

	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.subj.StateAll()},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    startSeq + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	in := make(chan Update, 256)
	quit := make(chan struct{}) // closed when the stream ends: unblocks a handler waiting to hand over an event
	var (
		mu       sync.Mutex
		closeErr error // why the consumer stopped itself
	)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		u, ok := decode(m)
		if !ok {
			return
		}
		select {
		case in <- u:
		case <-quit:
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrConnectionClosed) {
			mu.Lock()
			closeErr = err
			mu.Unlock()
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", messages.StreamEvents, err)
	}
	w := &Watcher{
		initial: initial,
		updates: make(chan Update),
		stop:    make(chan struct{}),
		ended:   make(chan struct{}),
		done:    make(chan struct{}),
	}
	stopped := func() error {
		mu.Lock()
		defer mu.Unlock()
		if closeErr != nil {
			return fmt.Errorf("watch %s: %w", messages.StreamEvents, closeErr)
		}
		return fmt.Errorf("watch %s: %w", messages.StreamEvents, errConsumerStopped)
	}
	go w.run(ctx, cc, in, quit, lastSeq, stopped)
	return w, nil
}

// run hands the consumer's events over to Updates, dropping any already
// seen, until ctx ends, Stop is called or the consumer stops; then it stops
// the consumer and closes Updates.
func (w *Watcher) run(ctx context.Context, cc jetstream.ConsumeContext, in <-chan Update, quit chan struct{}, lastSeq map[string]uint64, stopped func() error) {
	closed := cc.Closed()
	defer func() {
		close(w.ended)
		close(quit)
		cc.Stop()
		<-closed
		close(w.updates)
		close(w.done)
	}()
	for {
		var u Update
		select {
		case u = <-in:
		case <-ctx.Done():
			w.err = ctx.Err()
			return
		case <-w.stop:
			return
		case <-closed:
			w.err = stopped()
			return
		}
		if lastSeq[u.Event.ID] >= u.StreamSeq {
			continue
		}
		lastSeq[u.Event.ID] = u.StreamSeq
		select {
		case w.updates <- u:
		case <-ctx.Done():
			w.err = ctx.Err()
			return
		case <-w.stop:
			return
		case <-closed:
			w.err = stopped()
			return
		}
	}
}

// Initial returns the latest event of every proxy when Watch opened, in
// stream order.
func (w *Watcher) Initial() []Update { return w.initial }

// Updates delivers the events after Initial's. It is closed when the
// stream ends; Err then says why.
func (w *Watcher) Updates() <-chan Update { return w.updates }

// Err says why the stream ended: the context's error, or the connection's
// when it closed (wrapping jetstream.ErrConnectionClosed). It is nil while
// the stream runs and when Stop ended it.
func (w *Watcher) Err() error {
	select {
	case <-w.ended:
		return w.err
	default:
		return nil
	}
}

// Stop ends the stream and waits until its goroutine and consumer have
// stopped. It may be called more than once, and after the stream ended.
func (w *Watcher) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}
