package console

import (
	"context"
	"net/http"
	"time"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/messages"
)

// maxRefusedRows bounds the rows the refused page shows; its count is
// of them all.
const maxRefusedRows = 1000

// refusedRow is a proxy health refused, as the refused page shows it.
type refusedRow struct {
	ID, State, Host, Addr, Pool string
	Verdict, Reason, Egress     string
	Checked                     string
}

// refused returns the proxies of the view (those List shows) whose
// current address health refused (a verdict but ok, of the address the
// proxy has now: `list`'s CHECK column), in id order, at most n, and how
// many there are in all.
func (v *proxyView) refused(n int, now time.Time) (rows []refusedRow, total int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, id := range v.index[indexKey{'v', ""}] {
		e := v.byID[id]
		c := e.st.Check
		if c == nil || c.Verdict == messages.VerdictOK || c.Addr != e.st.Addr() {
			continue
		}
		total++
		if len(rows) < n {
			rows = append(rows, refusedRow{ID: id, State: e.state, Host: e.host, Addr: e.st.Addr(), Pool: e.pool,
				Verdict: c.Verdict, Reason: c.Reason, Egress: c.Egress, Checked: client.Age(now, c.At)})
		}
	}
	return rows, total
}

func (s *Server) refusedPage(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	if err := s.view.wait(ctx); err != nil {
		s.render(w, r, http.StatusServiceUnavailable, "error", sess, "Refused", "read the proxies: "+err.Error())
		return
	}
	var d struct {
		Rows      []refusedRow
		Total     int
		Truncated bool
	}
	d.Rows, d.Total = s.view.refused(maxRefusedRows, time.Now())
	d.Truncated = d.Total > len(d.Rows)
	s.render(w, r, http.StatusOK, "refused", sess, "Refused", d)
}

// banSite is one site's bans, as the bans page shows them.
type banSite struct {
	Site string
	Bans []banRow
}

type banRow struct {
	bans.Ban
	Left string
}

func (s *Server) bansPage(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	site := r.URL.Query().Get("site")
	bs, err := s.cl.Bans(ctx, client.BanFilter{Site: site})
	if err != nil {
		code := http.StatusBadGateway
		if site != "" {
			if _, serr := bans.Site(site); serr != nil {
				code = http.StatusBadRequest
			}
		}
		s.render(w, r, code, "error", sess, "Bans", "read the bans: "+err.Error())
		return
	}
	var d struct {
		Site  string
		Sites []banSite
		Total int
	}
	d.Site, d.Total = site, len(bs)
	now := time.Now()
	for _, b := range bs { // sorted by site, then address
		if n := len(d.Sites); n == 0 || d.Sites[n-1].Site != b.Site {
			d.Sites = append(d.Sites, banSite{Site: b.Site})
		}
		last := &d.Sites[len(d.Sites)-1]
		last.Bans = append(last.Bans, banRow{Ban: b, Left: b.Until.Sub(now).Round(time.Second).String()})
	}
	s.render(w, r, http.StatusOK, "bans", sess, "Bans", d)
}

type deadRow struct {
	client.DeadEntry
	When string
}

func (s *Server) deadPage(w http.ResponseWriter, r *http.Request, sess *session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	es, err := s.cl.DeadLetters(ctx)
	if err != nil {
		s.render(w, r, http.StatusBadGateway, "error", sess, "Dead letters", "read the dead letters (a user that may read PROXY_DEAD is needed): "+err.Error())
		return
	}
	var d struct{ Rows []deadRow }
	now := time.Now()
	for _, e := range es {
		d.Rows = append(d.Rows, deadRow{DeadEntry: e, When: client.Age(now, e.At)})
	}
	s.render(w, r, http.StatusOK, "dead", sess, "Dead letters", d)
}
