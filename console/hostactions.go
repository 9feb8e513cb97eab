package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"proxyfleet/messages"
)

// hostQuarantine quarantines a host by an operator's command: placement
// skips it and its work waits until a release. The reason names the
// console user who asked.
func (s *Server) hostQuarantine(ctx context.Context, r *http.Request) (actionResult, error) {
	host := r.PostFormValue("host")
	what := "Quarantine host " + host
	if err := checkID("host", host, messages.ValidID); err != nil {
		return actionResult{What: what}, err
	}
	cmd := messages.HostCommand{Host: host, Reason: strings.TrimSpace(r.PostFormValue("reason")), By: "console"}
	if sess, ok := s.sessionOf(r); ok {
		cmd.By = "console " + sess.user
	}
	o, err := s.cl.QuarantineHost(ctx, cmd, commandID("quarantine"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("quarantine host %s: %w", host, err)
	}
	return resultOf(what, o), nil
}

// hostRelease ends a host's quarantine, an operator's or an automatic one.
func (s *Server) hostRelease(ctx context.Context, r *http.Request) (actionResult, error) {
	host := r.PostFormValue("host")
	what := "Release host " + host
	if err := checkID("host", host, messages.ValidID); err != nil {
		return actionResult{What: what}, err
	}
	o, err := s.cl.ReleaseHost(ctx, messages.HostCommand{Host: host}, commandID("release"), false)
	if err != nil {
		return actionResult{What: what}, fmt.Errorf("release host %s: %w", host, err)
	}
	return resultOf(what, o), nil
}
