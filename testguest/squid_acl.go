package main

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

func (c *SquidConfig) addACL(name, typ string, vals []string, files map[string][]byte) error {
	// req_header names its header before the flags.
	var header string
	if typ == "req_header" {
		if len(vals) == 0 {
			return fmt.Errorf("req_header needs a header name")
		}
		header, vals = http.CanonicalHeaderKey(vals[0]), vals[1:]
	}
	// Flags (-i, -n, ...) come before the values.
	icase := false
	for len(vals) > 0 && strings.HasPrefix(vals[0], "-") && len(vals[0]) > 1 {
		icase = icase || vals[0] == "-i"
		vals = vals[1:]
	}
	// A quoted value is a file of values, one a line.
	var expanded []string
	for _, v := range vals {
		if len(v) > 2 && v[0] == '"' && v[len(v)-1] == '"' {
			p := v[1 : len(v)-1]
			b, ok := files[p]
			if !ok {
				return fmt.Errorf("values file %s is not in the user-data's write_files", p)
			}
			for _, l := range strings.Split(string(b), "\n") {
				if l = strings.TrimSpace(l); l != "" && l[0] != '#' {
					expanded = append(expanded, strings.Fields(l)...)
				}
			}
			continue
		}
		expanded = append(expanded, v)
	}
	vals = expanded
	a := &acl{name: name, typ: typ}
	switch typ {
	case "src", "dst":
		a.kind = aclSrc
		if typ == "dst" {
			a.kind = aclDst
		}
		for _, v := range vals {
			ps, err := parseNets(v)
			if err != nil {
				return err
			}
			a.nets = append(a.nets, ps...)
		}
	case "proxy_auth":
		a.kind = aclProxyAuth
		if len(vals) == 0 {
			return fmt.Errorf("proxy_auth needs REQUIRED or user names")
		}
		if len(vals) == 1 && vals[0] == "REQUIRED" {
			break
		}
		for _, v := range vals {
			if v == "REQUIRED" {
				return fmt.Errorf("REQUIRED cannot be mixed with user names")
			}
		}
		a.users = vals
	case "port":
		a.kind = aclPort
		for _, v := range vals {
			lo, hi, isRange := strings.Cut(v, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || l < 0 || h > 65535 || l > h {
				return fmt.Errorf("bad port %q", v)
			}
			a.ports = append(a.ports, portRange{l, h})
		}
	case "method":
		a.kind = aclMethod
		a.methods = vals
	case "req_header":
		// squid's regexes are POSIX extended ones; Go's RE2 reads the
		// simple ones written for headers alike.
		a.kind, a.header = aclReqHeader, header
		for _, v := range vals {
			if icase {
				v = "(?i)" + v
			}
			re, err := regexp.Compile(v)
			if err != nil {
				return fmt.Errorf("bad regex %q: %v", v, err)
			}
			a.res = append(a.res, re)
		}
	default:
		return fmt.Errorf("acl type %s is not emulated", typ)
	}
	if len(vals) == 0 {
		return fmt.Errorf("no values")
	}
	if old, ok := c.acls[name]; ok {
		// squid appends the values of an acl given on several lines.
		if old.typ != typ {
			return fmt.Errorf("already defined as %s", old.typ)
		}
		old.nets = append(old.nets, a.nets...)
		old.ports = append(old.ports, a.ports...)
		old.methods = append(old.methods, a.methods...)
		if a.kind == aclReqHeader && old.header != a.header {
			return fmt.Errorf("already defined for header %s", old.header)
		}
		old.res = append(old.res, a.res...)
		if (old.users == nil) != (a.users == nil) {
			return fmt.Errorf("REQUIRED cannot be mixed with user names")
		}
		old.users = append(old.users, a.users...)
		return nil
	}
	c.acls[name] = a
	return nil
}

// parseNets reads a src/dst value: an address, a CIDR, addr/netmask, or "all".
func parseNets(v string) ([]netip.Prefix, error) {
	if v == "all" {
		return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, nil
	}
	if addr, mask, ok := strings.Cut(v, "/"); ok && strings.Contains(mask, ".") {
		a, err1 := netip.ParseAddr(addr)
		m, err2 := netip.ParseAddr(mask)
		if err1 != nil || err2 != nil || !a.Is4() || !m.Is4() {
			return nil, fmt.Errorf("bad address/netmask %q", v)
		}
		mb := m.As4()
		bits, _ := net.IPMask(mb[:]).Size()
		if bits == 0 && (mb != [4]byte{}) {
			return nil, fmt.Errorf("non-contiguous netmask in %q", v)
		}
		return []netip.Prefix{netip.PrefixFrom(a, bits).Masked()}, nil
	}
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("bad network %q", v)
		}
		return []netip.Prefix{p.Masked()}, nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		// squid would resolve a name here; the guest does not.
		return nil, fmt.Errorf("%q is not an address or network (ranges and names are not emulated)", v)
	}
	return []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}, nil
}
