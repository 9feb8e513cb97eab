package messages

import (
	"net"
	"strconv"
	"time"
)

// The rotation's feed: the publishing health process sends every change of
// the rotation on <prefix>.rotation.changes (RotationChanges), in messages
// of at most MaxBodySize whatever the size of the fleet, and answers the
// whole rotation in pages on <prefix>.rotation.get (RotationGet, answered
// by a RotationPage). A consumer subscribes to the feed first, keeping
// what arrives, reads the pages (their versions V1 <= ... <= Vk, the
// rotation may move on between them), then applies the kept messages of
// versions above V1 in order; from then on each message whose Prev is the
// version it holds. Every change is the absolute state of one proxy (its
// whole entry, or gone), so applying one again is harmless, and the
// result is exactly the rotation at the last version applied. A message
// whose Prev is not the version held is a gap (a message lost, a new
// publisher): the consumer reads the pages again.

// Operations of a RotationChange.
const (
	// ChangeEntered: the proxy entered the rotation; Proxy is its entry.
	ChangeEntered = "entered"
	// ChangeChanged: the proxy's entry changed (address, host, labels,
	// egress or since); Proxy is its whole new entry.
	ChangeChanged = "changed"
	// ChangeLeft: the proxy left the rotation; Proxy is absent.
	ChangeLeft = "left"
)

// RotationChange is one change of one proxy's place in the rotation.
type RotationChange struct {
	Op string `json:"op"`
	ID string `json:"id"`
	// Proxy is the proxy's whole entry now (entered, changed); absent for
	// left.
	Proxy *RotationEntry `json:"proxy,omitempty"`
}

// RotationChanges is one message of the rotation's feed, on
// <prefix>.rotation.changes: the changes that bring the rotation from
// version Prev to version Version. Versions only grow; Prev 0 means that
// the message follows no version a consumer can hold (a new publisher, or
// one that took the lease again): every consumer reads the pages again. A
// message whose Prev equals its Version and that has no changes is a
// heartbeat the publisher sends when it has had nothing to say for a
// while (a third of its lease's TTL), so that a consumer that lost the
// last message learns it. Size is the number of proxies in the rotation at
// Version, a check a consumer makes after applying the changes.
type RotationChanges struct {
	V       int              `json:"v"`
	Version uint64           `json:"version"`
	Prev    uint64           `json:"prev"`
	Size    int              `json:"size"`
	Changes []RotationChange `json:"changes"`
	At      time.Time        `json:"at"`
}

// RotationGet asks the publishing health process for one page of the
// rotation, on <prefix>.rotation.get: the proxies whose ids sort after
// After (all from the first page when empty), at most Limit of them (0:
// as many as a page holds, whose body stays within MaxBodySize).
type RotationGet struct {
	V     int    `json:"v"`
	After string `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// MaxPageLimit bounds RotationGet.Limit.
const MaxPageLimit = 10000

// RotationPage answers a RotationGet: the proxies of the rotation at
// Version whose ids sort after the request's After, sorted by id. Next is
// the id to ask after for the next page, "" when this page is the last.
// Size is the number of proxies in the whole rotation at Version. Error,
// when set, says why the request was refused (its field named: "limit:
// ...") or why the process cannot answer now ("standing by"), and the
// rest is empty.
type RotationPage struct {
	V       int             `json:"v"`
	Version uint64          `json:"version"`
	Size    int             `json:"size"`
	Proxies []RotationEntry `json:"proxies"`
	Next    string          `json:"next,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// DecodeRotationChanges decodes a message of the feed strictly and checks
// it (see RotationChanges.Validate).
func DecodeRotationChanges(body []byte) (RotationChanges, error) {
	var m RotationChanges
	if err := decodeStrict(body, &m); err != nil {
		return RotationChanges{}, err
	}
	return m, m.Validate()
}

// Validate checks a feed message: the version, versions that do not go
// back, each change's operation, id and entry, and no id twice.
func (m RotationChanges) Validate() error {
	if m.V != Version {
		return fieldErr("v", "version %d is not supported, want %d", m.V, Version)
	}
	if m.Version == 0 {
		return fieldErr("version", "missing")
	}
	if m.Prev > m.Version {
		return fieldErr("prev", "%d is after version %d", m.Prev, m.Version)
	}
	if m.Size < 0 {
		return fieldErr("size", "%d is negative", m.Size)
	}
	if m.Changes == nil {
		return fieldErr("changes", "missing")
	}
	seen := make(map[string]bool, len(m.Changes))
	for i, c := range m.Changes {
		if err := c.validate(); err != nil {
			fe, _ := AsFieldError(err)
			return fieldErr("changes["+strconv.Itoa(i)+"]."+fe.Field, "%s", fe.Reason)
		}
		if seen[c.ID] {
			return fieldErr("changes["+strconv.Itoa(i)+"].id", "%q changes twice in one message", c.ID)
		}
		seen[c.ID] = true
	}
	return nil
}

func (c RotationChange) validate() error {
	if !ValidID(c.ID) {
		return fieldErr("id", "%q is not a valid id", truncate(c.ID))
	}
	switch c.Op {
	case ChangeEntered, ChangeChanged:
		if c.Proxy == nil {
			return fieldErr("proxy", "missing for %s", c.Op)
		}
		if c.Proxy.ID != c.ID {
			return fieldErr("proxy.id", "%q is not the change's id %q", truncate(c.Proxy.ID), c.ID)
		}
		if err := c.Proxy.validate(); err != nil {
			fe, _ := AsFieldError(err)
			return fieldErr("proxy."+fe.Field, "%s", fe.Reason)
		}
		return nil
	case ChangeLeft:
		if c.Proxy != nil {
			return fieldErr("proxy", "present for left")
		}
		return nil
	}
	return fieldErr("op", "%q is not %s, %s or %s", truncate(c.Op), ChangeEntered, ChangeChanged, ChangeLeft)
}

// validate checks what a consumer relies on of an entry: its id and an
// address it can dial.
func (e RotationEntry) validate() error {
	if !ValidID(e.ID) {
		return fieldErr("id", "%q is not a valid id", truncate(e.ID))
	}
	if _, _, err := net.SplitHostPort(e.Addr); err != nil || e.Addr == "" {
		return fieldErr("addr", "%q is not host:port", truncate(e.Addr))
	}
	return nil
}

// DecodeRotationGet decodes a page request strictly and checks it.
func DecodeRotationGet(body []byte) (RotationGet, error) {
	var g RotationGet
	if err := decodeStrict(body, &g); err != nil {
		return RotationGet{}, err
	}
	if g.V != Version {
		return g, fieldErr("v", "version %d is not supported, want %d", g.V, Version)
	}
	if g.After != "" && !ValidID(g.After) {
		return g, fieldErr("after", "%q is not a valid id", truncate(g.After))
	}
	if g.Limit < 0 || g.Limit > MaxPageLimit {
		return g, fieldErr("limit", "%d is out of range [0, %d]", g.Limit, MaxPageLimit)
	}
	return g, nil
}

// DecodeRotationPage decodes a page strictly and checks it: its entries
// sorted by id, each valid; a page that carries an error is returned with
// it (a *PageError).
func DecodeRotationPage(body []byte) (RotationPage, error) {
	var p RotationPage
	if err := decodeStrict(body, &p); err != nil {
		return RotationPage{}, err
	}
	if p.V != Version {
		return p, fieldErr("v", "version %d is not supported, want %d", p.V, Version)
	}
	if p.Error != "" {
		return p, &PageError{Reason: p.Error}
	}
	if p.Version == 0 {
		return p, fieldErr("version", "missing")
	}
	if p.Proxies == nil {
		return p, fieldErr("proxies", "missing")
	}
	for i, e := range p.Proxies {
		if err := e.validate(); err != nil {
			fe, _ := AsFieldError(err)
			return p, fieldErr("proxies["+strconv.Itoa(i)+"]."+fe.Field, "%s", fe.Reason)
		}
		if i > 0 && p.Proxies[i-1].ID >= e.ID {
			return p, fieldErr("proxies["+strconv.Itoa(i)+"].id", "%q does not sort after %q", e.ID, p.Proxies[i-1].ID)
		}
	}
	if p.Next != "" && (len(p.Proxies) == 0 || p.Next != p.Proxies[len(p.Proxies)-1].ID) {
		return p, fieldErr("next", "%q is not the page's last id", truncate(p.Next))
	}
	return p, nil
}

// PageError is a page request the health process refused or could not
// answer (RotationPage.Error).
type PageError struct{ Reason string }

func (e *PageError) Error() string { return "rotation page: " + e.Reason }
