package kvm

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"proxyfleet/deny"
	"proxyfleet/messages"
)

// The proxy server in the guest. When Options.UserData is empty, every
// proxy's seed carries a cloud-config (defaultUserData) that configures
// squid, from Debian's or Ubuntu's own packages, on a stock cloud image:
// it installs squid and qemu-guest-agent if the image lacks them, writes
// squid's whole configuration and a password file, and starts both. The
// image `make guest-image` builds (deploy/guest) has them installed, with
// squid disabled until that configuration is written, so it never serves
// with Debian's packaged one.
//
// Why squid (docs/DECISIONS.md, "squid is the proxy in the guest"): it answers
// 407 to missing and to wrong credentials alike (tinyproxy 1.11.1, Debian
// 12's, answers 401 to a wrong password, which clients take for the
// target's answer), checks a bcrypt password file (so the seed carries a
// hash, not the password), and removes Via, X-Forwarded-For and Forwarded
// by configuration.

// GuestProxy is how the guests' proxy servers are configured: what the
// default user-data writes, and what a user template is given.
type GuestProxy struct {
	// Port the proxy listens on; 0: DefaultProxyPort.
	Port int
	// User and Password are the credential (HTTP Basic) every request
	// must carry; an empty User requires none.
	User, Password string
	// Allow lists the source networks that may use the proxy at all (CIDR
	// prefixes, masked); empty: any source.
	Allow []netip.Prefix
	// Open says the operator means proxies open to anyone who reaches
	// them: without it, Validate refuses a GuestProxy with neither a User
	// nor an Allow-list.
	Open bool
	// Deny lists the destinations the proxy refuses to reach: an address
	// in it, or a name that resolves into it (squid's dst acl resolves
	// the name). nil: deny.Default(); an empty List: none.
	Deny *deny.List
}

// DefaultProxyPort is GuestProxy.Port's default (squid's own).
const DefaultProxyPort = 3128

// proxyUserRE is the user names the default configuration can carry: no
// ':' (it ends the user in Basic credentials, and the password file's
// field), no space.
var proxyUserRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// validate checks gp the way config does, so a provider made without
// package config is held to the same rules; field names are Options'.
func (gp GuestProxy) validate() error {
	if gp.Port < 0 || gp.Port > 65535 {
		return badOption("Proxy.Port", "%d is not a port", gp.Port)
	}
	if gp.User != "" && !proxyUserRE.MatchString(gp.User) {
		return badOption("Proxy.User", "%q: want 1 to 64 letters, digits, '.', '_' or '-'", gp.User)
	}
	if gp.User != "" {
		if gp.Password == "" {
			return badOption("Proxy.Password", "required with a User")
		}
		if len(gp.Password) > 72 {
			return badOption("Proxy.Password", "longer than 72 bytes (bcrypt reads no more)")
		}
		for i := 0; i < len(gp.Password); i++ {
			if c := gp.Password[i]; c < 0x20 || c > 0x7e {
				return badOption("Proxy.Password", "a byte outside printable ASCII at offset %d", i)
			}
		}
	} else if gp.Password != "" {
		return badOption("Proxy.User", "required with a Password")
	}
	for i, p := range gp.Allow {
		if !p.IsValid() {
			return badOption(fmt.Sprintf("Proxy.Allow[%d]", i), "not a prefix")
		}
	}
	if gp.User == "" && len(gp.Allow) == 0 && !gp.Open {
		return badOption("Proxy", "the proxies would be open to anyone who reaches them: set a User and Password, an Allow-list, or Open")
	}
	return nil
}

func (gp GuestProxy) port() int {
	if gp.Port == 0 {
		return DefaultProxyPort
	}
	return gp.Port
}

// allowStrings are the prefixes as text, for templates and squid.
func (gp GuestProxy) allowStrings() []string {
	out := make([]string, len(gp.Allow))
	for i, p := range gp.Allow {
		out[i] = p.Masked().String()
	}
	return out
}

// denyStrings are the destinations refused as CIDRs, for templates and
// squid (deny.Default's when Deny is nil); empty, not nil, for none.
func (gp GuestProxy) denyStrings() []string {
	if gp.Deny == nil {
		return deny.Default().Strings()
	}
	return gp.Deny.Strings()
}

// Paths in the guest of what the default user-data writes.
const (
	squidConfPath   = "/etc/squid/squid.conf"
	squidPasswdPath = "/etc/squid/proxyfleet.passwd"
)

// squidConf is squid's whole configuration for one proxy. Every value in
// it is checked (the port a number, the prefixes parsed, the addresses
// parsed, no user input but those), so it needs no quoting. The
// destinations refused (proxyfleet_guest, and proxyfleet_deny from
// gp.Deny) are denied before anything is allowed, to every client.
//
// egress are the proxy's addresses (fleet.Network.Egress: IPv4 first);
// with none, the configuration leaves the choice of source address to
// the guest's kernel (squidEgress has the rules otherwise). dns are the
// resolvers squid asks (dns_nameservers); with none, those of the
// guest's resolv.conf.
func squidConf(id, hostname string, gp GuestProxy, egress, dns []netip.Addr) string {
	var b strings.Builder
	line := func(s ...string) {
		b.WriteString(strings.Join(s, " "))
		b.WriteByte('\n')
	}
	line("# Written by proxyfleet for proxy " + id + " at its first boot; the seed")
	line("# volume it came from is removed with the proxy.")
	line("http_port", strconv.Itoa(gp.port()))
	// squid looks its host name up at every start unless told (10 s on a
	// network whose DNS does not answer).
	line("visible_hostname", hostname)
	if gp.User != "" {
		line("auth_param basic program /usr/lib/squid/basic_ncsa_auth", squidPasswdPath)
		// Two helpers suffice: squid caches a checked credential for
		// its TTL, so a helper runs (one bcrypt) per client and hour.
		line("auth_param basic children 2 startup=1 idle=1")
		line("auth_param basic realm proxyfleet")
		line("auth_param basic credentialsttl 1 hour")
		line("acl proxyfleet_users proxy_auth REQUIRED")
	}
	if len(gp.Allow) > 0 {
		line(append([]string{"acl proxyfleet_allow src"}, gp.allowStrings()...)...)
	}
	// Nothing on the guest itself, nor the link-local range (a cloud's
	// metadata service, which holds the seed's secrets too), through the
	// proxy, whatever Deny says.
	line("acl proxyfleet_guest dst 127.0.0.0/8 ::1 169.254.0.0/16 fe80::/10")
	// Nor what Deny lists: dst resolves a target's name, so a name that
	// resolves into the list is refused too. An empty list writes no
	// acl (squid refuses an acl without values).
	denied := gp.denyStrings()
	if len(denied) > 0 {
		line(append([]string{"acl proxyfleet_deny dst"}, denied...)...)
	}
	// Debian's safe ports: no mail relay (25, 465, 587) nor other low
	// services through the proxy. CONNECT may go to any of them, not only
	// 443, as clients tunnel to other TLS ports too.
	line("acl proxyfleet_safe_ports port 80 21 443 70 210 1025-65535 280 488 591 777")
	line("http_access deny !proxyfleet_safe_ports")
	line("http_access deny proxyfleet_guest")
	if len(denied) > 0 {
		line("http_access deny proxyfleet_deny")
	}
	if len(gp.Allow) > 0 {
		line("http_access deny !proxyfleet_allow")
	}
	if gp.User != "" {
		line("http_access allow proxyfleet_users")
	} else {
		line("http_access allow all")
	}
	line("http_access deny all")
	// No header that reveals the client or that a proxy is in the way.
	line("via off")
	line("forwarded_for delete")
	line("request_header_access X-Forwarded-For deny all")
	line("request_header_access Forwarded deny all")
	line("request_header_access Via deny all")
	// squid adds "Cache-Control: max-age=259200" to a request that has
	// none: a fingerprint of the proxy. A client's own passes.
	line("acl proxyfleet_client_cc req_header Cache-Control .")
	line("request_header_access Cache-Control allow proxyfleet_client_cc")
	line("request_header_access Cache-Control deny all")
	line("reply_header_access X-Cache deny all")
	line("reply_header_access X-Cache-Lookup deny all")
	line("reply_header_access Via deny all")
	line("httpd_suppress_version_string on")
	squidEgress(line, egress)
	if len(dns) > 0 {
		ns := []string{"dns_nameservers"}
		for _, a := range dns {
			ns = append(ns, a.String())
		}
		line(ns...)
	}
	// A proxy of the fleet forwards; it caches and logs nothing.
	line("cache deny all")
	line("cache_mem 8 MB")
	line("access_log none")
	line("shutdown_lifetime 1 seconds")
	line("coredump_dir /var/spool/squid")
	return b.String()
}

// squidEgress writes the rules by which a request leaves from the
// address it asks for (messages.HeaderEgress): for each address an acl
// matching the header's whole value and a tcp_outgoing_address for it,
// then one default per family (the first address of that family) for a
// request that asks for none or for an address not the proxy's, and the
// header's removal before the target. squid (5.7, Debian 12's) tries the
// tcp_outgoing_address lines in order, skips those whose family is not
// the destination's, and takes the first whose acls match; a req_header
// acl names its header case-insensitively and matches a POSIX extended
// regex against the value, so an IPv4 address's dots are escaped (an
// IPv6 address has no metacharacter). The family is squid's to choose:
// for a name with A and AAAA records, that of the DNS answer it gets
// first (Happy Eyeballs), and no 5.7 directive ties it to the named
// address, so the gateway names one of the family it expects
// (docs/DECISIONS.md, "A named target's egress family").
//
// Persistent server connections stay on: with these rules every
// connection squid forwards on has a local address chosen before it
// looks for an idle one, and squid reuses an idle connection only if its
// local address is that one (pconn.cc, IdleConnList::findUseable checks
// the address whenever the wanted one is not the wildcard;
// PeerSelector::handlePath sets it through getOutgoingAddress before
// HappyConnOpener pops the pool). The defaults matter for that too: a
// request leaving from the wildcard would take an idle connection opened
// from any address. CONNECT tunnels never use the pool.
// docs/DECISIONS.md ("Persistent server connections stay on") has the
// evidence.
func squidEgress(line func(...string), egress []netip.Addr) {
	if len(egress) == 0 {
		return
	}
	var def4, def6 netip.Addr
	for i, a := range egress {
		name := "proxyfleet_egress_" + strconv.Itoa(i)
		line("acl", name, "req_header", messages.HeaderEgress, "^"+regexp.QuoteMeta(a.String())+"$")
		line("tcp_outgoing_address", a.String(), name)
		switch {
		case a.Is4() && !def4.IsValid():
			def4 = a
		case a.Is6() && !def6.IsValid():
			def6 = a
		}
	}
	for _, a := range []netip.Addr{def4, def6} {
		if a.IsValid() {
			line("tcp_outgoing_address", a.String())
		}
	}
	line("request_header_access", messages.HeaderEgress, "deny all")
}

// passwdLine is the password file's one line: the user and a bcrypt hash
// of the password (squid's basic_ncsa_auth checks it with crypt(3), which
// knows bcrypt in Debian 12 and Ubuntu). A fresh salt each time: two
// proxies' seeds never carry the same hash.
func passwdLine(gp GuestProxy) (string, error) {
	h, err := bcrypt.GenerateFromPassword([]byte(gp.Password), bcryptCost)
	if err != nil {
		return "", fmt.Errorf("hash the proxy password: %w", err)
	}
	return gp.User + ":" + string(h), nil
}

// bcryptCost is the hash's cost: squid checks a credential once per client
// and credentialsttl, so it is paid rarely, even under TCG. (A variable
// only so that the package's fuzz targets run at bcrypt.MinCost.)
var bcryptCost = bcrypt.DefaultCost

// installAndStart is the runcmd of the default user-data: squid and the
// guest agent are installed if the image lacks them (a stock cloud image;
// --force-confold keeps the squid.conf written before), then started.
// squid is restarted only if it runs with an older configuration than
// ours: in the image of make guest-image it was started after cloud-init
// wrote it (and serves already; a restart would cut those requests), and
// apt starts the one it installs with it too.
var installAndStart = [][]string{
	{"sh", "-c", "command -v squid >/dev/null 2>&1 || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold squid qemu-guest-agent; }"},
	{"systemctl", "start", "qemu-guest-agent"},
	{"systemctl", "enable", "squid"},
	{"sh", "-c", "if systemctl is-active --quiet squid && [ -e /run/squid.pid ] && [ ! " + squidConfPath + " -nt /run/squid.pid ]; then :; else systemctl restart squid; fi"},
}

// An IPv4-only plan gives the guest no IPv6 address, and the network-config
// cannot stop router advertisements for it (networkConfig: cloud-init's
// ifupdown renderer writes accept_ra only into an IPv6 stanza, and there
// is none): on a link whose router advertises a prefix the guest would
// take an address and a route the plan does not know, and squid could
// leave from it for an IPv6 target. The default user-data turns IPv6 off
// on eth0 instead, at once (bootcmd, every boot; it drops what an
// advertisement gave) and for later boots (a sysctl.d file). A user-data
// template must do the same itself (.Egress holds no IPv6 address then).
const (
	noIPv6Key    = "net.ipv6.conf." + guestInterface + ".disable_ipv6"
	noIPv6Path   = "/etc/sysctl.d/60-proxyfleet-ipv4-only.conf"
	noIPv6Sysctl = noIPv6Key + " = 1\n"
)

// ipv4Only says whether a plan's egress addresses are all IPv4 (and some).
func ipv4Only(egress []netip.Addr) bool {
	for _, a := range egress {
		if !a.Is4() {
			return false
		}
	}
	return len(egress) > 0
}

// defaultUserData renders the cloud-config of a proxy when no template is
// configured. Scalars that carry values are JSON strings (valid YAML
// double-quoted scalars, so "true" or "012" stay strings under YAML 1.1
// and 1.2); the files are literal blocks of lines checked above.
func defaultUserData(id, hostname string, gp GuestProxy, egress, dns []netip.Addr) (string, error) {
	var b strings.Builder
	q := strconv.Quote
	b.WriteString("#cloud-config\n")
	b.WriteString("hostname: " + q(hostname) + "\n")
	// The name in /etc/hosts too, so nothing on the guest waits for DNS
	// to find itself.
	b.WriteString("manage_etc_hosts: localhost\n")
	if ipv4Only(egress) {
		// The first boot: cloud-init brought eth0 up before this runs,
		// and router advertisements may have given it an address.
		b.WriteString("bootcmd:\n- [\"sysctl\", \"-w\", " + q(noIPv6Key+"=1") + "]\n")
	}
	b.WriteString("write_files:\n")
	block := func(path, owner, perm, content string) {
		b.WriteString("- path: " + q(path) + "\n")
		if owner != "" {
			b.WriteString("  owner: " + q(owner) + "\n")
		}
		b.WriteString("  permissions: " + q(perm) + "\n")
		b.WriteString("  content: |\n")
		for _, l := range strings.SplitAfter(strings.TrimSuffix(content, "\n"), "\n") {
			b.WriteString("    " + l)
		}
		b.WriteString("\n")
	}
	block(squidConfPath, "", "0644", squidConf(id, hostname, gp, egress, dns))
	if gp.User != "" {
		pw, err := passwdLine(gp)
		if err != nil {
			return "", err
		}
		// Squid runs as user proxy (in Debian's and Ubuntu's base
		// passwd, so the group exists before squid is installed).
		block(squidPasswdPath, "root:proxy", "0640", pw+"\n")
	}
	if ipv4Only(egress) {
		// Later boots: systemd-sysctl applies it as eth0 appears, before
		// ifupdown brings it up.
		block(noIPv6Path, "", "0644", noIPv6Sysctl)
	}
	b.WriteString("runcmd:\n")
	for _, c := range installAndStart {
		parts := make([]string, len(c))
		for i, s := range c {
			parts[i] = q(s)
		}
		b.WriteString("- [" + strings.Join(parts, ", ") + "]\n")
	}
	return b.String(), nil
}
