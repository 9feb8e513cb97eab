package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// options are what a request asks of the picker: a session key and
// labels, from the user name's suffix and the X-Proxyfleet-* headers.
type options struct {
	session string
	labels  map[string]string
	// rotate: each request leaves from the proxy's next address
	// (egress-rotate), not the session's own or one at random.
	rotate bool
	// ban is what HeaderBan asks (0: nothing): the session's address
	// is banned for the request's site for this long (banAsked).
	ban time.Duration
}

// parseUser splits "alice-session-s1-label-country-de-pool-x" into the
// user ("alice") and its options. Options: session-KEY, label-KEY-VALUE
// (repeatable), pool-NAME (label pool=NAME), egress-rotate (each request
// leaves from its proxy's next address). Keys and values have no '-'
// in this form, but a pool's name may (pools are named like proxies, "eu-west"):
// NAME runs to the next option word (session, label, pool) or the end.
func parseUser(s string) (string, options, error) {
	parts := strings.Split(s, "-")
	var o options
	for i := 1; i < len(parts); {
		need := func(n int) error {
			if i+n >= len(parts) {
				return fmt.Errorf("user option %q needs %d value(s)", parts[i], n)
			}
			for _, v := range parts[i+1 : i+1+n] {
				if v == "" {
					return fmt.Errorf("user option %q has an empty value", parts[i])
				}
			}
			return nil
		}
		switch parts[i] {
		case "session":
			if err := need(1); err != nil {
				return "", o, err
			}
			o.session = parts[i+1]
			i += 2
		case "label":
			if err := need(2); err != nil {
				return "", o, err
			}
			o.setLabel(parts[i+1], parts[i+2])
			i += 3
		case "egress":
			if err := need(1); err != nil {
				return "", o, err
			}
			if parts[i+1] != "rotate" {
				return "", o, fmt.Errorf("user option %q: %q is not rotate", parts[i], parts[i+1])
			}
			o.rotate = true
			i += 2
		case "pool":
			if err := need(1); err != nil {
				return "", o, err
			}
			if userOptions[parts[i+1]] {
				return "", o, fmt.Errorf("user option %q needs a name, not %q", parts[i], parts[i+1])
			}
			j := i + 2
			for j < len(parts) && !userOptions[parts[j]] {
				if parts[j] == "" {
					return "", o, fmt.Errorf("user option %q has an empty value", parts[i])
				}
				j++
			}
			o.setLabel("pool", strings.Join(parts[i+1:j], "-"))
			i = j
		default:
			return "", o, fmt.Errorf("unknown user option %q (want session-KEY, label-KEY-VALUE, pool-NAME or egress-rotate)", parts[i])
		}
	}
	return parts[0], o, nil
}

// userOptions are the option words of a user name.
var userOptions = map[string]bool{"session": true, "label": true, "pool": true, "egress": true}

func (o *options) setLabel(k, v string) {
	if o.labels == nil {
		o.labels = map[string]string{}
	}
	o.labels[k] = v
}

// Headers a client may send with a CONNECT or a plain request; removed
// before forwarding.
const (
	HeaderSession = "X-Proxyfleet-Session"
	HeaderLabels  = "X-Proxyfleet-Labels"
	// HeaderProxy is set on the answer to CONNECT and on every plain
	// response: the id of the proxy that carried it.
	HeaderProxy = "X-Proxyfleet-Proxy"
)

// withHeaders adds the header options (they win over the user name's);
// ban is HeaderBan's value ("": none), taken once the session is known.
func (o *options) withHeaders(session, labels, ban string) error {
	if s := strings.TrimSpace(session); s != "" {
		o.session = s
	}
	if strings.TrimSpace(ban) != "" {
		if err := o.withBan(ban); err != nil {
			return err
		}
	}
	if strings.TrimSpace(labels) == "" {
		return nil
	}
	// The user name's labels may be shared (a connection's credential is
	// checked once): add to a copy.
	o.labels = maps.Clone(o.labels)
	for kv := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return fmt.Errorf("%s: %q is not key=value", HeaderLabels, kv)
		}
		o.setLabel(k, v)
	}
	return nil
}

func (o options) selector() Selector {
	return Selector{Labels: maps.Clone(o.labels)}
}

// user is a configured user at run time.
type user struct {
	name    string
	pwHash  [sha256.Size]byte // compared in constant time
	max     int64
	current atomic.Int64
}

// acquire takes one of the user's connections, false when all are taken.
func (u *user) acquire() bool {
	if u.current.Add(1) > u.max {
		u.current.Add(-1)
		return false
	}
	return true
}

func (u *user) release() { u.current.Add(-1) }

// Why authentication failed (the auth failures metric's reason).
const (
	authMissing = "missing" // no credentials
	authWrong   = "wrong"   // unknown user or wrong password
	// throttled: not checked, too many failed from the source address
	authThrottled = "throttled"
)

var errAuth = errors.New("authentication failed")

// users are the configured users by name.
type users map[string]*user

func newUsers(us []User) users {
	m := users{}
	for _, u := range us {
		m[u.Name] = &user{name: u.Name, pwHash: sha256.Sum256([]byte(u.Password)), max: int64(u.MaxConns)}
	}
	return m
}

// check returns the user of name (with options) and password, or
// errAuth. A user name's options are parsed only once the password is
// right, so a malformed one tells nothing to who does not know it.
func (m users) check(name, password string) (*user, options, error) {
	base, _, _ := strings.Cut(name, "-")
	u := m[base]
	h := sha256.Sum256([]byte(password))
	if u == nil {
		return nil, options{}, errAuth
	}
	if subtle.ConstantTimeCompare(h[:], u.pwHash[:]) != 1 {
		return nil, options{}, errAuth
	}
	_, o, err := parseUser(name)
	if err != nil {
		return nil, options{}, err
	}
	return u, o, nil
}

// basicCredentials parses a Basic Proxy-Authorization value.
func basicCredentials(h string) (name, password string, ok bool) {
	scheme, rest, found := strings.Cut(strings.TrimSpace(h), " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", "", false
	}
	name, password, ok = strings.Cut(string(b), ":")
	return name, password, ok
}

// basicAuth is the Basic credential value for name and password.
func basicAuth(name, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"+password))
}

// formatLabels is labels as k=v,k2=v2, sorted.
func formatLabels(l map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(l)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + l[k])
	}
	return b.String()
}
