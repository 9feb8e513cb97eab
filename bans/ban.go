package bans

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unicode"

	"proxyfleet/messages"
)

// Sources of a ban: who reported it. They are the values of the source
// label of the bans metric, and of Ban.Source.
const (
	SourceRule    = "rule"    // a gateway rule matched an answer
	SourceCLI     = "cli"     // proxyfleet ban add
	SourceHeader  = "header"  // a client of the gateway asked in a header
	SourceLibrary = "library" // a program called rotation.Rotation.Ban
)

// Sources lists every source, for metrics.
var Sources = []string{SourceRule, SourceCLI, SourceHeader, SourceLibrary}

// Bounds of a ban.
const (
	MinDuration = time.Second
	MaxDuration = 30 * 24 * time.Hour
	// MaxReason bounds a ban's reason, in bytes.
	MaxReason = 256
	// MaxBy bounds the name of who asked, in bytes.
	MaxBy = 128
)

// Ban is the record of one ban in PROXY_BANS, under Key(Address, Site).
// The entry's own TTL ends it in the bucket; Until ends it for a reader
// whose watch has not delivered the end yet.
type Ban struct {
	V       int       `json:"v"`
	Address string    `json:"address"`
	Site    string    `json:"site"`
	At      time.Time `json:"at"`
	Until   time.Time `json:"until"`
	Source  string    `json:"source"`
	Reason  string    `json:"reason,omitempty"`
	// By names who asked (a gateway's or program's reporter name, the
	// CLI's user), when known.
	By string `json:"by,omitempty"`
}

// Addr is the ban's address (the zero Addr for an invalid record).
func (b Ban) Addr() netip.Addr {
	a, _ := ParseAddr(b.Address)
	return a
}

// Key is the ban's key in PROXY_BANS.
func (b Ban) Key() string { return Key(b.Addr(), b.Site) }

// Validate checks a record: version, canonical address and site, an end
// after its start, a known source, a printable reason.
func (b Ban) Validate() error {
	if b.V != messages.Version {
		return field("v", "version %d is not supported, want %d", b.V, messages.Version)
	}
	if err := checkTarget(b.Address, b.Site, true); err != nil {
		return err
	}
	if b.At.IsZero() {
		return field("at", "missing")
	}
	if !b.Until.After(b.At) {
		return field("until", "%s is not after at %s", b.Until.Format(time.RFC3339), b.At.Format(time.RFC3339))
	}
	return checkAbout(b.Source, b.Reason, b.By)
}

// DecodeBan decodes a record strictly and validates it.
func DecodeBan(body []byte) (Ban, error) {
	var b Ban
	if err := messages.Decode(body, &b); err != nil {
		return Ban{}, err
	}
	return b, b.Validate()
}

// Ops of a Request.
const (
	OpAdd    = "add"
	OpRemove = "remove"
)

// Request is the body of a request on <prefix>.ban: add a ban of Address
// for Site lasting For, or remove it. Site may be any host: it is
// narrowed to its site (Site). Health answers with a Reply.
type Request struct {
	V       int               `json:"v"`
	Op      string            `json:"op"`
	Address string            `json:"address"`
	Site    string            `json:"site"`
	For     messages.Duration `json:"for,omitempty"`
	Source  string            `json:"source,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	By      string            `json:"by,omitempty"`
}

// Reply answers a Request: the ban stored (an add), or the error, with
// the field at fault when the request was invalid.
type Reply struct {
	V     int    `json:"v"`
	Ban   *Ban   `json:"ban,omitempty"`
	Error string `json:"error,omitempty"`
	Field string `json:"field,omitempty"`
}

// DecodeRequest decodes a request strictly and validates it: a known op,
// an address, a host, a duration within [MinDuration, MaxDuration] for
// an add (none for a remove), a known source (an add's), a printable
// reason. The site is returned narrowed (Site).
func DecodeRequest(body []byte) (Request, error) {
	var r Request
	if err := messages.Decode(body, &r); err != nil {
		return Request{}, err
	}
	if r.V != messages.Version {
		return r, field("v", "version %d is not supported, want %d", r.V, messages.Version)
	}
	if r.Op != OpAdd && r.Op != OpRemove {
		return r, field("op", "%q: want %q or %q", clip(r.Op), OpAdd, OpRemove)
	}
	a, err := ParseAddr(r.Address)
	if err != nil {
		return r, field("address", "%v", err)
	}
	r.Address = a.String()
	site, err := Site(r.Site)
	if err != nil {
		return r, field("site", "%v", err)
	}
	r.Site = site
	if r.Op == OpRemove {
		if r.For != 0 {
			return r, field("for", "a remove takes no duration")
		}
		return r, checkText(r.Reason, r.By)
	}
	if d := r.For.D(); d < MinDuration || d > MaxDuration {
		return r, field("for", "%s is out of range [%s, %s]", d, MinDuration, MaxDuration)
	}
	return r, checkAbout(r.Source, r.Reason, r.By)
}

// Add is r made an add request: version and op set, an empty Source
// taken as source, an empty By as by.
func (r Request) Add(source, by string) Request {
	r.V, r.Op = messages.Version, OpAdd
	if r.Source == "" {
		r.Source = source
	}
	if r.By == "" {
		r.By = by
	}
	return r
}

// Stored is the ban an answer to an add says was stored.
func (r Reply) Stored() (Ban, error) {
	if r.Ban == nil {
		return Ban{}, errors.New("health's answer has no ban")
	}
	return *r.Ban, nil
}

// Encode validates r as health will (DecodeRequest) and returns its body
// and r normalized (its site narrowed).
func (r Request) Encode() ([]byte, Request, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, r, fmt.Errorf("encode ban request: %w", err)
	}
	r, err = DecodeRequest(body)
	return body, r, err
}

// DecodeReply decodes health's answer strictly. A refusal is returned
// as a *messages.FieldError naming the field; a failure to store, as an
// error with health's reason.
func DecodeReply(body []byte) (Reply, error) {
	var r Reply
	if err := messages.Decode(body, &r); err != nil {
		return Reply{}, fmt.Errorf("health's answer: %w", err)
	}
	switch {
	case r.Field != "":
		return r, field(r.Field, "%s", r.Error)
	case r.Error != "":
		return r, fmt.Errorf("health: %s", r.Error)
	}
	return r, nil
}

// Ban is the record an add request stores, made at now.
func (r Request) Ban(now time.Time) Ban {
	now = now.UTC().Truncate(time.Millisecond)
	return Ban{V: messages.Version, Address: r.Address, Site: r.Site, At: now, Until: now.Add(r.For.D()),
		Source: r.Source, Reason: r.Reason, By: r.By}
}

// checkTarget checks address and site; canonical demands them in the
// form Key writes.
func checkTarget(address, site string, canonical bool) error {
	a, err := ParseAddr(address)
	if err != nil {
		return field("address", "%v", err)
	}
	if canonical && a.String() != address {
		return field("address", "%q is not canonical (%s)", clip(address), a)
	}
	s, err := Site(site)
	if err != nil {
		return field("site", "%v", err)
	}
	if canonical && s != site {
		return field("site", "%q is not a site (its site is %s)", clip(site), s)
	}
	return nil
}

func checkAbout(source, reason, by string) error {
	switch source {
	case SourceRule, SourceCLI, SourceHeader, SourceLibrary:
	default:
		return field("source", "%q: want one of %v", clip(source), Sources)
	}
	return checkText(reason, by)
}

func checkText(reason, by string) error {
	if err := printable(reason, MaxReason); err != nil {
		return field("reason", "%v", err)
	}
	if err := printable(by, MaxBy); err != nil {
		return field("by", "%v", err)
	}
	return nil
}

// printable refuses text over max bytes or with control characters (a
// reason is printed in a terminal).
func printable(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, at most %d", len(s), max)
	}
	for _, c := range s {
		if c == unicode.ReplacementChar || !unicode.IsPrint(c) && c != ' ' {
			return fmt.Errorf("%q has a control or invalid character", clip(s))
		}
	}
	return nil
}

// field is a refusal naming the field at fault, as package messages
// names them.
func field(name, format string, args ...any) error {
	return &messages.FieldError{Field: name, Reason: fmt.Sprintf(format, args...)}
}
