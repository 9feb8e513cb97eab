package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"proxyfleet/bans"
	"proxyfleet/client"
	"proxyfleet/messages"
)

// action serves an admin's action: a session, its CSRF token and the
// admin role are checked, in that order, before do runs.
func (s *Server) action(name string, do func(ctx context.Context, r *http.Request) (actionResult, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess, ok := s.sessionOf(r)
		if !ok {
			s.metrics.actions.WithLabelValues(name, "forbidden").Inc()
			http.Error(w, "log in first", http.StatusUnauthorized)
			return
		}
		if !validCSRF(sess, r.PostFormValue("csrf")) {
			s.metrics.actions.WithLabelValues(name, "bad_csrf").Inc()
			s.render(w, r, http.StatusForbidden, "error", sess, "Refused", "the form's CSRF token is missing or wrong: reload the page and try again")
			return
		}
		if !sess.admin {
			s.metrics.actions.WithLabelValues(name, "forbidden").Inc()
			s.log.Warn("console: action refused to a read-only user", "user", sess.user, "action", name)
			s.render(w, r, http.StatusForbidden, "error", sess, "Refused", "user "+sess.user+" is read-only: actions need an admin")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		res, err := do(ctx, r)
		res.Back = backTo(r)
		code := http.StatusOK
		outcome := "sent"
		if err != nil {
			res.Error = err.Error()
			outcome, code = "failed", http.StatusBadGateway
			if _, ok := messages.AsFieldError(err); ok || errors.Is(err, errInvalid) {
				outcome, code = "invalid", http.StatusBadRequest
			}
		}
		s.metrics.actions.WithLabelValues(name, outcome).Inc()
		s.log.Info("console: action", "user", sess.user, "action", name, "outcome", outcome, "command_id", res.CommandID, "err", err)
		s.render(w, r, code, "result", sess, res.What, res)
	})
}

// errInvalid marks a form refused before anything is sent.
var errInvalid = errors.New("invalid")

// checkID refuses an id the commands would be rejected for, before
// sending one.
func checkID(what, id string, valid func(string) bool) error {
	if !valid(id) {
		return fmt.Errorf("%s %q: %w: lowercase letters, digits and '-', starting and ending with a letter or digit", what, id, errInvalid)
	}
	return nil
}

// backTo is the console page the form was on (its Referer's path), or
// the fleet page.
func backTo(r *http.Request) string {
	if u, err := url.Parse(r.Referer()); err == nil && u.Host == r.Host && strings.HasPrefix(u.Path, "/") {
		if u.RawQuery != "" {
			return u.Path + "?" + u.RawQuery
		}
		return u.Path
	}
	return "/"
}

type actionResult struct {
	What string
	// Done, if set, is what a request answered at once (a ban) says it
	// did; else the result is a command sent, its outcome to follow.
	Done      string
	CommandID string
	Sequence  uint64
	Duplicate bool
	Error     string
	Back      string
}

func resultOf(what string, o client.Outcome) actionResult {
	return actionResult{What: what, CommandID: o.CommandID, Sequence: o.Sequence, Duplicate: o.Duplicate}
}

// commandID is a fresh command id for an action, so that each click is
// a command of its own (the CLI's ids are random too).
func commandID(action string) string { return "console-" + action + "-" + randomToken()[:22] }

func (s *Server) poolRecycle(ctx context.Context, r *http.Request) (actionResult, error) {
	name := r.PostFormValue("pool")
	what := "Recycle pool " + name
	if err := checkID("pool", name, messages.ValidPoolName); err != nil {
		return actionResult{What: what}, err
	}
	var ids []string
	if v := strings.TrimSpace(r.PostFormValue("ids")); v != "" {
		ids = strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ' ' })
	}
	o, err := s.cl.PoolRecycle(ctx, messages.PoolRecycle{Name: name, IDs: ids, All: len(ids) == 0}, commandID("recycle"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("recycle pool %s: %w", name, err)
	}
	return resultOf(what, o), nil
}

func (s *Server) proxyCreate(ctx context.Context, r *http.Request) (actionResult, error) {
	id := r.PostFormValue("id")
	what := "Create proxy " + id
	if err := checkID("proxy", id, messages.ValidID); err != nil {
		return actionResult{What: what}, err
	}
	cmd := messages.CreateCommand{ID: id, Host: strings.TrimSpace(r.PostFormValue("host"))}
	o, err := s.cl.Create(ctx, cmd, commandID("create"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("create %s: %w", id, err)
	}
	return resultOf(what, o), nil
}

func (s *Server) proxyDelete(ctx context.Context, r *http.Request) (actionResult, error) {
	id := r.PostFormValue("id")
	what := "Delete proxy " + id
	if err := checkID("proxy", id, messages.ValidID); err != nil {
		return actionResult{What: what}, err
	}
	o, err := s.cl.Delete(ctx, id, commandID("delete"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("delete %s: %w", id, err)
	}
	return resultOf(what, o), nil
}

// poolSize sets a pool's size, its other settings as its record has
// them: a pool set replaces the whole spec, so it is read first and sent
// back whole. A min_ready that was the old size's default follows the
// new size; one set apart from it is kept, or dropped to the default
// when it exceeds the new size.
func (s *Server) poolSize(ctx context.Context, r *http.Request) (actionResult, error) {
	name := r.PostFormValue("pool")
	what := "Set the size of pool " + name
	if err := checkID("pool", name, messages.ValidPoolName); err != nil {
		return actionResult{What: what}, err
	}
	size, err := strconv.Atoi(strings.TrimSpace(r.PostFormValue("size")))
	if err != nil || size < 0 || size > messages.MaxPoolSize {
		return actionResult{What: what}, fmt.Errorf("size %q: %w: a number from 0 to %d", r.PostFormValue("size"), errInvalid, messages.MaxPoolSize)
	}
	what = fmt.Sprintf("Set the size of pool %s to %d", name, size)
	ps, err := s.cl.Pool(ctx, name)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("read pool %s: %w", name, err)
	}
	rec := ps.Record
	cmd := messages.PoolSet{Name: name, Size: size, Surge: &rec.Surge, MaxAge: rec.MaxAge, ReadyTimeout: rec.ReadyTimeout,
		RecycleAfterBans: rec.RecycleAfterBans, Spec: rec.Spec}
	if rec.MinReady != rec.Size && rec.MinReady <= size {
		minReady := rec.MinReady
		cmd.MinReady = &minReady
	}
	o, err := s.cl.PoolSet(ctx, cmd, commandID("size"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("set pool %s: %w", name, err)
	}
	return resultOf(what, o), nil
}

// banAdd asks health to ban an address for a site, as `proxyfleet ban
// add` does (source cli, by the console's user).
func (s *Server) banAdd(ctx context.Context, r *http.Request) (actionResult, error) {
	addr, site := strings.TrimSpace(r.PostFormValue("address")), strings.TrimSpace(r.PostFormValue("site"))
	what := "Ban " + addr + " for " + site
	d, err := time.ParseDuration(strings.TrimSpace(r.PostFormValue("for")))
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("for %q: %w: a duration such as 30m or 2h", r.PostFormValue("for"), errInvalid)
	}
	by := "console"
	if sess, ok := s.sessionOf(r); ok {
		by = "console:" + sess.user
	}
	b, err := s.cl.AddBan(ctx, bans.Request{Address: addr, Site: site, For: messages.Duration(d), Reason: r.PostFormValue("reason"), By: by})
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("ban %s for %s: %w", addr, site, err)
	}
	return actionResult{What: what, Done: fmt.Sprintf("banned %s for %s until %s", b.Address, b.Site, b.Until.UTC().Format(time.RFC3339))}, nil
}

// banRemove asks health to lift a ban, as `proxyfleet ban rm` does.
func (s *Server) banRemove(ctx context.Context, r *http.Request) (actionResult, error) {
	addr, site := strings.TrimSpace(r.PostFormValue("address")), strings.TrimSpace(r.PostFormValue("site"))
	what := "Lift the ban of " + addr + " for " + site
	if err := s.cl.RemoveBan(ctx, addr, site); err != nil {
		return actionResult{What: what}, fmt.Errorf("lift the ban of %s for %s: %w", addr, site, err)
	}
	return actionResult{What: what, Done: "lifted the ban of " + addr + " for " + site}, nil
}
