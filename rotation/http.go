package rotation

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"proxyfleet/messages"
)

// The headers Proxy reads when the request's context says nothing. They
// travel on with a plain-http request (through the proxy to the target);
// the context (WithSession, WithLabels) says the same without sending
// anything.
const (
	HeaderSession = "X-Proxyfleet-Session"
	HeaderLabels  = "X-Proxyfleet-Labels"
	// HeaderEgress tells a proxy which of its addresses to leave from
	// (see ProxyConnectHeader).
	HeaderEgress = messages.HeaderEgress
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
// ErrEmpty, and the transport fails the request with it. A proxy with
// addresses gets one of the family it reaches the target over
// (TargetFamily: a name is resolved here, within FamilyLookupTimeout;
// one that does not resolve gets none, and the proxy chooses).
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
	u := r.ProxyURL(p)
	family := r.families.TargetFamily(ctx, req.URL.Hostname(), p)
	var a netip.Addr
	if key != "" {
		a = SessionEgress(p, key, family)
	} else {
		a = RandomEgress(p, family)
	}
	if a.IsValid() {
		// For ProxyConnectHeader; the transport dials Host alone, and
		// keeps tunnels of each egress apart (the URL is their key).
		u.Fragment = egressFragment + a.String()
	}
	return u, nil
}

// egressFragment starts the fragment of a proxy URL of Proxy that names
// the egress address chosen with the proxy.
const egressFragment = "egress="

// ProxyConnectHeader is for http.Transport.GetProxyConnectHeader, beside
// Proxy: the CONNECT of a tunnel through a proxy whose host's plan gave
// it addresses carries HeaderEgress, the address Proxy chose for it (the
// session's own, or one at random), so https requests leave from it.
// Plain-http requests carry their own headers: a client sets HeaderEgress
// on them itself (SessionEgress says which, with the family TargetFamily
// gives) to choose.
func (r *Rotation) ProxyConnectHeader(_ context.Context, proxyURL *url.URL, _ string) (http.Header, error) {
	s, ok := strings.CutPrefix(proxyURL.Fragment, egressFragment)
	if !ok {
		return nil, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, fmt.Errorf("rotation: proxy URL's egress %q: %w", s, err)
	}
	return http.Header{HeaderEgress: {a.String()}}, nil
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
