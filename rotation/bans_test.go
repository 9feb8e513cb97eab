package rotation

import (
	"errors"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/bans"
	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/messages"
)

// followBansRig starts a health process and n followers, each on its own
// connection, with the bans read.
func followBansRig(t *testing.T, n int) (*healthRig, []*Rotation) {
	t.Helper()
	hr := newHealthRig(t)
	hr.start(health.Config{LeaseTTL: time.Second})
	var rots []*Rotation
	for range n {
		nc, _ := hr.srv.Connect(t)
		rot, err := Follow(ctxFor(t, bound), nc, Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rot.Close() })
		select {
		case <-rot.BansReady():
		case <-time.After(bound):
			t.Fatal("PROXY_BANS never read")
		}
		rots = append(rots, rot)
	}
	return hr, rots
}

// A ban one follower makes is honoured by another within a second; a ban
// is per site.
func TestBanSeenByAnotherFollower(t *testing.T) {
	_, rots := followBansRig(t, 2)
	a, b := rots[0], rots[1]
	addr := netip.MustParseAddr("2001:db8::7")
	if err := a.Ban("2001:db8::7", "www.shop.example", time.Hour); err != nil {
		t.Fatal(err)
	}
	if !a.Banned(addr, "shop.example") {
		t.Error("the follower that banned does not honour its own ban")
	}
	// The bound: a ban made at one follower holds at another
	// within 1s.
	start := time.Now()
	poll.Until(t, "the other follower to see the ban", time.Second, func() bool { return b.Banned(addr, "shop.example") })
	t.Logf("seen by the other follower after %s", time.Since(start))
	if b.Banned(addr, "other.example") || b.Banned(netip.MustParseAddr("2001:db8::8"), "shop.example") {
		t.Error("a ban holds beyond its address and site")
	}
	if n := b.ActiveBans(); n != 1 {
		t.Errorf("ActiveBans = %d, want 1", n)
	}
	if err := b.RemoveBan(ctxFor(t, bound), "2001:db8::7", "shop.example"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the first follower to see the ban lifted", bound, func() bool { return !a.Banned(addr, "shop.example") })
}

// A 2s ban ends by itself: the bucket's entry expires by its own TTL
// (nothing sweeps it) and the marker it leaves reaches every follower.
func TestBanExpiresByItself(t *testing.T) {
	hr, rots := followBansRig(t, 2)
	a, b := rots[0], rots[1]
	addr := netip.MustParseAddr("203.0.113.7")
	banned, err := a.AddBan(ctxFor(t, bound), bans.Request{Address: "203.0.113.7", Site: "shop.example", For: messages.Duration(2 * time.Second), Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if banned.Source != bans.SourceLibrary || banned.Until.Sub(banned.At) != 2*time.Second {
		t.Errorf("stored %+v", banned)
	}
	poll.Until(t, "the other follower to see the ban", bound, func() bool { return b.Banned(addr, "shop.example") })

	kv, err := hr.js.KeyValue(ctxFor(t, bound), messages.BucketBans)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the entry to expire from "+messages.BucketBans, bound, func() bool {
		_, err := kv.Get(ctxFor(t, bound), banned.Key())
		return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
	})
	// The followers dropped the ban from memory on the bucket's word (its
	// marker), not only by its end: no other entry came.
	for i, r := range rots {
		poll.Until(t, "a follower to drop the expired ban", bound, func() bool {
			r.banMu.RLock()
			defer r.banMu.RUnlock()
			return r.bans.Len() == 0
		})
		if r.Banned(addr, "shop.example") {
			t.Errorf("follower %d still honours the ban", i)
		}
	}
}

// A request health refuses comes back naming the field, and bans
// nothing.
func TestBanRefusedNamesTheField(t *testing.T) {
	_, rots := followBansRig(t, 1)
	err := rots[0].Ban("203.0.113.7", "a..example", time.Hour)
	if fe, ok := messages.AsFieldError(err); !ok || fe.Field != "site" {
		t.Errorf("Ban with a bad site: %v, want an error naming site", err)
	}
	err = rots[0].Ban("203.0.113.7", "shop.example", time.Millisecond)
	if fe, ok := messages.AsFieldError(err); !ok || fe.Field != "for" {
		t.Errorf("Ban of 1ms: %v, want an error naming for", err)
	}
	if n := rots[0].ActiveBans(); n != 0 {
		t.Errorf("%d bans held after refusals", n)
	}
}

// Health refuses a hostile request itself, naming the field, and counts
// what it stored by source.
func TestHealthAnswersBanRequests(t *testing.T) {
	hr := newHealthRig(t)
	h, _ := hr.start(health.Config{})
	ask := func(body string) bans.Reply {
		t.Helper()
		msg, err := hr.nc.RequestWithContext(ctxFor(t, bound), subj.Ban(), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		var r bans.Reply
		if err := messages.Decode(msg.Data, &r); err != nil {
			t.Fatalf("answer %s: %v", msg.Data, err)
		}
		return r
	}
	for body, field := range map[string]string{
		`{"v":1,"op":"add","address":"203.0.113.7","site":"shop.example","for":"1h","source":"cli","extra":1}`: "extra",
		`{"v":1,"op":"add","address":"203.0.113.7/32","site":"shop.example","for":"1h","source":"cli"}`:        "address",
		`{"v":1,"op":"add","address":"203.0.113.7","site":"shop.example.:80","for":"1h","source":"cli"}`:       "site",
		`{"v":1,"op":"add","address":"203.0.113.7","site":"shop.example","for":"1h","source":"nobody"}`:        "source",
		`not json`: "body",
	} {
		if r := ask(body); r.Field != field || r.Ban != nil {
			t.Errorf("%s: answered %+v, want a refusal naming %s", body, r, field)
		}
	}
	r := ask(`{"v":1,"op":"add","address":"203.0.113.7","site":"WWW.Shop.Example","for":"1h","source":"cli","reason":"captcha"}`)
	if r.Error != "" || r.Ban == nil || r.Ban.Site != "shop.example" || r.Ban.Source != bans.SourceCLI {
		t.Fatalf("a good request answered %+v", r)
	}
	m := h.Metrics()
	if m.BanRequests[health.BanInvalid] != 5 || m.BanRequests[health.BanAdded] != 1 || m.Bans[bans.SourceCLI] != 1 || m.Bans[bans.SourceRule] != 0 {
		t.Errorf("metrics: requests %v, bans %v", m.BanRequests, m.Bans)
	}
	kv, err := hr.js.KeyValue(ctxFor(t, bound), messages.BucketBans)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctxFor(t, bound), "203-0-113-7.shop.example")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := bans.DecodeBan(e.Value()); err != nil || b != *r.Ban {
		t.Errorf("stored %s (%v), answered %+v", e.Value(), err, *r.Ban)
	}
}

// A ban held in this process only holds here at once, per site, and ends
// by the clock.
func TestHoldBan(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r, err := newRotation(Config{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("203.0.113.7")
	r.HoldBan(addr, "shop.example", time.Minute)
	if !r.Banned(addr, "shop.example") || r.Banned(addr, "other.example") || r.ActiveBans() != 1 {
		t.Error("a held ban does not hold as it should")
	}
	if n := testing.AllocsPerRun(100, func() { r.Banned(addr, "shop.example") }); n != 0 {
		t.Errorf("Banned allocates %v times", n)
	}
	now = now.Add(time.Minute)
	if r.Banned(addr, "shop.example") || r.ActiveBans() != 0 {
		t.Error("a held ban outlives its end")
	}
}
