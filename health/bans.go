package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/bans"
	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// Bans: every health process answers <prefix>.ban (a queue group, so one
// answers each request): it decodes and validates the request (package
// bans), stores the ban in PROXY_BANS under its key with the ban's length
// as the entry's own TTL, or purges it, and replies with a bans.Reply.
// Only health writes the bucket; the followers of the rotation read it.

// BanQueue is the queue group of the health processes on <prefix>.ban.
const BanQueue = "health"

// banTimeout bounds the store of one ban.
const banTimeout = 5 * time.Second

// Results of ban requests (proxyfleet_ban_requests_total).
const (
	BanAdded   = "added"
	BanRemoved = "removed"
	BanInvalid = "invalid" // the request was refused
	BanFailed  = "failed"  // the bucket could not be written
)

var banResults = []string{BanAdded, BanRemoved, BanInvalid, BanFailed}

// banState is what the ban service keeps: its subscription, the bucket
// once bound, and its counters (made at the first request). Guarded by
// its own mutex: requests are answered on the subscription's goroutine,
// apart from the fold.
type banState struct {
	mu       sync.Mutex
	sub      *nats.Subscription
	kv       jetstream.KeyValue
	results  map[string]uint64
	bySource map[string]uint64
}

// countLocked counts one request's result, and an added ban's source.
func (s *banState) countLocked(result, source string) {
	if s.results == nil {
		s.results, s.bySource = map[string]uint64{}, map[string]uint64{}
	}
	s.results[result]++
	if result == BanAdded {
		s.bySource[source]++
	}
}

// subscribeBans starts answering ban requests; unsubscribeBans ends it.
func (h *Health) subscribeBans() error {
	sub, err := h.nc.QueueSubscribe(h.subj.Ban(), BanQueue, h.onBan)
	if err != nil {
		return err
	}
	h.bans.mu.Lock()
	h.bans.sub = sub
	h.bans.mu.Unlock()
	return nil
}

func (h *Health) unsubscribeBans() {
	h.bans.mu.Lock()
	sub := h.bans.sub
	h.bans.sub = nil
	h.bans.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// onBan answers one request. It waits for the store (at most
// banTimeout), on the subscription's own goroutine.
func (h *Health) onBan(msg *nats.Msg) {
	reply, result, source := h.handleBan(msg.Data)
	h.bans.mu.Lock()
	h.bans.countLocked(result, source)
	h.bans.mu.Unlock()
	if msg.Reply == "" {
		return
	}
	body, _ := json.Marshal(reply)
	if err := msg.Respond(body); err != nil {
		h.log.Debug("answering a ban request", "err", err)
	}
}

func (h *Health) handleBan(body []byte) (bans.Reply, string, string) {
	req, err := bans.DecodeRequest(body)
	if err != nil {
		r := bans.Reply{V: messages.Version, Error: err.Error()}
		if fe, ok := messages.AsFieldError(err); ok {
			r.Field, r.Error = fe.Field, fe.Reason
		}
		h.log.Debug("ban request refused", "err", err)
		return r, BanInvalid, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), banTimeout)
	defer cancel()
	kv, err := h.banBucket(ctx)
	if err == nil {
		var b bans.Ban
		if req.Op == bans.OpAdd {
			if b, err = h.storeBan(ctx, req); err == nil {
				h.log.Info("ban added", "address", b.Address, "site", b.Site, "until", b.Until, "source", b.Source, "reason", b.Reason, "by", b.By)
				return bans.Reply{V: messages.Version, Ban: &b}, BanAdded, b.Source
			}
		} else {
			key := bans.Key(bans.Ban{Address: req.Address}.Addr(), req.Site)
			if err = kv.Purge(ctx, key, jetstream.PurgeTTL(messages.BansMarkerTTL)); err == nil {
				h.log.Info("ban removed", "address", req.Address, "site", req.Site, "by", req.By)
				return bans.Reply{V: messages.Version}, BanRemoved, ""
			}
		}
	}
	h.log.Warn("ban request: storing it", "err", err)
	return bans.Reply{V: messages.Version, Error: err.Error()}, BanFailed, ""
}

// banBucket binds PROXY_BANS once; a bucket still missing is an error of
// this request only.
func (h *Health) banBucket(ctx context.Context) (jetstream.KeyValue, error) {
	h.bans.mu.Lock()
	defer h.bans.mu.Unlock()
	if h.bans.kv != nil {
		return h.bans.kv, nil
	}
	kv, err := h.js.KeyValue(ctx, messages.BucketBans)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", messages.BucketBans, err)
	}
	h.bans.kv = kv
	return kv, nil
}

// storeBan writes the ban of an add request with its length as the
// entry's TTL: the last ban stored for a key replaces the one before.
func (h *Health) storeBan(ctx context.Context, req bans.Request) (bans.Ban, error) {
	b := req.Ban(h.now())
	body, err := json.Marshal(b)
	if err != nil {
		return bans.Ban{}, fmt.Errorf("encode ban: %w", err)
	}
	msg := &nats.Msg{Subject: jsapi.KeySubject(messages.BucketBans, b.Key()), Data: body}
	if _, err := h.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(req.For.D())); err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			return bans.Ban{}, fmt.Errorf("store ban: bucket %s missing: %w", messages.BucketBans, err)
		}
		return bans.Ban{}, fmt.Errorf("store ban: %w", err)
	}
	return b, nil
}

// banMetrics copies the counters (nil before the first request; every
// result and source is exported, zero or not).
func (h *Health) banMetrics() (results, bySource map[string]uint64) {
	h.bans.mu.Lock()
	defer h.bans.mu.Unlock()
	return maps.Clone(h.bans.results), maps.Clone(h.bans.bySource)
}
