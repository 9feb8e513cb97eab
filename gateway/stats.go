package gateway

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"
)

// The gateway's per-site statistics, served as JSON by StatsHandler
// (`proxyfleet gateway` serves it on its --http listener, beside
// /metrics, at /stats): for each site (bans.Site of a request's target
// host), over the last StatsWindow, the requests, their answers by
// class, the bans this gateway made and the retries, the StatsTop sites
// with the most requests first.
//
// Memory is bounded: at most statsMaxSites sites are counted at once,
// each in StatsWindow/statsSlot slots of fixed size (about 400 bytes a
// site). When a new site comes to a full table, the half with the
// fewest requests in the window (the least recently counted first among
// equals) is dropped with its counts, so a site that is new while the
// table is full starts from nothing, and a site dropped and counted
// again has only its counts since. The busiest sites are never the ones
// dropped, so the top StatsTop are exact unless more than
// statsMaxSites/2 other sites had more requests than one of them in the
// window.
const (
	// StatsWindow is how far back /stats counts: the current minute and
	// the ones before it, whole, up to this long.
	StatsWindow = 10 * time.Minute
	// StatsTop is how many sites /stats lists at most.
	StatsTop = 100

	statsSlot     = time.Minute
	statsSlots    = int(StatsWindow / statsSlot)
	statsMaxSites = 1024
)

// The classes of a request's answer, as /stats counts them.
const (
	class2xx    = iota // a status under 300, or a tunnel opened
	class3xx           // 300 to 399
	class4xx           // 400 to 499
	class5xx           // 500 and over
	classFailed        // no answer: no proxy carried it, every address banned, or the client left first
	nClasses
)

// classOf is the class of an answer's status.
func classOf(status int) int {
	switch {
	case status < 300:
		return class2xx
	case status < 400:
		return class3xx
	case status < 500:
		return class4xx
	}
	return class5xx
}

// answerClass is the class of a request's answer: the status its last
// attempt passed on (none: a tunnel opened), or a target's answer to
// CONNECT; classFailed for any other error.
func answerClass(last *attempt, err error) int {
	if err == nil {
		return classOf(last.status)
	}
	var ta *targetAnswer
	if errors.As(err, &ta) {
		return classOf(ta.status)
	}
	return classFailed
}

// slotCounts are a site's counts in one slot.
type slotCounts struct {
	requests, retries, bans uint32
	answers                 [nClasses]uint32
}

// siteCounts are a site's slots: slot i counts minute epoch[i] (minutes
// since the Unix epoch); a slot of another minute is zeroed when reused.
type siteCounts struct {
	slots [statsSlots]slotCounts
	epoch [statsSlots]int64
	last  int64 // the last minute it counted
}

// at is the slot of minute m, zeroed if it counted another minute.
func (c *siteCounts) at(m int64) *slotCounts {
	i := int((m%int64(statsSlots) + int64(statsSlots)) % int64(statsSlots))
	if c.epoch[i] != m {
		c.slots[i], c.epoch[i] = slotCounts{}, m
	}
	c.last = m
	return &c.slots[i]
}

// sum is the counts of the window ending with minute m.
func (c *siteCounts) sum(m int64) slotCounts {
	var s slotCounts
	for i := range c.slots {
		if d := m - c.epoch[i]; d < 0 || d >= int64(statsSlots) {
			continue
		}
		s.plus(&c.slots[i])
	}
	return s
}

// plus adds d's counts to c's.
func (c *slotCounts) plus(d *slotCounts) {
	c.requests += d.requests
	c.retries += d.retries
	c.bans += d.bans
	for k := range c.answers {
		c.answers[k] += d.answers[k]
	}
}

// siteStats counts requests, answers, bans and retries by site; pure
// but for the clock it is given. Safe for concurrent use.
type siteStats struct {
	now   func() time.Time
	mu    sync.Mutex
	sites map[string]*siteCounts
}

func newSiteStats(now func() time.Time) *siteStats {
	return &siteStats{now: now, sites: map[string]*siteCounts{}}
}

// minute is t's minute since the Unix epoch.
func minute(t time.Time) int64 { return t.Unix() / int64(statsSlot/time.Second) }

// slot is site's slot of now, the site counted from now on if it was
// not (the table made room when full). Under s.mu.
func (s *siteStats) slot(site string) *slotCounts {
	m := minute(s.now())
	c := s.sites[site]
	if c == nil {
		if len(s.sites) >= statsMaxSites {
			s.shrink(m)
		}
		c = &siteCounts{}
		s.sites[site] = c
	}
	return c.at(m)
}

// shrink drops the half of the sites with the fewest requests in the
// window ending with minute m (the least recently counted first among
// equals). Under s.mu.
func (s *siteStats) shrink(m int64) {
	type ranked struct {
		site     string
		requests uint32
		last     int64
	}
	all := make([]ranked, 0, len(s.sites))
	for site, c := range s.sites {
		all = append(all, ranked{site, c.sum(m).requests, c.last})
	}
	slices.SortFunc(all, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.requests, b.requests), cmp.Compare(a.last, b.last), cmp.Compare(a.site, b.site))
	})
	for _, r := range all[:len(all)-statsMaxSites/2] {
		delete(s.sites, r.site)
	}
}

// request counts a request for site ("": none, not counted): its
// answer's class and the retries it took.
func (s *siteStats) request(site string, class, retries int) {
	d := slotCounts{requests: 1, retries: uint32(retries)}
	d.answers[class] = 1
	s.add(site, &d)
}

// ban counts a ban this gateway made for site.
func (s *siteStats) ban(site string) { s.add(site, &slotCounts{bans: 1}) }

// add adds d to site's slot of now.
func (s *siteStats) add(site string, d *slotCounts) {
	if site == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slot(site).plus(d)
}

// Stats is what /stats answers.
type Stats struct {
	At time.Time `json:"at"`
	// Window is StatsWindow ("10m0s").
	Window string `json:"window"`
	// Tracked is how many sites are counted now (at most 1024).
	Tracked int `json:"tracked"`
	// Sites are at most StatsTop, by requests (then bans, then name);
	// a site with nothing in the window is left out.
	Sites []SiteStats `json:"sites"`
}

// SiteStats are a site's counts over the window.
type SiteStats struct {
	Site     string  `json:"site"`
	Requests uint64  `json:"requests"`
	Answers  Answers `json:"answers"`
	// Bans this gateway made for the site (by a rule or a client's
	// header); the fleet's others are not counted here.
	Bans uint64 `json:"bans"`
	// Retries: the attempts after a request's first, a rule's retries and
	// failovers alike.
	Retries uint64 `json:"retries"`
}

// Answers count a site's requests by their answer's class.
type Answers struct {
	C2xx   uint64 `json:"2xx"` // a tunnel (CONNECT, SOCKS5) opened counts here
	C3xx   uint64 `json:"3xx"`
	C4xx   uint64 `json:"4xx"`
	C5xx   uint64 `json:"5xx"`
	Failed uint64 `json:"failed"`
}

// snapshot is the top n sites now.
func (s *siteStats) snapshot(n int) Stats {
	now := s.now()
	m := minute(now)
	out := Stats{At: now.UTC(), Window: StatsWindow.String(), Sites: []SiteStats{}}
	s.mu.Lock()
	out.Tracked = len(s.sites)
	for site, c := range s.sites {
		sum := c.sum(m)
		if sum == (slotCounts{}) {
			continue
		}
		a := sum.answers
		out.Sites = append(out.Sites, SiteStats{
			Site: site, Requests: uint64(sum.requests), Bans: uint64(sum.bans), Retries: uint64(sum.retries),
			Answers: Answers{uint64(a[class2xx]), uint64(a[class3xx]), uint64(a[class4xx]), uint64(a[class5xx]), uint64(a[classFailed])},
		})
	}
	s.mu.Unlock()
	slices.SortFunc(out.Sites, func(a, b SiteStats) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), cmp.Compare(b.Bans, a.Bans), cmp.Compare(a.Site, b.Site))
	})
	if len(out.Sites) > n {
		out.Sites = out.Sites[:n]
	}
	return out
}

// Stats are the StatsTop busiest sites over the last StatsWindow.
func (g *Gateway) Stats() Stats { return g.stats.snapshot(StatsTop) }

// StatsHandler serves Stats as JSON (GET /stats). It names the sites
// the gateway's clients reach: serve it only where /metrics is served,
// on a listener no stranger reaches.
func (g *Gateway) StatsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(g.Stats())
	})
}
