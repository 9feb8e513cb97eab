package client

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"proxyfleet/internal/jsapi"
	"proxyfleet/messages"
)

// userInfoSubject answers a connection with its own user, account and
// permissions (nats-server 2.10+, with a system account, which is there by
// default).
const userInfoSubject = "$SYS.REQ.USER.INFO"

type subjectPermission struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

type userInfo struct {
	Data *struct {
		Permissions *struct {
			Publish *subjectPermission `json:"publish"`
		} `json:"permissions"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// mayPublish reports whether p allows publishing to the literal subject:
// no allow list allows everything, and a deny always wins.
func (p *subjectPermission) mayPublish(subject string) bool {
	if p == nil {
		return true
	}
	allowed := len(p.Allow) == 0
	for _, a := range p.Allow {
		if subjectMatches(a, subject) {
			allowed = true
			break
		}
	}
	for _, d := range p.Deny {
		if subjectMatches(d, subject) {
			return false
		}
	}
	return allowed
}

// subjectMatches reports whether the literal subject matches pattern, with
// NATS wildcards: * one token, > one or more at the end.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// desiredSubjects are requests a read of PROXY_DESIRED makes: bind the
// bucket, get a key, watch the keys.
func desiredSubjects() []string {
	kv := jsapi.BucketStream(messages.BucketDesired)
	return []string{
		jsapi.StreamInfoSubject(kv),
		jsapi.DirectGetLastSubject(kv, jsapi.KeySubject(messages.BucketDesired, "x")),
		jsapi.ConsumerCreateSubject(kv, "x", jsapi.KeysFilter(messages.BucketDesired)),
	}
}

// mayReadDesired reports whether this connection's user may read
// PROXY_DESIRED, asking the server for its permissions once. A user that
// may not (the client role of deploy/nats/accounts.conf) gets no desired
// records, and no read of one is even tried: a refused publish is only
// reported asynchronously, so a read would wait out its deadline, and the
// server would log a violation. When the server does not answer (no system
// account, or the user may not ask), the records are taken as unreadable.
func (c *Client) mayReadDesired(ctx context.Context) bool {
	c.permOnce.Do(func() {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		msg, err := c.nc.RequestWithContext(ictx, userInfoSubject, nil)
		if err != nil {
			return
		}
		var ui userInfo
		if json.Unmarshal(msg.Data, &ui) != nil || ui.Error != nil || ui.Data == nil {
			return
		}
		var pub *subjectPermission
		if ui.Data.Permissions != nil {
			pub = ui.Data.Permissions.Publish
		}
		ok := true
		for _, s := range desiredSubjects() {
			ok = ok && pub.mayPublish(s)
		}
		c.desiredReadable = ok
	})
	return c.desiredReadable
}
