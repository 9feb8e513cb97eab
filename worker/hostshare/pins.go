package hostshare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// Taking a host and handing it over. A host's work consumer is pinned to
// one pulling worker at a time; the server tells the pinned worker its pin
// id in the PinHeader header of every message it delivers, which is how a
// worker knows it owns a host (the consumer's PinnedClientID is the same
// id, which the worker's record publishes for readers of consumer info).
//
// A worker that is to take a host pulls it and publishes a claim (Claim),
// an empty work item the owner acks at once: the server pins the host on
// its next delivery, so ownership is settled, and seen, without waiting
// for real work. A worker that is to give a host up stops pulling it but
// keeps its pin while the host's in-flight work ends (HoldPin), then
// unpins it (Unpinner), so the next owner gets the host's work only once
// the last one has finished with it: never two owners of one host at a
// time.

// PinHeader is the header in which the server tells a puller its pin id.
const PinHeader = "Nats-Pin-Id"

// ClaimToken is the id token of a claim's work subject. Like the worker's
// observation tick it is not a valid proxy id.
const ClaimToken = "_claim"

// Claim publishes a claim of host, without waiting for its ack: a claim
// lost is made again at the membership's next heartbeat, and a loaded
// server answering claims in turn must not hold up the membership's loop
// (it would miss its heartbeats). A failure is logged at debug level.
func Claim(ctx context.Context, js jetstream.JetStream, subj messages.Subjects, host string, log *slog.Logger) {
	if ctx.Err() != nil {
		return
	}
	if _, err := js.PublishAsync(subj.Work(host, ClaimToken), nil); err != nil {
		log.Debug("publish claim", "host", host, "err", err)
	}
}

// pinnedTo is the pin of cons's owners' group, from its cached info; ""
// when it is pinned to nobody.
func pinnedTo(cons jetstream.Consumer) string {
	for _, g := range cons.CachedInfo().PriorityGroups {
		if g.Group == topology.PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// HoldPin keeps pin, the worker's pin of host's work consumer, until stop
// is called: a hold request (jsapi.HoldPin) every quarter of ttl, the
// consumer's PinnedTTL. An answer that the pin is not (or no longer) the
// consumer's ends the holds and calls lost, once. It fails when the
// requests cannot be subscribed to.
func HoldPin(js jetstream.JetStream, host, pin string, ttl time.Duration, lost func()) (stop func(), err error) {
	lostCh := make(chan struct{})
	var lostOnce sync.Once
	hold, err := jsapi.New(js).HoldPin(messages.StreamWork, topology.WorkConsumer(host), topology.PriorityGroup, pin, func() {
		lostOnce.Do(func() { close(lostCh) })
	})
	if err != nil {
		return nil, fmt.Errorf("hold the pin of host %s: %w", host, err)
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(ttl/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			_ = hold.Renew()
			select {
			case <-quit:
				return
			case <-lostCh:
				lost()
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
			_ = hold.Stop()
		})
	}, nil
}

// UnpinAtOnce bounds the unpins an Unpinner has in flight.
const UnpinAtOnce = 16

// UnpinTimeout bounds each NATS call of an unpin: a server that does not
// answer (its JetStream off) costs a stop that long, not its whole drain
// timeout.
const UnpinTimeout = 2 * time.Second

// Why an unpin did not happen, beside the server's answer.
var (
	ErrNoUnpinSlot = errors.New("no unpin slot")
	ErrUnpinLookup = errors.New("look up the stream")
)

// Unpinner unpins hosts' work consumers, so the server pins the next
// worker that pulls a host now instead of after its pinned_ttl. It bounds
// the unpins in flight to UnpinAtOnce and keeps the handle of the work
// stream they are made on, looked up once: workers started together hand
// most of their hosts over within seconds, and unbounded, a lookup and an
// unpin a host would queue on a busy JetStream API past the unpins'
// timeout (BenchmarkUnpinLookups, TestUnpinsAreBoundedOnTheirStream). A
// worker has one, for its hand-overs, its stop and its stray pins alike.
type Unpinner struct {
	js     jetstream.JetStream
	slots  chan struct{}
	mu     sync.Mutex
	stream jetstream.Stream
}

// NewUnpinner returns an Unpinner on js.
func NewUnpinner(js jetstream.JetStream) *Unpinner {
	return &Unpinner{js: js, slots: make(chan struct{}, UnpinAtOnce)}
}

// slot takes one of the unpins' slots, or fails when ctx ends first (a
// free slot is taken whatever ctx says).
func (u *Unpinner) slot(ctx context.Context) (release func(), err error) {
	select {
	case u.slots <- struct{}{}:
		return func() { <-u.slots }, nil
	default:
	}
	select {
	case u.slots <- struct{}{}:
		return func() { <-u.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Stream returns the handle of the work stream, looking it up the first
// time (within ctx) and each time until a lookup succeeds.
func (u *Unpinner) Stream(ctx context.Context) (jetstream.Stream, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stream != nil {
		return u.stream, nil
	}
	st, err := u.js.Stream(ctx, messages.StreamWork)
	if err != nil {
		return nil, err
	}
	u.stream = st
	return st, nil
}

// Unpin unpins host's work consumer: it takes a slot while wait lasts
// (ErrNoUnpinSlot when wait ends first), then looks the stream up
// (ErrUnpinLookup) and unpins within UnpinTimeout of parent. Any other
// error is the server's answer.
func (u *Unpinner) Unpin(wait, parent context.Context, host string) error {
	release, err := u.slot(wait)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoUnpinSlot, err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(parent, UnpinTimeout)
	defer cancel()
	st, err := u.Stream(ctx)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrUnpinLookup, messages.StreamWork, err)
	}
	return st.UnpinConsumer(ctx, topology.WorkConsumer(host), topology.PriorityGroup)
}
