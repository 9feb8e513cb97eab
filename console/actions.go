package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

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
	What      string
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
