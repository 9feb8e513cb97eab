package main

import (
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// SquidConfPath is where a cloud-config puts squid's configuration.
const SquidConfPath = "/etc/squid/squid.conf"

// defaultRealm is squid's basic auth realm when auth_param basic realm is unset.
const defaultRealm = "Squid proxy-caching web server"

// SquidConfig is the part of a squid.conf the test guest emulates: http_port,
// basic auth through basic_ncsa_auth, the acl types src, dst, proxy_auth, port,
// method and req_header, http_access, via, forwarded_for, visible_hostname,
// request/reply_header_access and tcp_outgoing_address. Directives that only tune squid itself (cache,
// logs, helpers' counts) are listed in Ignored; a directive or acl that would
// change who may use the proxy and is not emulated is an error, so that such a
// config fails closed instead of running with other semantics.
type SquidConfig struct {
	Host string // http_port's address, "" for every address
	Port int    // http_port's port (3128 when the config has none)

	Realm          string
	PasswdFile     string // basic_ncsa_auth's file; "" without auth_param basic program
	CaseSensitive  bool   // auth_param basic casesensitive
	CredentialsTTL time.Duration

	VisibleHostname string
	Via             bool
	ForwardedFor    string // on, off, delete, transparent or truncate

	Ignored []string // directives read and not emulated, for the log

	acls          map[string]*acl
	access        []accessRule
	requestHeader []headerRule
	replyHeader   []headerRule
	outgoing      []outgoingRule
}

// outgoingRule is one tcp_outgoing_address line: the local address and
// the acls (all must match) that select it.
type outgoingRule struct {
	addr netip.Addr
	acls []aclRef
}

type aclKind int

const (
	aclAll aclKind = iota // the built-in all: matches every request
	aclSrc
	aclDst
	aclProxyAuth
	aclPort
	aclMethod
	aclReqHeader
)

type portRange struct{ lo, hi int }

type acl struct {
	name    string
	kind    aclKind
	typ     string // as written, for messages
	nets    []netip.Prefix
	users   []string // proxy_auth user names; nil is REQUIRED (any valid user)
	ports   []portRange
	methods []string
	header  string           // req_header: the header's name
	res     []*regexp.Regexp // req_header: any value matching any of them
}

type aclRef struct {
	acl *acl
	not bool
}

type accessRule struct {
	allow bool
	acls  []aclRef
	text  string
}

type headerRule struct {
	name  string // canonical header name, or "All"
	allow bool
	acls  []aclRef
}

// builtinACLs are squid's predefined acls.
func builtinACLs() map[string]*acl {
	p := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	return map[string]*acl{
		"all":          {name: "all", kind: aclAll, typ: "src", nets: p("0.0.0.0/0", "::/0")},
		"localhost":    {name: "localhost", kind: aclSrc, typ: "src", nets: p("127.0.0.1/32", "::1/128")},
		"to_localhost": {name: "to_localhost", kind: aclDst, typ: "dst", nets: p("127.0.0.0/8", "0.0.0.0/32", "::1/128", "::/128")},
		"to_linklocal": {name: "to_linklocal", kind: aclDst, typ: "dst", nets: p("169.254.0.0/16", "fe80::/10")},
	}
}

// ignoredDirectives change nothing a client of the test guest can observe
// (or only squid's own housekeeping); they are accepted and listed.
var ignoredDirectives = map[string]bool{
	"cache": true, "cache_mem": true, "cache_dir": true, "maximum_object_size": true,
	"maximum_object_size_in_memory": true, "access_log": true, "cache_log": true,
	"cache_store_log": true, "logfile_rotate": true, "logformat": true,
	"shutdown_lifetime": true, "coredump_dir": true, "pid_filename": true,
	"httpd_suppress_version_string": true, "refresh_pattern": true, "dns_nameservers": true,
	"dns_v4_first": true, "workers": true, "cache_effective_user": true,
	"cache_effective_group": true, "error_directory": true, "connect_timeout": true,
	"read_timeout": true, "request_timeout": true, "client_lifetime": true,
	"pconn_timeout": true, "forward_timeout": true, "memory_pools": true, "debug_options": true,
	"cache_mgr": true, "negative_ttl": true, "positive_dns_ttl": true, "negative_dns_ttl": true,
	"hosts_file": true, "client_persistent_connections": true, "server_persistent_connections": true,
	"icp_port": true, "htcp_port": true, "snmp_port": true, "error_default_language": true,
}

// ParseSquidConf parses a squid.conf. files holds the other files the
// cloud-config writes, for acl values given as "/path" (squid reads them).
func ParseSquidConf(b []byte, files map[string][]byte) (*SquidConfig, error) {
	c := &SquidConfig{
		Port:           3128,
		Realm:          defaultRealm,
		CredentialsTTL: 2 * time.Hour,
		Via:            true,
		ForwardedFor:   "on",
		acls:           builtinACLs(),
	}
	ports := 0
	for _, ln := range squidLines(string(b)) {
		f := strings.Fields(ln.text)
		errf := func(format string, args ...any) error {
			return fmt.Errorf("squid.conf line %d: %s", ln.no, fmt.Sprintf(format, args...))
		}
		need := func(n int) error {
			if len(f) < n {
				return errf("%s: missing argument", f[0])
			}
			return nil
		}
		switch f[0] {
		case "http_port":
			if err := need(2); err != nil {
				return nil, err
			}
			if ports++; ports > 1 {
				return nil, errf("more than one http_port is not emulated")
			}
			host, port, err := parseHTTPPort(f[1])
			if err != nil {
				return nil, errf("http_port: %v", err)
			}
			for _, o := range f[2:] {
				switch k, _, _ := strings.Cut(o, "="); k {
				case "intercept", "transparent", "tproxy", "accel", "ssl-bump", "vhost", "vport", "defaultsite":
					return nil, errf("http_port option %s is not emulated", o)
				}
			}
			c.Host, c.Port = host, port
		case "auth_param":
			if err := need(3); err != nil {
				return nil, err
			}
			if f[1] != "basic" {
				return nil, errf("auth_param scheme %s is not emulated (only basic)", f[1])
			}
			if err := c.authParam(f[2], f[3:]); err != nil {
				return nil, errf("auth_param basic %s: %v", f[2], err)
			}
		case "acl":
			if err := need(3); err != nil {
				return nil, err
			}
			if err := c.addACL(f[1], f[2], f[3:], files); err != nil {
				return nil, errf("acl %s: %v", f[1], err)
			}
		case "http_access":
			if err := need(3); err != nil {
				return nil, err
			}
			allow, err := allowDeny(f[1])
			if err != nil {
				return nil, errf("http_access: %v", err)
			}
			refs, err := c.refs(f[2:])
			if err != nil {
				return nil, errf("http_access: %v", err)
			}
			c.access = append(c.access, accessRule{allow: allow, acls: refs, text: strings.Join(f, " ")})
		case "request_header_access", "reply_header_access":
			if err := need(4); err != nil {
				return nil, err
			}
			allow, err := allowDeny(f[2])
			if err != nil {
				return nil, errf("%s: %v", f[0], err)
			}
			refs, err := c.refs(f[3:])
			if err != nil {
				return nil, errf("%s: %v", f[0], err)
			}
			name := canonicalHeader(f[1])
			if f[1] == "Other" {
				return nil, errf("%s Other is not emulated", f[0])
			}
			r := headerRule{name: name, allow: allow, acls: refs}
			if f[0] == "request_header_access" {
				c.requestHeader = append(c.requestHeader, r)
			} else {
				c.replyHeader = append(c.replyHeader, r)
			}
		case "via":
			if err := need(2); err != nil {
				return nil, err
			}
			on, err := onOff(f[1])
			if err != nil {
				return nil, errf("via: %v", err)
			}
			c.Via = on
		case "forwarded_for":
			if err := need(2); err != nil {
				return nil, err
			}
			switch f[1] {
			case "on", "off", "delete", "transparent", "truncate":
				c.ForwardedFor = f[1]
			default:
				return nil, errf("forwarded_for: %q is not on, off, delete, transparent or truncate", f[1])
			}
		case "tcp_outgoing_address":
			if err := need(2); err != nil {
				return nil, err
			}
			a, err := netip.ParseAddr(f[1])
			if err != nil || a.Zone() != "" {
				return nil, errf("tcp_outgoing_address: %q is not an address", f[1])
			}
			refs, err := c.refs(f[2:])
			if err != nil {
				return nil, errf("tcp_outgoing_address: %v", err)
			}
			c.outgoing = append(c.outgoing, outgoingRule{addr: a.Unmap(), acls: refs})
		case "visible_hostname":
			if err := need(2); err != nil {
				return nil, err
			}
			c.VisibleHostname = f[1]
		case "include":
			return nil, errf("include is not emulated")
		default:
			if !ignoredDirectives[f[0]] {
				// Anything else may matter to squid; the guest does not know.
				c.Ignored = append(c.Ignored, f[0]+" (unknown)")
				continue
			}
			c.Ignored = append(c.Ignored, f[0])
		}
	}
	for _, a := range c.acls {
		if a.kind == aclProxyAuth && c.PasswdFile == "" {
			// squid: "ACL proxy_auth requires an auth scheme".
			return nil, fmt.Errorf("squid.conf: acl %s is proxy_auth but no auth_param basic program is set", a.name)
		}
	}
	return c, nil
}

type squidLine struct {
	no   int
	text string
}

// squidLines drops comments and blank lines and joins lines continued with
// a trailing backslash, as squid's parser does.
func squidLines(s string) []squidLine {
	var out []squidLine
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(s, "\n") {
		l = strings.TrimRight(l, "\r")
		if cur.Len() == 0 {
			start = i + 1
			if t := strings.TrimSpace(l); t == "" || t[0] == '#' {
				continue
			}
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(l)
		if t := strings.TrimSpace(cur.String()); t != "" {
			out = append(out, squidLine{no: start, text: t})
		}
		cur.Reset()
	}
	if t := strings.TrimSpace(cur.String()); t != "" {
		out = append(out, squidLine{no: start, text: t})
	}
	return out
}

func parseHTTPPort(s string) (string, int, error) {
	host, ps := "", s
	if strings.Contains(s, ":") {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return "", 0, err
		}
		host, ps = h, p
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, port, nil
}

func (c *SquidConfig) authParam(param string, args []string) error {
	switch param {
	case "program":
		if len(args) == 0 {
			return fmt.Errorf("missing program")
		}
		if path.Base(args[0]) != "basic_ncsa_auth" {
			return fmt.Errorf("helper %s is not emulated (only basic_ncsa_auth)", args[0])
		}
		if len(args) != 2 {
			return fmt.Errorf("basic_ncsa_auth needs exactly one argument, the password file")
		}
		c.PasswdFile = args[1]
	case "realm":
		if len(args) == 0 {
			return fmt.Errorf("missing realm")
		}
		c.Realm = strings.Join(args, " ")
	case "credentialsttl":
		d, err := squidDuration(args)
		if err != nil {
			return err
		}
		c.CredentialsTTL = d
	case "casesensitive":
		if len(args) != 1 {
			return fmt.Errorf("want on or off")
		}
		on, err := onOff(args[0])
		if err != nil {
			return err
		}
		c.CaseSensitive = on
	case "children", "utf8", "keep_alive", "key_extras":
		c.Ignored = append(c.Ignored, "auth_param basic "+param)
	default:
		return fmt.Errorf("not emulated")
	}
	return nil
}

// squidDuration reads squid's "N [unit]" time values (seconds by default).
func squidDuration(args []string) (time.Duration, error) {
	if len(args) == 0 || len(args) > 2 {
		return 0, fmt.Errorf("want a number and a unit")
	}
	n, err := strconv.ParseFloat(args[0], 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad number %q", args[0])
	}
	unit := time.Second
	if len(args) == 2 {
		switch strings.TrimSuffix(args[1], "s") {
		case "second", "sec":
			unit = time.Second
		case "minute", "min":
			unit = time.Minute
		case "hour":
			unit = time.Hour
		case "day":
			unit = 24 * time.Hour
		case "week":
			unit = 7 * 24 * time.Hour
		default:
			return 0, fmt.Errorf("bad unit %q", args[1])
		}
	}
	return time.Duration(n * float64(unit)), nil
}

func (c *SquidConfig) refs(names []string) ([]aclRef, error) {
	var out []aclRef
	for _, n := range names {
		r := aclRef{}
		if strings.HasPrefix(n, "!") {
			r.not = true
			n = n[1:]
		}
		a, ok := c.acls[n]
		if !ok {
			return nil, fmt.Errorf("acl %q is not defined", n)
		}
		r.acl = a
		out = append(out, r)
	}
	return out, nil
}

func allowDeny(s string) (bool, error) {
	switch s {
	case "allow":
		return true, nil
	case "deny":
		return false, nil
	}
	return false, fmt.Errorf("%q is not allow or deny", s)
}

func onOff(s string) (bool, error) {
	switch s {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not on or off", s)
}

func canonicalHeader(s string) string {
	if strings.EqualFold(s, "all") {
		return "All"
	}
	return textproto.CanonicalMIMEHeaderKey(s)
}

// UsesAuth reports whether some http_access line checks credentials.
func (c *SquidConfig) UsesAuth() bool {
	for _, r := range c.access {
		for _, ref := range r.acls {
			if ref.acl.kind == aclProxyAuth {
				return true
			}
		}
	}
	return false
}
