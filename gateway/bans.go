package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"proxyfleet/bans"
	"proxyfleet/messages"
	"proxyfleet/rotation"
)

// Bans is what the gateway needs of the bans (docs/BANS.md):
// *rotation.Rotation implements it. Banned is asked for every candidate
// address of a request; HoldBan holds a ban here at once; AddBan (in
// the background) asks that it hold everywhere.
type Bans interface {
	Banned(addr netip.Addr, site string) bool
	HoldBan(addr netip.Addr, site string, d time.Duration)
	AddBan(ctx context.Context, req bans.Request) (bans.Ban, error)
}

var _ Bans = (*rotation.Rotation)(nil)

// localBans are the bans of a gateway given no Bans: held in this
// process only, up to maxLocalBans.
type localBans struct {
	now func() time.Time
	mu  sync.RWMutex
	set *bans.Set
}

const maxLocalBans = 1 << 16

func newLocalBans(now func() time.Time) *localBans {
	return &localBans{now: now, set: bans.NewSet(maxLocalBans)}
}

func (l *localBans) Banned(addr netip.Addr, site string) bool {
	now := l.now()
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.set.Banned(addr, site, now)
}

func (l *localBans) HoldBan(addr netip.Addr, site string, d time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.set.Add(addr, site, now.Add(d), now)
}

// AddBan holds the ban (nothing else knows of it).
func (l *localBans) AddBan(_ context.Context, req bans.Request) (bans.Ban, error) {
	site, err := bans.Site(req.Site)
	if err != nil {
		return bans.Ban{}, fmt.Errorf("local ban: %w", err)
	}
	l.HoldBan(bans.Ban{Address: req.Address}.Addr(), site, req.For.D())
	return bans.Ban{}, nil
}

// scope is what a request's choices of address depend on: its target's
// site, and the addresses a rule refused it from already.
type scope struct {
	g    *Gateway
	host string // the target host, as it passed the target rule
	site string // bans.Site(host); "" when host has none (nothing is banned for it)
	// refused are the addresses whose answer a rule refused (retry):
	// the request does not go back to them.
	refused []netip.Addr
	// tried are the proxies the request does not go back to: they
	// failed it, or a rule refused the answer of one without addresses
	// of its own.
	tried []string
	// skippedBan: a candidate proxy was passed over, every address of
	// its banned for the site.
	skippedBan bool
}

func (g *Gateway) scopeOf(host string) *scope {
	s := &scope{g: g, host: host}
	if site, err := bans.Site(host); err == nil {
		s.site = site
	}
	return s
}

// needsBody says whether a body rule names the request's host: only then
// is an answer's body peeked at.
func (s *scope) needsBody() bool { return s.g.rules.NeedsBody(s.host) }

// skip says whether the request may not leave from a: banned for its
// site, or refused it already.
func (s *scope) skip(a netip.Addr) bool {
	return (s.site != "" && s.g.bans.Banned(a, s.site)) || slices.Contains(s.refused, a)
}

// attempt is one try of a request: the proxy, the address it leaves
// from (HeaderEgress; invalid when the proxy chooses), and the address
// a ban of its answer is for.
type attempt struct {
	p      Proxy
	egress netip.Addr
	// addr is egress, or the proxy's own egress as health saw it; invalid
	// when neither is known (nothing to ban).
	addr netip.Addr
	sc   *scope
	// status is the status of the answer passed on to the client, set by
	// the try that got it (0: none, or a tunnel's).
	status int
	// seq is the request's run of attempts (see more).
	seq *attemptSeq
}

// attemptSeq is what a request's attempts share: the attempt under way
// (i, from 0) and the next candidate if picked ahead.
type attemptSeq struct {
	g    *Gateway
	ctx  context.Context
	o    options
	sc   *scope
	i    int
	next *attempt
}

// more picks the next candidate ahead and says whether there is one
// (the retries left and a proxy with an address the request may use).
func (at *attempt) more() bool {
	s := at.seq
	if s.i >= s.g.retries {
		return false
	}
	if s.next == nil {
		next, err := s.g.pick(s.ctx, s.o, s.sc)
		if err != nil {
			return false
		}
		s.next = next
	}
	return true
}

// ownEgress is p's egress as health's probe saw it; invalid if unknown.
func ownEgress(p Proxy) netip.Addr {
	a, err := netip.ParseAddr(p.Egress)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}

// errRuleRetry: a rule refused the answer and asked for a retry; the
// answer was dropped, and another address is tried (no proxy's failure).
var errRuleRetry = errors.New("a rule refused the answer")

// bannedError: every proxy matching the request has every address
// banned for the request's site; answered 503 (SOCKS5: reply 2).
type bannedError struct{ site string }

func (e *bannedError) Error() string {
	return "every address that may carry it is banned for the site " + e.site
}

// judge applies gateway.rules to a proxy's answer to a plain request (both
// request paths call it, with the answer's status, the first body_peek
// bytes of its body when the rules need them, and the time to its first
// byte): a ban is held at once and reported to the fleet in the
// background. It says whether the request goes to another address: a
// rule asked it, replayable (the request can be sent again) and there
// is one to go to; the caller then drops the answer.
func (g *Gateway) judge(at *attempt, status int, body []byte, firstByte time.Duration, replayable bool) bool {
	if g.rules.Len() == 0 {
		return false
	}
	a := g.rules.Match(bans.Answer{Host: at.sc.host, Status: status, Body: body, FirstByte: firstByte})
	if a.Rule < 0 {
		return false
	}
	if a.Ban > 0 {
		g.ban(at.addr, at.sc.site, a.Ban, a.Rule, bans.SourceRule, fmt.Sprintf("gateway rule %d: status %d", a.Rule, status))
	}
	if !a.Retry || !replayable {
		return false
	}
	// The next candidate, picked now, is not this address.
	if at.addr.IsValid() {
		at.sc.refused = append(at.sc.refused, at.addr)
	}
	if !at.egress.IsValid() {
		at.sc.tried = append(at.sc.tried, at.p.ID)
	}
	return at.more()
}

// ban bans addr for site for d (by rule, -1 for none, and source) here at once and asks the fleet for it
// in the background; nothing when addr or site is unknown.
func (g *Gateway) ban(addr netip.Addr, site string, d time.Duration, rule int, source, reason string) {
	if !addr.IsValid() || site == "" {
		return
	}
	g.bans.HoldBan(addr, site, d)
	g.m.ban(rule, source).Inc()
	g.stats.ban(site)
	req := bans.Request{Address: addr.String(), Site: site, For: messages.Duration(d), Source: source, Reason: reason}
	g.background.Go(func() {
		ctx, cancel := context.WithTimeout(g.hard, banTimeout)
		defer cancel()
		if _, err := g.bans.AddBan(ctx, req); err != nil && ctx.Err() == nil {
			g.log.Warn("gateway: ban not stored (held here)", "site", site, "addr", addr.String(), "err", err)
		}
	})
}

// banTimeout bounds the request that stores a ban.
const banTimeout = 10 * time.Second

// HeaderBan, on a client's request in a session (a CONNECT too), bans
// the address that session leaves from for the request's site, for the
// duration it gives (1s to 720h, as bans.Request's): the client saw the
// site refuse it (a captcha inside a tunnel the gateway cannot read).
// The request then goes from another address. Removed before
// forwarding. A value that is no such duration, or a request without a
// session or with egress-rotate (no one address to name), is answered
// 400 naming the header.
const HeaderBan = "X-Proxyfleet-Ban"

// withBan takes HeaderBan's value v into o (o.session already set).
func (o *options) withBan(v string) error {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if err != nil || d < bans.MinDuration || d > bans.MaxDuration {
		return fmt.Errorf("%s: %.32q is not a duration from %s to %s", HeaderBan, v, bans.MinDuration, bans.MaxDuration)
	}
	switch {
	case o.session == "":
		return fmt.Errorf("%s needs a session (%s or USER-session-KEY): it bans the address the session leaves from", HeaderBan, HeaderSession)
	case o.rotate:
		return fmt.Errorf("%s: a session with egress-rotate has no one address to ban (proxyfleet ban add bans one)", HeaderBan)
	}
	o.ban = d
	return nil
}

// banAsked bans o's session's address for the request's site, for
// o.ban: the one the session leaves from for that site now (its answers
// named it in HeaderEgress), held here at once and reported to the
// fleet (source header). The request's own pick, which follows, passes
// it over. Nothing when no proxy or address is known for the session
// (the pick then says why) or the host has no site.
func (g *Gateway) banAsked(ctx context.Context, o options, sc *scope) {
	at, err := g.pick(ctx, o, sc)
	if err != nil {
		return
	}
	g.ban(at.addr, sc.site, o.ban, -1, bans.SourceHeader, "client header "+HeaderBan)
}
