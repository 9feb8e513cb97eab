package main

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// exampleDeny is the acl of the destinations proxyfleet's default list
// (proxy.deny absent) refuses, as kvm renders it.
const exampleDeny = "acl proxyfleet_deny dst 127.0.0.0/8 ::1/128 0.0.0.0/8 ::/128 169.254.0.0/16 fe80::/10 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10 fc00::/7\n"

// exampleSquidConf is the squid.conf proxyfleet renders for a kvm proxy
// (p1, user fleet, allow-list 198.18.0.0/15, port 3128, the default deny
// list); auth=false and allow="" give its variants without credentials
// and without allow-list.
func exampleSquidConf(auth bool, allow string) string {
	var b strings.Builder
	b.WriteString("# Written by proxyfleet for proxy p1.\nhttp_port 3128\n")
	if auth {
		b.WriteString("auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/proxyfleet.passwd\n" +
			"auth_param basic children 2 startup=1 idle=1\nauth_param basic realm proxyfleet\n" +
			"auth_param basic credentialsttl 1 hour\nacl proxyfleet_users proxy_auth REQUIRED\n")
	}
	if allow != "" {
		b.WriteString("acl proxyfleet_allow src " + allow + "\n")
	}
	b.WriteString("acl proxyfleet_guest dst 127.0.0.0/8 ::1 169.254.0.0/16 fe80::/10\n" + exampleDeny)
	b.WriteString("http_access deny proxyfleet_guest\nhttp_access deny proxyfleet_deny\n")
	if allow != "" {
		b.WriteString("http_access deny !proxyfleet_allow\n")
	}
	if auth {
		b.WriteString("http_access allow proxyfleet_users\n")
	} else {
		b.WriteString("http_access allow all\n")
	}
	b.WriteString(`http_access deny all
via off
forwarded_for delete
request_header_access X-Forwarded-For deny all
request_header_access Forwarded deny all
request_header_access Via deny all
reply_header_access X-Cache deny all
reply_header_access X-Cache-Lookup deny all
reply_header_access Via deny all
httpd_suppress_version_string on
cache deny all
cache_mem 8 MB
access_log none
shutdown_lifetime 1 seconds
coredump_dir /var/spool/squid
`)
	return b.String()
}

var examplePasswdFiles = map[string][]byte{"/etc/squid/proxyfleet.passwd": []byte("fleet:$2a$04$abcdefghijklmnopqrstuu5D1yD3TuD5Ir4zGzO0pYZl8k8l0F6qK\n")}

func TestParseSquidConfExample(t *testing.T) {
	c, err := ParseSquidConf([]byte(exampleSquidConf(true, "198.18.0.0/15")), examplePasswdFiles)
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != "" || c.Port != 3128 || c.Realm != "proxyfleet" || c.PasswdFile != "/etc/squid/proxyfleet.passwd" ||
		c.CredentialsTTL != time.Hour || c.Via || c.ForwardedFor != "delete" || !c.UsesAuth() || c.CaseSensitive {
		t.Fatalf("%+v", c)
	}
	if len(c.access) != 5 || !c.access[3].allow || c.access[1].acls[0].acl.name != "proxyfleet_deny" ||
		c.access[2].acls[0].not != true || c.access[2].acls[0].acl.name != "proxyfleet_allow" {
		t.Fatalf("access %+v", c.access)
	}
	if len(c.requestHeader) != 3 || len(c.replyHeader) != 3 || c.requestHeader[0].name != "X-Forwarded-For" || c.replyHeader[1].name != "X-Cache-Lookup" {
		t.Fatalf("header rules %+v %+v", c.requestHeader, c.replyHeader)
	}
	for _, d := range []string{"cache", "access_log", "httpd_suppress_version_string", "auth_param basic children"} {
		if !strings.Contains(strings.Join(c.Ignored, ","), d) {
			t.Errorf("%s not listed as ignored: %v", d, c.Ignored)
		}
	}
	// The variant without credentials and allow-list.
	c, err = ParseSquidConf([]byte(exampleSquidConf(false, "")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.UsesAuth() || c.PasswdFile != "" || c.Realm != defaultRealm || len(c.access) != 4 {
		t.Fatalf("%+v", c)
	}
}

func TestParseSquidConfDirectives(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conf  string
		check func(c *SquidConfig) bool
	}{
		{"defaults", "", func(c *SquidConfig) bool {
			return c.Port == 3128 && c.Via && c.ForwardedFor == "on" && c.Realm == defaultRealm && c.CredentialsTTL == 2*time.Hour && len(c.access) == 0
		}},
		{"http_port addr", "http_port 127.0.0.1:8080\n", func(c *SquidConfig) bool { return c.Host == "127.0.0.1" && c.Port == 8080 }},
		{"http_port v6", "http_port [::1]:3129 name=x\n", func(c *SquidConfig) bool { return c.Host == "::1" && c.Port == 3129 }},
		{"continuation", "http_access \\\n  allow \\\n  all\n", func(c *SquidConfig) bool {
			return len(c.access) == 1 && c.access[0].allow && c.access[0].acls[0].acl.name == "all"
		}},
		{"forwarded_for truncate, via on", "forwarded_for truncate\nvia on\n", func(c *SquidConfig) bool { return c.ForwardedFor == "truncate" && c.Via }},
		{"acl lines add up", "acl a src 198.18.0.0/16\nacl a src 192.0.2.1 198.19.0.0/255.255.0.0\n", func(c *SquidConfig) bool {
			return len(c.acls["a"].nets) == 3 && c.acls["a"].nets[2] == netip.MustParsePrefix("198.19.0.0/16") && c.acls["a"].nets[1].Bits() == 32
		}},
		{"acl values from a file", "acl a src \"/etc/squid/allow\"\n", func(c *SquidConfig) bool { return len(c.acls["a"].nets) == 2 }},
		{"credentialsttl minutes", "auth_param basic program /usr/lib/squid/basic_ncsa_auth /p\nauth_param basic credentialsttl 5 minutes\n", func(c *SquidConfig) bool { return c.CredentialsTTL == 5*time.Minute }},
		{"unknown directive ignored", "dns_v4_first on\nfrobnicate yes\n", func(c *SquidConfig) bool { return len(c.Ignored) == 2 && c.Ignored[1] == "frobnicate (unknown)" }},
		{"port and method acls", "acl p port 80 1025-65535\nacl m method CONNECT\n", func(c *SquidConfig) bool {
			return len(c.acls["p"].ports) == 2 && c.acls["p"].ports[1] == portRange{1025, 65535} && c.acls["m"].methods[0] == "CONNECT"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseSquidConf([]byte(tc.conf), map[string][]byte{"/etc/squid/allow": []byte("# comment\n198.18.0.0/15\n\n192.0.2.0/24\n")})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("%+v", c)
			}
		})
	}
}

func TestParseSquidConfErrors(t *testing.T) {
	for _, conf := range []string{
		"http_port\n",
		"http_port 0\n",
		"http_port 3128\nhttp_port 3129\n",
		"http_port 3128 intercept\n",
		"http_port host:port\n",
		"auth_param digest program /usr/lib/squid/digest_file_auth /p\n",
		"auth_param basic program /usr/lib/squid/basic_ldap_auth -b dc=x\n",
		"auth_param basic program /usr/lib/squid/basic_ncsa_auth\n",
		"auth_param basic credentialsttl 1 fortnight\n",
		"auth_param basic nonsense 1\n",
		"acl a proxy_auth REQUIRED\nhttp_access allow a\n", // no auth_param
		"acl a src 198.18.0.0/33\n",
		"acl a src 198.18.0.1-198.18.0.9\n",
		"acl a src example.com\n",
		"acl a src 198.18.0.0/255.0.255.0\n",
		"acl a dstdomain .example.com\n",
		"acl a src\n",
		"acl a src \"/missing\"\n",
		"acl a src 198.18.0.1\nacl a dst 198.18.0.1\n",
		"acl a port 70000\n",
		"http_access allow nosuchacl\n",
		"http_access permit all\n",
		"http_access allow\n",
		"via maybe\n",
		"forwarded_for sometimes\n",
		"request_header_access Via\n",
		"request_header_access Other deny all\n",
		"include /etc/squid/conf.d/*.conf\n",
	} {
		if c, err := ParseSquidConf([]byte(conf), nil); err == nil {
			t.Errorf("%q: want an error, got %+v", conf, c)
		}
	}
}

// TestSquidAccessDenyList: the acl of proxyfleet's deny list refuses a
// literal destination in it, whatever the credentials (it comes before
// them), IPv4-mapped and bracketed forms included; one outside it goes
// on. A name is not resolved by the emulation (squid resolves it).
func TestSquidAccessDenyList(t *testing.T) {
	c, err := ParseSquidConf([]byte(exampleSquidConf(true, "198.18.0.0/15")), examplePasswdFiles)
	if err != nil {
		t.Fatal(err)
	}
	auth := func() (string, bool) { return "fleet", true }
	// Besides these, an address inside each range of the list that
	// proxyfleet_guest does not refuse first, as squid
	// may be asked for it: plain, bracketed and zoned (IPv6), IPv4-mapped
	// (IPv4).
	hosts := []string{"0.0.0.0", "0.1.2.3", "[::]", "::ffff:100.64.0.1"}
	for _, f := range strings.Fields(strings.TrimPrefix(strings.TrimSpace(exampleDeny), "acl proxyfleet_deny dst ")) {
		p := netip.MustParsePrefix(f)
		if p.IsSingleIP() || strings.Contains(" 127.0.0.0/8 169.254.0.0/16 fe80::/10 ", " "+f+" ") {
			continue // a single address, or one proxyfleet_guest refuses first
		}
		a := p.Addr().Next()
		if a.Is4() {
			hosts = append(hosts, a.String(), "[::ffff:"+a.String()+"]")
		} else {
			hosts = append(hosts, a.String(), "["+a.String()+"]", a.String()+"%eth0")
		}
	}
	for _, host := range hosts {
		for _, a := range []func() (string, bool){auth, nil} {
			v := c.Access(&AccessRequest{Src: netip.MustParseAddr("198.18.0.7"), Host: host, Port: 443, Method: "CONNECT", Auth: a})
			if v.Allow || v.Status != 403 || v.Rule != "http_access deny proxyfleet_deny" {
				t.Errorf("%s (credentials %v): %+v, want 403 by http_access deny proxyfleet_deny", host, a != nil, v)
			}
		}
	}
	// What proxyfleet_guest refuses it refuses first.
	if v := c.Access(&AccessRequest{Src: netip.MustParseAddr("198.18.0.7"), Host: "169.254.169.254", Port: 80, Method: "GET", Auth: auth}); v.Status != 403 || v.Rule != "http_access deny proxyfleet_guest" {
		t.Errorf("169.254.169.254: %+v", v)
	}
	for _, host := range []string{"198.18.0.1", "[2001:db8::1]", "::ffff:198.18.0.1", "t.example"} {
		if v := c.Access(&AccessRequest{Src: netip.MustParseAddr("198.18.0.7"), Host: host, Port: 443, Method: "CONNECT", Auth: auth}); !v.Allow {
			t.Errorf("%s: %+v, want allowed", host, v)
		}
	}
}

// TestSquidAccess runs http_access on table rows: a config, a request, the verdict.
func TestSquidAccess(t *testing.T) {
	withAuth := exampleSquidConf(true, "198.18.0.0/15")
	noAuth := exampleSquidConf(false, "198.18.0.0/15")
	open := exampleSquidConf(false, "")
	const authPrefix = "auth_param basic program /usr/lib/squid/basic_ncsa_auth /p\n"
	type creds int
	const (
		none creds = iota
		good
		bad
		other // valid, as user "bob"
	)
	for _, tc := range []struct {
		name   string
		conf   string
		src    string
		host   string
		port   int
		method string
		creds  creds
		want   int // 200 for allowed
	}{
		{"example: no credentials", withAuth, "198.18.0.7", "198.18.0.1", 80, "GET", none, 407},
		{"example: wrong password", withAuth, "198.18.0.7", "198.18.0.1", 80, "GET", bad, 407},
		{"example: right password", withAuth, "198.18.0.7", "198.18.0.1", 80, "GET", good, 200},
		{"example: name target", withAuth, "198.18.0.7", "example.com", 443, "CONNECT", good, 200},
		{"example: outside the allow-list", withAuth, "203.0.113.9", "198.18.0.1", 80, "GET", good, 403},
		{"example: outside, no credentials: 403 first", withAuth, "203.0.113.9", "198.18.0.1", 80, "GET", none, 403},
		{"example: v4-mapped client", withAuth, "::ffff:198.19.255.255", "198.18.0.1", 80, "GET", good, 200},
		{"example: dst loopback", withAuth, "198.18.0.7", "127.0.0.1", 80, "GET", good, 403},
		{"example: dst [::1]", withAuth, "198.18.0.7", "[::1]", 80, "GET", good, 403},
		{"example: dst link-local", withAuth, "198.18.0.7", "169.254.169.254", 80, "GET", good, 403},
		{"example: dst name localhost is not resolved", withAuth, "198.18.0.7", "localhost", 80, "GET", good, 200},
		{"no auth variant", noAuth, "198.18.0.7", "198.18.0.1", 80, "GET", none, 200},
		{"no auth variant, outside", noAuth, "192.0.2.1", "198.18.0.1", 80, "GET", none, 403},
		{"no auth, no allow-list", open, "192.0.2.1", "198.18.0.1", 80, "GET", none, 200},
		{"no auth, no allow-list, dst loopback", open, "192.0.2.1", "127.0.0.53", 80, "GET", none, 403},
		{"no lines: deny", "", "192.0.2.1", "198.18.0.1", 80, "GET", none, 403},
		{"no match after a deny: allow", "acl a src 192.0.2.0/24\nhttp_access deny a\n", "198.18.0.7", "198.18.0.1", 80, "GET", none, 200},
		{"no match after an allow: deny", "acl a src 192.0.2.0/24\nhttp_access allow a\n", "198.18.0.7", "198.18.0.1", 80, "GET", none, 403},
		{"and: stops at the first failing acl", authPrefix + "acl a src 192.0.2.0/24\nacl u proxy_auth REQUIRED\nhttp_access allow a u\n", "198.18.0.7", "h", 80, "GET", none, 403},
		{"and: both", authPrefix + "acl a src 192.0.2.0/24\nacl u proxy_auth REQUIRED\nhttp_access allow a u\nhttp_access deny all\n", "192.0.2.3", "h", 80, "GET", good, 200},
		{"deny !users without credentials: 407", authPrefix + "acl u proxy_auth REQUIRED\nhttp_access deny !u\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", none, 407},
		{"deny !users with credentials: next line", authPrefix + "acl u proxy_auth REQUIRED\nhttp_access deny !u\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", good, 200},
		{"deny ending in proxy_auth re-challenges", authPrefix + "acl b proxy_auth bob\nhttp_access deny b\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", other, 407},
		{"named user list: other user falls through", authPrefix + "acl f proxy_auth fleet\nhttp_access allow f\nhttp_access deny all\n", "192.0.2.3", "h", 80, "GET", other, 403},
		{"named user list: the user", authPrefix + "acl f proxy_auth fleet\nhttp_access allow f\nhttp_access deny all\n", "192.0.2.3", "h", 80, "GET", good, 200},
		{"squid's default ports", "acl SSL_ports port 443\nacl Safe_ports port 80 443 1025-65535\nacl CONNECT method CONNECT\nhttp_access deny !Safe_ports\nhttp_access deny CONNECT !SSL_ports\nhttp_access allow all\n", "192.0.2.3", "h", 8443, "CONNECT", none, 403},
		{"squid's default ports, GET", "acl SSL_ports port 443\nacl Safe_ports port 80 443 1025-65535\nacl CONNECT method CONNECT\nhttp_access deny !Safe_ports\nhttp_access deny CONNECT !SSL_ports\nhttp_access allow all\n", "192.0.2.3", "h", 8443, "GET", none, 200},
		{"squid's default ports, port 25", "acl Safe_ports port 80 443 1025-65535\nhttp_access deny !Safe_ports\nhttp_access allow all\n", "192.0.2.3", "h", 25, "GET", none, 403},
		{"builtin localhost", "http_access allow localhost\nhttp_access deny all\n", "127.0.0.1", "h", 80, "GET", none, 200},
		{"builtin to_localhost", "http_access deny to_localhost\nhttp_access allow all\n", "192.0.2.3", "127.1.2.3", 80, "GET", none, 403},
		{"invalid client address matches no src", "acl a src 0.0.0.0/0\nhttp_access allow a\n", "", "h", 80, "GET", none, 403},
		{"req_header matches", "acl ua req_header User-Agent -i ^CURL/\nhttp_access deny ua\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", none, 403},
		{"req_header does not match", "acl ua req_header User-Agent ^wget/\nhttp_access deny ua\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", none, 200},
		{"req_header of an absent header", "acl cc req_header Cache-Control .\nhttp_access deny cc\nhttp_access allow all\n", "192.0.2.3", "h", 80, "GET", none, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseSquidConf([]byte(tc.conf), examplePasswdFiles)
			if err != nil {
				t.Fatal(err)
			}
			var src netip.Addr
			if tc.src != "" {
				src = netip.MustParseAddr(tc.src)
			}
			calls := 0
			req := &AccessRequest{Src: src, Host: tc.host, Port: tc.port, Method: tc.method, Header: http.Header{"User-Agent": {"curl/8.0"}}, Auth: func() (string, bool) {
				calls++
				switch tc.creds {
				case good:
					return "fleet", true
				case other:
					return "bob", true
				case bad:
					return "fleet", false
				}
				return "", false
			}}
			v := c.Access(req)
			got := v.Status
			if v.Allow {
				got = 200
				if v.Status != 0 {
					t.Fatalf("allowed with status %d", v.Status)
				}
			}
			if got != tc.want {
				t.Fatalf("got %d (%s), want %d", got, v.Rule, tc.want)
			}
			if calls > 1 {
				t.Fatalf("credentials checked %d times", calls)
			}
		})
	}
}

func TestMangleRequestHeaders(t *testing.T) {
	src := netip.MustParseAddr("198.18.0.7")
	for _, tc := range []struct {
		name    string
		conf    string
		in      http.Header
		wantXFF []string // nil: absent
		wantVia []string
		absent  []string
	}{
		{"defaults", "", http.Header{}, []string{"198.18.0.7"}, []string{"1.1 p1 (squid)"}, nil},
		{"on extends", "forwarded_for on\n", http.Header{"X-Forwarded-For": {"192.0.2.1", "192.0.2.2"}, "Via": {"1.0 a"}}, []string{"192.0.2.1, 192.0.2.2, 198.18.0.7"}, []string{"1.0 a, 1.1 p1 (squid)"}, nil},
		{"off", "forwarded_for off\nvia off\n", http.Header{}, []string{"unknown"}, nil, nil},
		{"off extends with unknown", "forwarded_for off\n", http.Header{"X-Forwarded-For": {"192.0.2.1"}}, []string{"192.0.2.1, unknown"}, []string{"1.1 p1 (squid)"}, nil},
		{"delete", "forwarded_for delete\nvia off\n", http.Header{"X-Forwarded-For": {"192.0.2.1"}}, nil, nil, nil},
		{"transparent", "forwarded_for transparent\nvia off\n", http.Header{"X-Forwarded-For": {"192.0.2.1"}}, []string{"192.0.2.1"}, nil, nil},
		{"transparent without one", "forwarded_for transparent\nvia off\n", http.Header{}, nil, nil, nil},
		{"truncate", "forwarded_for truncate\nvia off\n", http.Header{"X-Forwarded-For": {"192.0.2.1"}}, []string{"198.18.0.7"}, nil, nil},
		{"request_header_access removes what squid added", "request_header_access X-Forwarded-For deny all\nrequest_header_access via deny all\nrequest_header_access Forwarded deny all\n",
			http.Header{"Forwarded": {"for=192.0.2.1"}, "Accept": {"*/*"}}, nil, nil, []string{"Forwarded"}},
		{"All with an exception", "request_header_access Accept allow all\nrequest_header_access All deny all\n",
			http.Header{"Accept": {"*/*"}, "Cookie": {"a=b"}}, nil, nil, []string{"Cookie"}},
		{"rule with a matching acl", "acl a src 198.18.0.0/15\nrequest_header_access Cookie deny a\nforwarded_for delete\nvia off\n",
			http.Header{"Cookie": {"a=b"}, "Accept": {"*/*"}}, nil, nil, []string{"Cookie"}},
		{"rule with an acl that does not match: opposite of the last", "acl a src 192.0.2.0/24\nrequest_header_access Cookie deny a\nrequest_header_access Accept allow a\nforwarded_for delete\nvia off\n",
			http.Header{"Cookie": {"a=b"}, "Accept": {"*/*"}}, nil, nil, []string{"Accept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseSquidConf([]byte(tc.conf), nil)
			if err != nil {
				t.Fatal(err)
			}
			h := tc.in.Clone()
			if h == nil {
				h = http.Header{}
			}
			c.MangleRequest(h, &AccessRequest{Src: src}, "1.1", "p1")
			if got := h.Values("X-Forwarded-For"); !equalStrings(got, tc.wantXFF) {
				t.Errorf("X-Forwarded-For %q, want %q", got, tc.wantXFF)
			}
			if got := h.Values("Via"); !equalStrings(got, tc.wantVia) {
				t.Errorf("Via %q, want %q", got, tc.wantVia)
			}
			for _, k := range tc.absent {
				if _, ok := h[k]; ok {
					t.Errorf("%s still there: %v", k, h)
				}
			}
			for k := range tc.in {
				if _, present := h[k]; !present && !contains(tc.absent, k) && k != "X-Forwarded-For" && k != "Via" {
					t.Errorf("%s removed: %v", k, h)
				}
			}
		})
	}
}

func TestMangleReplyHeaders(t *testing.T) {
	c, _ := ParseSquidConf([]byte(""), nil)
	h := http.Header{"Via": {"1.1 origin"}, "Content-Type": {"text/plain"}}
	c.MangleReply(h, &AccessRequest{}, "1.1", "p1")
	if h.Get("Via") != "1.1 origin, 1.1 p1 (squid)" || h.Get("X-Cache") != "MISS from p1" || h.Get("X-Cache-Lookup") != "NONE from p1:3128" {
		t.Fatalf("defaults: %v", h)
	}
	c, err := ParseSquidConf([]byte(exampleSquidConf(false, "")), nil)
	if err != nil {
		t.Fatal(err)
	}
	h = http.Header{"Via": {"1.1 origin"}, "Content-Type": {"text/plain"}}
	c.MangleReply(h, &AccessRequest{}, "1.1", "p1")
	if len(h) != 1 || h.Get("Content-Type") != "text/plain" {
		t.Fatalf("example: %v", h)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
