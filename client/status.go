package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// Status is what is known of one proxy: its latest state event, the latest
// result of a command on it and, when this connection's user may read
// PROXY_DESIRED, its desired record. At least one of them is set.
type Status struct {
	ID string `json:"id"`
	// Desired is the proxy's record in PROXY_DESIRED: the last accepted
	// command (Op create or delete) and its spec. Nil when there is none,
	// or when DesiredUnread.
	Desired *messages.Desired `json:"desired,omitempty"`
	// DesiredUnread says Desired was not read: this user may not read
	// PROXY_DESIRED (the client role of deploy/nats/accounts.conf may not).
	DesiredUnread bool `json:"desired_unread,omitempty"`
	// Event is the latest event on <prefix>.state.<id>.
	Event *messages.StateEvent `json:"event,omitempty"`
	// Result is the latest result on <prefix>.result.<id> kept in
	// PROXY_RESULTS (for nats.results_max_age).
	Result *messages.Result `json:"result,omitempty"`
	// Check is what health's probes found of the proxy (PROXY_CHECKS):
	// its egress address, and whether it is refused (an open or leaky
	// proxy never enters the rotation). Nil when health has checked
	// nothing of it (yet).
	Check *messages.CheckRecord `json:"check,omitempty"`
}

// lastOp is the op of the last command that took effect, from the desired
// record or else from the latest result, and whether it is known.
func (s Status) lastOp() (op, commandID string, ok bool) {
	if s.Desired != nil {
		return s.Desired.Op, s.Desired.CommandID, true
	}
	if r := s.Result; r != nil {
		switch r.Outcome {
		case messages.OutcomeAccepted, messages.OutcomeDone, messages.OutcomeFailed:
			return r.Op, r.CommandID, true
		}
	}
	return "", "", false
}

// State is the proxy's observed state, or "pending" for a create that has
// no event yet ("-" when nothing is known).
func (s Status) State() string {
	if s.Event != nil {
		return s.Event.State
	}
	if op, _, ok := s.lastOp(); ok && op == messages.OpCreate {
		return "pending"
	}
	return "-"
}

// Converged reports whether the latest event is the outcome of the last
// command that took effect (the same command id: the desired record's, or
// else the latest result's) and is not a work-in-progress state.
func (s Status) Converged() bool {
	_, cmd, ok := s.lastOp()
	if !ok || s.Event == nil || s.Event.CommandID != cmd {
		return false
	}
	switch s.Event.State {
	case messages.StateRunning, messages.StateFailed, messages.StateDeleted:
		return true
	}
	return false
}

// currentCheck is health's record if it is of the proxy's current address
// (a record of an address the proxy no longer has says nothing of it).
func (s Status) currentCheck() *messages.CheckRecord {
	if s.Check == nil || s.Check.Addr != s.Addr() {
		return nil
	}
	return s.Check
}

// Addr is ip:port of a proxy whose event carries an IP, else "".
func (s Status) Addr() string {
	if s.Event == nil || s.Event.IP == "" {
		return ""
	}
	if s.Event.Port == 0 {
		return s.Event.IP
	}
	return fmt.Sprintf("%s:%d", s.Event.IP, s.Event.Port)
}

// Gone reports whether List leaves the proxy out unless IncludeDeleted
// (see gone).
func (s Status) Gone() bool { return s.gone() }

// gone is a proxy deleted on purpose and finished with, or one no command
// took effect on (every one was rejected or superseded).
func (s Status) gone() bool {
	if s.Desired == nil && s.Event == nil {
		if _, _, ok := s.lastOp(); !ok {
			return true
		}
	}
	if op, _, ok := s.lastOp(); ok {
		return op == messages.OpDelete && (s.Event == nil || s.Event.State == messages.StateDeleted)
	}
	return s.Event != nil && s.Event.State == messages.StateDeleted
}

// Get returns what is known of proxy id. It fails with an error wrapping
// ErrNotFound when there is no desired record or state event, and no command
// took effect (its results, if any, are rejections or supersessions).
func (c *Client) Get(ctx context.Context, id string) (Status, error) {
	if !messages.ValidID(id) {
		return Status{}, &messages.FieldError{Field: "id", Reason: fmt.Sprintf("%q is not a valid proxy id", id)}
	}
	st := Status{ID: id, DesiredUnread: !c.mayReadDesired(ctx)}
	if !st.DesiredUnread {
		kv, err := c.bucket(ctx, messages.BucketDesired)
		if err != nil {
			return st, err
		}
		switch e, err := kv.Get(ctx, id); {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return st, fmt.Errorf("read desired record of %s: %w", id, err)
		default:
			var d messages.Desired
			if err := json.Unmarshal(e.Value(), &d); err != nil {
				return st, fmt.Errorf("decode desired record of %s: %w", id, err)
			}
			st.Desired = &d
		}
	}
	if err := lastOn(ctx, c, messages.StreamEvents, c.subj.State(id), &st.Event); err != nil {
		return st, fmt.Errorf("read latest event of %s: %w", id, err)
	}
	if err := lastOn(ctx, c, messages.StreamResults, c.subj.Result(id), &st.Result); err != nil {
		return st, fmt.Errorf("read latest result of %s: %w", id, err)
	}
	if st.Event != nil {
		chk, err := c.check(ctx, id)
		if err != nil {
			return st, err
		}
		st.Check = chk
	}
	if st.Desired == nil && st.Event == nil {
		if _, _, ok := st.lastOp(); !ok {
			why := "no desired record, state event or result"
			if r := st.Result; r != nil {
				why = fmt.Sprintf("no command took effect; the last, %s %s, was %s", r.Op, r.CommandID, r.Outcome)
				if r.Field != "" {
					why += " (field " + r.Field + ")"
				}
			}
			return st, fmt.Errorf("proxy %s: %w: %s", id, ErrNotFound, why)
		}
	}
	return st, nil
}

// lastOn decodes the last message on subject of stream into *into, leaving
// it nil when there is none.
func lastOn[T any](ctx context.Context, c *Client, stream, subject string, into **T) error {
	st, err := c.stream(ctx, stream)
	if err != nil {
		return err
	}
	raw, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	v := new(T)
	if err := json.Unmarshal(raw.Data, v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	*into = v
	return nil
}

// ListOption configures List.
type ListOption func(*listOptions)

type listOptions struct {
	all    bool
	host   string
	state  string
	labels map[string]string
	after  string
	limit  int
}

// OnHost makes List return only the proxies on host (the host of their
// latest event, else of their desired record).
func OnHost(host string) ListOption { return func(o *listOptions) { o.host = host } }

// InState makes List return only the proxies in state (Status.State:
// provisioning, running, failed, deleting, deleted, or pending).
func InState(state string) ListOption { return func(o *listOptions) { o.state = state } }

// WithLabel makes List return only the proxies labelled key=value (in
// their desired record, else their latest event). Several must all hold.
func WithLabel(key, value string) ListOption {
	return func(o *listOptions) {
		if o.labels == nil {
			o.labels = map[string]string{}
		}
		o.labels[key] = value
	}
}

// Page makes List return at most limit proxies (0: no limit) whose ids sort
// after after (empty: from the first): the next page starts after the last
// id of this one.
func Page(after string, limit int) ListOption {
	return func(o *listOptions) { o.after, o.limit = after, limit }
}

// Host is the proxy's host: that of its latest event, else of its desired
// record ("" when neither names one).
func (s Status) Host() string {
	if s.Event != nil && s.Event.Host != "" {
		return s.Event.Host
	}
	if s.Desired != nil {
		return s.Desired.Host
	}
	return ""
}

// Labels are the proxy's labels: its desired record's, else its latest
// event's.
func (s Status) Labels() map[string]string {
	if s.Desired != nil {
		return s.Desired.Labels
	}
	if s.Event != nil {
		return s.Event.Labels
	}
	return nil
}

// keep reports whether s passes o's filters (not its page).
func (o *listOptions) keep(s *Status) bool {
	switch {
	case !o.all && s.gone():
		return false
	case o.host != "" && s.Host() != o.host:
		return false
	case o.state != "" && s.State() != o.state:
		return false
	}
	if len(o.labels) > 0 {
		have := s.Labels()
		for k, v := range o.labels {
			if got, ok := have[k]; !ok || got != v {
				return false
			}
		}
	}
	return true
}

// IncludeDeleted makes List return proxies deleted on purpose too. Desired
// records are never removed (a delete leaves one behind), so by default List
// leaves out a proxy whose desired op is delete and whose latest event is
// deleted or gone: it is no longer part of the fleet.
func IncludeDeleted() ListOption { return func(o *listOptions) { o.all = true } }

// List returns every proxy, sorted by id: the latest event and the latest
// result of every proxy, joined with the keys of PROXY_DESIRED when this
// user may read it (see Status.DesiredUnread). See IncludeDeleted, and
// OnHost, InState, WithLabel and Page, which narrow what it returns (it
// reads the same: the filters save printing and decoding output, not
// reads).
func (c *Client) List(ctx context.Context, opts ...ListOption) ([]Status, error) {
	var o listOptions
	for _, f := range opts {
		f(&o)
	}
	unread := !c.mayReadDesired(ctx)
	byID := map[string]*Status{}
	get := func(id string) *Status {
		s := byID[id]
		if s == nil {
			s = &Status{ID: id, DesiredUnread: unread}
			byID[id] = s
		}
		return s
	}

	// The four reads at once: each is a round trip per batch, and a fleet
	// of 50,000 is four reads of 50,000.
	var (
		desired = map[string]*messages.Desired{}
		events  map[string]*messages.StateEvent
		results map[string]*messages.Result
		checks  map[string]*messages.CheckRecord
		errs    [4]error
		wg      sync.WaitGroup
	)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	read := func(i int, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = f(); errs[i] != nil {
				cancel() // the others' results are of no use
			}
		}()
	}
	if !unread {
		read(0, func() error {
			kv, err := c.bucket(rctx, messages.BucketDesired)
			if err != nil {
				return err
			}
			err = readBucket(rctx, kv, func(e jetstream.KeyValueEntry) error {
				var d messages.Desired
				if err := json.Unmarshal(e.Value(), &d); err != nil {
					return fmt.Errorf("decode desired record of %s: %w", e.Key(), err)
				}
				desired[e.Key()] = &d
				return nil
			})
			if err != nil {
				return fmt.Errorf("read %s: %w", messages.BucketDesired, err)
			}
			return nil
		})
	}
	read(1, func() (err error) { events, err = c.latestEvents(rctx); return err })
	read(2, func() (err error) { results, err = c.latestResults(rctx); return err })
	read(3, func() (err error) { checks, err = c.checks(rctx); return err })
	wg.Wait()
	for _, err := range errs {
		// The first that failed, not one cancelled because of it.
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for id, d := range desired {
		get(id).Desired = d
	}
	for id, ev := range events {
		get(id).Event = ev
	}
	for id, r := range results {
		get(id).Result = r
	}
	for id, chk := range checks {
		if s := byID[id]; s != nil {
			s.Check = chk
		}
	}

	out := make([]Status, 0, len(byID))
	for _, s := range byID {
		if (o.after != "" && s.ID <= o.after) || !o.keep(s) {
			continue
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if o.limit > 0 && len(out) > o.limit {
		out = out[:o.limit]
	}
	return out, nil
}

// check returns health's record of id in PROXY_CHECKS, nil if there is
// none. A fleet whose set-up predates the bucket has none: nothing is
// known then, which is no error.
func (c *Client) check(ctx context.Context, id string) (*messages.CheckRecord, error) {
	kv, err := c.js.KeyValue(ctx, messages.BucketChecks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", messages.BucketChecks, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read check of %s: %w", id, err)
	}
	var r messages.CheckRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("decode check of %s: %w", id, err)
	}
	return &r, nil
}

// checks returns every record of PROXY_CHECKS by id (none when the bucket
// is missing, as check says). A record that does not decode is left out.
func (c *Client) checks(ctx context.Context) (map[string]*messages.CheckRecord, error) {
	out := map[string]*messages.CheckRecord{}
	kv, err := c.js.KeyValue(ctx, messages.BucketChecks)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", messages.BucketChecks, err)
	}
	err = readBucket(ctx, kv, func(e jetstream.KeyValueEntry) error {
		var r messages.CheckRecord
		if json.Unmarshal(e.Value(), &r) == nil {
			out[e.Key()] = &r
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messages.BucketChecks, err)
	}
	return out, nil
}

// latestResults returns the latest result kept of every proxy, by id.
func (c *Client) latestResults(ctx context.Context) (map[string]*messages.Result, error) {
	out := map[string]*messages.Result{}
	prefix := c.subj.Prefix + ".result."
	// Proxies' results only: a pool's are on result.pool.<name>.
	err := c.readStream(ctx, messages.StreamResults, c.subj.ResultProxies(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg) {
		var r messages.Result
		if json.Unmarshal(m.Data(), &r) != nil {
			return
		}
		out[strings.TrimPrefix(m.Subject(), prefix)] = &r
	})
	if err != nil {
		return nil, fmt.Errorf("read latest results: %w", err)
	}
	return out, nil
}

// latestEvents returns the latest event of every proxy, by id.
func (c *Client) latestEvents(ctx context.Context) (map[string]*messages.StateEvent, error) {
	out := map[string]*messages.StateEvent{}
	prefix := c.subj.Prefix + ".state."
	err := c.readStream(ctx, messages.StreamEvents, c.subj.StateAll(), jetstream.DeliverLastPerSubjectPolicy, func(m jetstream.Msg) {
		var ev messages.StateEvent
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		id := strings.TrimPrefix(m.Subject(), prefix)
		if ev.ID == "" {
			ev.ID = id
		}
		out[id] = &ev
	})
	if err != nil {
		return nil, fmt.Errorf("read latest events: %w", err)
	}
	return out, nil
}

// stream binds a stream, saying what its absence likely means.
func (c *Client) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := c.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s not found (has `proxyfleet setup` run?): %w", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s, nil
}

// bucket binds a KV bucket, saying what its absence likely means.
func (c *Client) bucket(ctx context.Context, name string) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s not found (has `proxyfleet setup` run?): %w", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", name, err)
	}
	return kv, nil
}

// readBucket calls fn with the current value of every key of kv.
func readBucket(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry) error) error {
	return readKeys(ctx, kv, ">", fn)
}

// readKeys calls fn with the current value of every key of kv that
// filter (a key with wildcards) matches.
func readKeys(ctx context.Context, kv jetstream.KeyValue, filter string, fn func(jetstream.KeyValueEntry) error) error {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watcher closed before the initial values were read")
			}
			if e == nil {
				return nil // the initial values are all in
			}
			if err := fn(e); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readBatch is the messages a reader asks for at once: a fleet of 50,000
// is read in 25 round trips, not 200.
const readBatch = 2048

// readStream calls fn with every message of name on filter from the start
// the deliver policy gives up to the stream's end at the time of the call,
// through a short-lived ephemeral consumer.
func (c *Client) readStream(ctx context.Context, name, filter string, policy jetstream.DeliverPolicy, fn func(jetstream.Msg)) error {
	st, err := c.stream(ctx, name)
	if err != nil {
		return err
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		DeliverPolicy:     policy,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("create reader on %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	pending := cons.CachedInfo().NumPending
	if pending == 0 {
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.FetchNoWait(readBatch)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			fn(m)
			if meta, err := m.Metadata(); err == nil {
				pending = meta.NumPending
				done = pending == 0
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if done {
			return nil
		}
		if n == 0 {
			// Messages are pending but none came. A refused pull request
			// is reported only to the connection's error handler, so
			// this is the one sign of it a reader gets.
			return fmt.Errorf("read %s: %d messages pending but the server delivered none (may this user publish to %s?)",
				name, pending, jsapi.NextSubjects(name))
		}
	}
}
