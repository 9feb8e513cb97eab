package bans

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/idna"
)

// Bounds of gateway.rules (those of body_peek and retry_body_bytes are
// the gateway's, in proxyfleet/gateway/defaults).
const (
	// MaxRules bounds gateway.rules, MaxStatuses and MaxSites a rule's
	// lists, MaxBodyPattern a rule's expression (bytes).
	MaxRules       = 100
	MaxStatuses    = 64
	MaxSites       = 256
	MaxBodyPattern = 1024
	// MaxFirstByte bounds a rule's first_byte.
	MaxFirstByte = 10 * time.Minute
)

// RuleSpec is one rule as configured (gateway.rules[i]): triggers
// (Status, Body, FirstByte; every one given must hold), narrowed to the
// hosts of Sites when given, and actions (Ban, Retry).
type RuleSpec struct {
	// Status: the answer's status is one of these.
	Status []int `yaml:"status" json:"status,omitempty"`
	// Sites: host patterns, "shop.example" (that host) or
	// "*.shop.example" (any host under it, not shop.example itself).
	// Empty: every host; a body rule must name its sites.
	Sites []string `yaml:"sites" json:"sites,omitempty"`
	// Body: a regular expression (RE2) over the first body_peek bytes of
	// the answer's body.
	Body string `yaml:"body" json:"body,omitempty"`
	// FirstByte: the answer's first byte took at least this long (or
	// never came).
	FirstByte time.Duration `yaml:"first_byte" json:"first_byte,omitempty"`
	// Ban: ban the answering address for the request's site this long.
	Ban time.Duration `yaml:"ban" json:"ban,omitempty"`
	// Retry: send the request again through another address (at most
	// gateway.retries times).
	Retry bool `yaml:"retry" json:"retry,omitempty"`
}

// RuleError names the rule (its index) and field at fault; Index -1 is
// the list as a whole.
type RuleError struct {
	Index  int
	Field  string
	Reason string
}

func (e *RuleError) Error() string { return e.Path("rules") + ": " + e.Reason }

// Path is the field's path under prefix ("gateway.rules[1].status").
func (e *RuleError) Path(prefix string) string {
	if e.Index < 0 {
		return prefix
	}
	return fmt.Sprintf("%s[%d].%s", prefix, e.Index, e.Field)
}

// Rules are compiled rules, tried in order by Match. The zero Rules (or
// nil) has none. Safe for concurrent use once compiled.
type Rules struct{ rules []rule }

type rule struct {
	status    []int
	exact     []string // hosts
	suffixes  []string // ".shop.example" for *.shop.example
	body      *regexp.Regexp
	firstByte time.Duration
	ban       time.Duration
	retry     bool
}

// Compile checks specs and compiles them; an error is a *RuleError.
func Compile(specs []RuleSpec) (*Rules, error) {
	if len(specs) > MaxRules {
		return nil, &RuleError{Index: -1, Reason: fmt.Sprintf("%d rules, at most %d", len(specs), MaxRules)}
	}
	rs := &Rules{}
	for i, s := range specs {
		r, err := compile(s)
		if err != nil {
			err.Index = i
			return nil, err
		}
		rs.rules = append(rs.rules, r)
	}
	return rs, nil
}

func compile(s RuleSpec) (rule, *RuleError) {
	bad := func(f, format string, args ...any) (rule, *RuleError) {
		return rule{}, &RuleError{Field: f, Reason: fmt.Sprintf(format, args...)}
	}
	r := rule{firstByte: s.FirstByte, ban: s.Ban, retry: s.Retry}
	if len(s.Status) > MaxStatuses {
		return bad("status", "%d statuses, at most %d", len(s.Status), MaxStatuses)
	}
	for j, st := range s.Status {
		if st < 100 || st > 599 {
			return bad(fmt.Sprintf("status[%d]", j), "%d is not an HTTP status (100 to 599)", st)
		}
		if slices.Contains(r.status, st) {
			return bad(fmt.Sprintf("status[%d]", j), "%d is listed twice", st)
		}
		r.status = append(r.status, st)
	}
	if len(s.Sites) > MaxSites {
		return bad("sites", "%d patterns, at most %d", len(s.Sites), MaxSites)
	}
	for j, p := range s.Sites {
		exact, suffix, err := hostPattern(p)
		if err != nil {
			return bad(fmt.Sprintf("sites[%d]", j), "%v", err)
		}
		if exact != "" {
			r.exact = append(r.exact, exact)
		} else {
			r.suffixes = append(r.suffixes, suffix)
		}
	}
	if s.Body != "" {
		if len(s.Body) > MaxBodyPattern {
			return bad("body", "%d bytes, at most %d", len(s.Body), MaxBodyPattern)
		}
		re, err := regexp.Compile(s.Body)
		if err != nil {
			return bad("body", "%v", err)
		}
		if len(s.Sites) == 0 {
			return bad("sites", "a body rule names its sites: bodies are read only for them")
		}
		r.body = re
	}
	if s.FirstByte < 0 || s.FirstByte > MaxFirstByte {
		return bad("first_byte", "%s is out of range [0, %s]", s.FirstByte, MaxFirstByte)
	}
	if len(r.status) == 0 && r.body == nil && r.firstByte == 0 {
		return bad("status", "no trigger: give status, body or first_byte")
	}
	if s.Ban != 0 && (s.Ban < MinDuration || s.Ban > MaxDuration) {
		return bad("ban", "%s is out of range [%s, %s]", s.Ban, MinDuration, MaxDuration)
	}
	if s.Ban == 0 && !s.Retry {
		return bad("ban", "no action: give ban, retry or both")
	}
	return r, nil
}

// hostPattern normalizes a pattern of sites: a host name (IDNA, lowercase,
// no trailing dot) or an address, exact; or "*." and a host name, a
// suffix (returned with its leading dot).
func hostPattern(p string) (exact, suffix string, err error) {
	name, wild := strings.CutPrefix(p, "*.")
	if a, err := ParseAddr(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")); err == nil && !wild {
		return a.String(), "", nil
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" || strings.Contains(name, "*") {
		return "", "", fmt.Errorf("%q: want a host name or *.name", clip(p))
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil || ascii == "" || strings.Contains(ascii, "..") || len(ascii) > MaxHostLen {
		return "", "", fmt.Errorf("%q: not a host name", clip(p))
	}
	if wild {
		return "", "." + ascii, nil
	}
	return ascii, "", nil
}

// Answer is what Match judges: the request's host and what its proxy
// answered.
type Answer struct {
	// Host is the request's target host, as it came (case and a trailing
	// dot do not matter; an IDN host is matched in its ASCII form).
	Host string
	// Status is the answer's status; 0 if none came.
	Status int
	// Body is the first body_peek bytes of the body, when NeedsBody said
	// to read them; nil otherwise.
	Body []byte
	// FirstByte is the time from the request sent to the answer's first
	// byte (the wait so far, when none came).
	FirstByte time.Duration
}

// Actions is what a rule decided.
type Actions struct {
	// Rule is the index of the rule that decided; -1 when none matched.
	Rule int
	// Ban: ban the answering address for the request's site this long (0:
	// no ban).
	Ban time.Duration
	// Retry: send the request again through another address.
	Retry bool
}

// None is the decision when no rule matches.
var None = Actions{Rule: -1}

// Len is the number of rules.
func (rs *Rules) Len() int {
	if rs == nil {
		return 0
	}
	return len(rs.rules)
}

// Match returns the actions of the first rule whose sites take a.Host and
// whose every trigger holds; None when no rule does. It allocates
// nothing for an ASCII lowercase host.
func (rs *Rules) Match(a Answer) Actions {
	if rs == nil {
		return None
	}
	host := matchHost(a.Host)
	for i := range rs.rules {
		r := &rs.rules[i]
		if !r.takes(host) {
			continue
		}
		if len(r.status) > 0 && !slices.Contains(r.status, a.Status) {
			continue
		}
		if r.firstByte > 0 && a.FirstByte < r.firstByte {
			continue
		}
		if r.body != nil && (a.Body == nil || !r.body.Match(a.Body)) {
			continue
		}
		return Actions{Rule: i, Ban: r.ban, Retry: r.retry}
	}
	return None
}

// NeedsBody reports whether a body rule names host: only then is the
// answer's body peeked at.
func (rs *Rules) NeedsBody(host string) bool {
	if rs == nil {
		return false
	}
	h := matchHost(host)
	for i := range rs.rules {
		if rs.rules[i].body != nil && rs.rules[i].takes(h) {
			return true
		}
	}
	return false
}

// takes reports whether the rule applies to host (normalized by
// matchHost).
func (r *rule) takes(host string) bool {
	if len(r.exact) == 0 && len(r.suffixes) == 0 {
		return true
	}
	if slices.Contains(r.exact, host) {
		return true
	}
	for _, s := range r.suffixes {
		if len(host) > len(s) && strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// matchHost is host as patterns are written: lowercase ASCII (IDNA) with
// no trailing dot and no brackets; an address in canonical form.
func matchHost(host string) string {
	host = strings.TrimSuffix(host, ".")
	if strings.HasPrefix(host, "[") {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if lowerASCII(host) && !strings.Contains(host, ":") {
		return host
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
	}
	if ascii, err := idna.Lookup.ToASCII(host); err == nil {
		return ascii
	}
	return strings.ToLower(host)
}

func lowerASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || c >= 'A' && c <= 'Z' {
			return false
		}
	}
	return true
}
