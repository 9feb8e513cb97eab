package rotation

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The headers Proxy reads when the request's context says nothing. They
// travel on with a plain-http request (through the proxy to the target);
// the context (WithSession, WithLabels) says the same without sending
// anything.
const (
	HeaderSession = "X-Proxyfleet-Session"
	HeaderLabels  = "X-Proxyfleet-Labels"
)

type sessionKey struct{}
type labelsKey struct{}

// WithSession returns ctx carrying a session key for Proxy: requests made
// with it go through the proxy PickSession gives for key.
func WithSession(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, sessionKey{}, key)
}

// WithLabels returns ctx carrying labels for Proxy: requests made with it
// go through a proxy that has them all.
func WithLabels(ctx context.Context, labels map[string]string) context.Context {
	return context.WithValue(ctx, labelsKey{}, labels)
}

// ProxyURL is the URL of p for an HTTP client, with the fleet's credential:
// http://user:password@addr.
func (r *Rotation) ProxyURL(p Proxy) *url.URL {
	u := &url.URL{Scheme: "http", Host: p.Addr}
	if r.cfg.User != "" || r.cfg.Password != "" {
		u.User = url.UserPassword(r.cfg.User, r.cfg.Password)
	}
	return u
}

// Proxy is for http.Transport.Proxy: it picks a proxy for req and returns
// its ProxyURL. The session key comes from WithSession on the request's
// context, or else the header X-Proxyfleet-Session (then PickSession;
// without one, Pick); the labels from WithLabels, or else the header
// X-Proxyfleet-Labels ("k=v,k2=v2"). When none matches the error wraps
// ErrEmpty, and the transport fails the request with it.
func (r *Rotation) Proxy(req *http.Request) (*url.URL, error) {
	ctx := req.Context()
	key, _ := ctx.Value(sessionKey{}).(string)
	if key == "" {
		key = req.Header.Get(HeaderSession)
	}
	labels, ok := ctx.Value(labelsKey{}).(map[string]string)
	if !ok {
		if h := req.Header.Get(HeaderLabels); h != "" {
			var err error
			if labels, err = ParseLabels(h); err != nil {
				return nil, fmt.Errorf("rotation: header %s: %w", HeaderLabels, err)
			}
		}
	}
	sel := Selector{Labels: labels}
	var p Proxy
	var err error
	if key != "" {
		p, err = r.PickSession(key, sel)
	} else {
		p, err = r.Pick(sel)
	}
	if err != nil {
		return nil, err
	}
	return r.ProxyURL(p), nil
}

// ParseLabels reads labels written "k=v,k2=v2" (spaces around items are
// ignored; an empty string is no labels).
func ParseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", item)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}
