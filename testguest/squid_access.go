package main

import (
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
)

// AccessRequest is what http_access is checked against.
type AccessRequest struct {
	Src    netip.Addr // the client's address
	Host   string     // the target host as the client named it
	Port   int        // the target port
	Method string
	// Header is the client's request header, as it came (req_header acls
	// match it, also in request_header_access after squid's own edits).
	Header http.Header
	// Auth checks the request's credentials (called at most once, and only
	// when a line gets to a proxy_auth acl): the user name and whether they
	// are valid.
	Auth func() (string, bool)
}

// Verdict is the outcome of http_access.
type Verdict struct {
	Allow bool
	// Status is 403, or 407 when squid would ask for credentials.
	Status int
	Rule   string // the deciding line, or a note on the default
}

type evalState struct {
	req      *AccessRequest
	authDone bool
	user     string
	authOK   bool
}

func (s *evalState) auth() (string, bool) {
	if !s.authDone {
		s.authDone = true
		if s.req.Auth != nil {
			s.user, s.authOK = s.req.Auth()
		}
	}
	return s.user, s.authOK
}

// match evaluates one acl. needAuth is true when it is a proxy_auth acl and
// the request has no valid credentials: squid then stops and answers 407.
func (s *evalState) match(a *acl) (matched, needAuth bool) {
	r := s.req
	switch a.kind {
	case aclAll:
		return true, false
	case aclSrc:
		return containsAddr(a.nets, r.Src), false
	case aclDst:
		// squid resolves a name for dst; the guest matches only IP literals.
		h := strings.TrimSuffix(strings.TrimPrefix(r.Host, "["), "]")
		if i := strings.IndexByte(h, '%'); i >= 0 {
			h = h[:i]
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			return false, false
		}
		return containsAddr(a.nets, ip), false
	case aclProxyAuth:
		user, ok := s.auth()
		if !ok {
			return false, true
		}
		if a.users == nil {
			return true, false
		}
		for _, u := range a.users {
			if u == user {
				return true, false
			}
		}
		return false, false
	case aclPort:
		for _, p := range a.ports {
			if r.Port >= p.lo && r.Port <= p.hi {
				return true, false
			}
		}
		return false, false
	case aclMethod:
		for _, m := range a.methods {
			if m == r.Method {
				return true, false
			}
		}
		return false, false
	case aclReqHeader:
		for _, v := range r.Header.Values(a.header) {
			for _, re := range a.res {
				if re.MatchString(v) {
					return true, false
				}
			}
		}
		return false, false
	}
	return false, false
}

func containsAddr(nets []netip.Prefix, ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return false
	}
	for _, p := range nets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Access runs http_access as squid does: the lines in order, each an AND
// of its acls (stopping at the first that fails); the first line whose acls
// all match decides. A proxy_auth acl reached without valid credentials ends
// the check with 407; so does a deny line that ends in a proxy_auth acl (squid
// re-challenges so the user can log in as someone else). With no line
// matching, the answer is the opposite of the last line (deny without lines).
func (c *SquidConfig) Access(req *AccessRequest) Verdict {
	s := &evalState{req: req}
	var last *acl
	for _, rule := range c.access {
		all := true
		for _, ref := range rule.acls {
			last = ref.acl
			m, needAuth := s.match(ref.acl)
			if needAuth {
				return Verdict{Status: 407, Rule: rule.text}
			}
			if m == ref.not {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		if rule.allow {
			return Verdict{Allow: true, Rule: rule.text}
		}
		if last.kind == aclProxyAuth {
			return Verdict{Status: 407, Rule: rule.text}
		}
		return Verdict{Status: 403, Rule: rule.text}
	}
	if n := len(c.access); n > 0 && !c.access[n-1].allow {
		return Verdict{Allow: true, Rule: "no line matched; the last one denies, so allow"}
	}
	if last != nil && last.kind == aclProxyAuth {
		return Verdict{Status: 407, Rule: "no line matched"}
	}
	return Verdict{Status: 403, Rule: "no line matched"}
}

// headerAllowed applies request_header_access or reply_header_access to one
// header, as squid does: the rules for its name if there are any, else those
// for All, as an access list (the first rule whose acls match decides; none
// matching: the opposite of the last rule); no rule at all: allowed.
func headerAllowed(rules []headerRule, name string, s *evalState) bool {
	for _, pass := range []string{name, "All"} {
		var last *headerRule
		for i := range rules {
			r := &rules[i]
			if r.name != pass {
				continue
			}
			last = r
			all := true
			for _, ref := range r.acls {
				m, _ := s.match(ref.acl)
				if m == ref.not {
					all = false
					break
				}
			}
			if all {
				return r.allow
			}
		}
		if last != nil {
			return !last.allow
		}
	}
	return true
}

// MangleRequest turns the client's request headers (hop-by-hop headers and
// Proxy-Authorization already removed) into those squid would send: it adds
// or edits X-Forwarded-For (forwarded_for) and Via (via), then applies
// request_header_access to the result, as squid does to its own headers too.
// proto is the client's HTTP version ("1.1").
func (c *SquidConfig) MangleRequest(h http.Header, req *AccessRequest, proto, hostname string) {
	client := "unknown"
	if req.Src.IsValid() {
		client = req.Src.Unmap().String()
	}
	xff := strings.Join(h.Values("X-Forwarded-For"), ", ")
	switch c.ForwardedFor {
	case "on":
		xff = joinList(xff, client)
	case "off":
		xff = joinList(xff, "unknown")
	case "truncate":
		xff = client
	case "delete":
		xff = ""
	case "transparent":
	}
	h.Del("X-Forwarded-For")
	if xff != "" {
		h.Set("X-Forwarded-For", xff)
	}
	if c.Via {
		addVia(h, proto, hostname)
	}
	filterHeaders(h, c.requestHeader, &evalState{req: req})
}

// MangleReply adds the headers squid adds to a reply (Via, X-Cache,
// X-Cache-Lookup: nothing is cached) and applies reply_header_access.
func (c *SquidConfig) MangleReply(h http.Header, req *AccessRequest, proto, hostname string) {
	if c.Via {
		addVia(h, proto, hostname)
	}
	h.Set("X-Cache", "MISS from "+hostname)
	h.Set("X-Cache-Lookup", "NONE from "+hostname+":"+strconv.Itoa(c.Port))
	filterHeaders(h, c.replyHeader, &evalState{req: req})
}

func joinList(list, v string) string {
	if list == "" {
		return v
	}
	return list + ", " + v
}

func addVia(h http.Header, proto, hostname string) {
	via := joinList(strings.Join(h.Values("Via"), ", "), proto+" "+hostname+" (squid)")
	h.Set("Via", via)
}

func filterHeaders(h http.Header, rules []headerRule, s *evalState) {
	if len(rules) == 0 {
		return
	}
	for k := range h {
		if !headerAllowed(rules, textproto.CanonicalMIMEHeaderKey(k), s) {
			delete(h, k)
		}
	}
}

// HasOutgoing reports whether the config has tcp_outgoing_address lines:
// without any, the kernel chooses every connection's source address.
func (c *SquidConfig) HasOutgoing() bool { return len(c.outgoing) > 0 }

// OutgoingAddress is the local address tcp_outgoing_address gives a
// connection of req to a destination of dst's family, as squid (5.7)
// chooses it: the lines in order, each skipped unless its address is of
// that family, the first whose acls all match (a line without acls
// matches). Invalid when none does: the kernel chooses. An acl that
// needs credentials the request lacks does not match.
func (c *SquidConfig) OutgoingAddress(req *AccessRequest, dst netip.Addr) netip.Addr {
	s := &evalState{req: req}
	is4 := dst.Unmap().Is4()
	for _, r := range c.outgoing {
		if r.addr.Is4() != is4 {
			continue
		}
		all := true
		for _, ref := range r.acls {
			m, needAuth := s.match(ref.acl)
			if needAuth || m == ref.not {
				all = false
				break
			}
		}
		if all {
			return r.addr
		}
	}
	return netip.Addr{}
}
