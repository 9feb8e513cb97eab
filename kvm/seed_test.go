package kvm

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
	"golang.org/x/crypto/bcrypt"

	"proxyfleet/deny"
	"proxyfleet/fleet"
)

func TestSeed_readsBack(t *testing.T) {
	ud := "#cloud-config\nhostname: pf-p1\nruncmd:\n  - [\"echo\", \"<&>\"]\n"
	img, err := seedISO("p1-3f2a9c", "pf-p1", ud, fleet.Network{})
	if err != nil {
		t.Fatal(err)
	}
	if len(img) < 32774 || string(img[32769:32774]) != "CD001" {
		t.Fatalf("no ISO9660 magic at 32769")
	}
	if len(img)%2048 != 0 {
		t.Fatalf("image of %d bytes is not whole sectors", len(img))
	}
	files := readISO(t, img)
	if got := files["meta-data"]; got != "instance-id: \"p1-3f2a9c\"\nlocal-hostname: \"pf-p1\"\n" {
		t.Fatalf("meta-data %q", got)
	}
	if got := files["user-data"]; got != ud {
		t.Fatalf("user-data %q", got)
	}
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
}

// What the guest sees: the library writes no Rock Ridge or Joliet, so the
// names in the directory records are what Linux's isofs shows after mapping
// them to lower case and dropping ";1". They must come out as "meta-data"
// and "user-data", the names cloud-init reads (the test guest would also
// take "meta_data").
func TestSeed_namesAsTheGuestSeesThem(t *testing.T) {
	img, err := seedISO("i-1", "pf-p1", "#cloud-config\n", fleet.Network{})
	if err != nil {
		t.Fatal(err)
	}
	for _, stored := range []string{"meta-data;1", "user-data;1"} {
		if !bytes.Contains(img, []byte(stored)) {
			t.Errorf("no directory record %q in the image", stored)
		}
		seen := strings.TrimSuffix(strings.ToLower(stored), ";1") // isofs, map=normal
		if seen != "meta-data" && seen != "user-data" {
			t.Errorf("the guest would see %q", seen)
		}
	}
}

func TestSeed_rejectsValuesThatWouldBreakMetaData(t *testing.T) {
	for _, c := range []struct{ id, host string }{
		{"", "pf-p1"},
		{"p1\nlocal-hostname: evil", "pf-p1"},
		{"p1 #", "pf-p1"},
		{"p1", ""},
		{"p1", "PF-P1"},
		{"p1", "pf-p1\ninstance-id: x"},
		{"p1", "pf_p1"},
		{"p1", strings.Repeat("a.", 127) + "a"},
	} {
		if _, err := seedISO(c.id, c.host, "", fleet.Network{}); err == nil {
			t.Errorf("seedISO(%q, %q) accepted", c.id, c.host)
		}
	}
	if _, err := seedISO("p1.2_x-Y", "pf-p1.fleet.example", "", fleet.Network{}); err != nil {
		t.Errorf("good values refused: %v", err)
	}
}

func TestUserData(t *testing.T) {
	got, err := userData("#cloud-config\nfqdn: {{.Hostname}}.example\nwrite_files:\n  - path: /etc/proxy-id\n    content: {{.ID}}\n", testGuestProxy, "p1", "pf-p1", fleet.Network{})
	if err != nil || got != "#cloud-config\nfqdn: pf-p1.example\nwrite_files:\n  - path: /etc/proxy-id\n    content: p1\n" {
		t.Fatalf("template: %q, %v", got, err)
	}
	// A template gets the proxy's settings too.
	got, err = userData("{{.Port}} {{.User}} {{.Password}} {{range .Allow}}{{.}},{{end}}", testGuestProxy, "p1", "pf-p1", fleet.Network{})
	if err != nil || got != "3128 fleet pw-for-tests 198.18.0.0/15,198.18.0.1/32," {
		t.Fatalf("proxy fields: %q, %v", got, err)
	}
	// .Deny: the default list without one, the list as given, none.
	got, err = userData("{{range .Deny}}{{.}},{{end}}{{len .Deny}}", testGuestProxy, "p1", "pf-p1", fleet.Network{})
	if want := strings.Join(deny.Default().Strings(), ",") + ",11"; err != nil || got != want {
		t.Fatalf("Deny by default: %q, %v; want %q", got, err, want)
	}
	mine, err := deny.Parse("proxy.deny", []string{"fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    *deny.List
		want string
	}{{&mine, "fd00::/8,1"}, {&deny.List{}, "0"}} {
		gp := testGuestProxy
		gp.Deny = c.d
		if got, err = userData("{{range .Deny}}{{.}},{{end}}{{len .Deny}}", gp, "p1", "pf-p1", fleet.Network{}); err != nil || got != c.want {
			t.Fatalf("Deny %v: %q, %v; want %q", c.d.Strings(), got, err, c.want)
		}
	}
	got, err = userData("{{.PasswordHash}}", testGuestProxy, "p1", "pf-p1", fleet.Network{})
	if err != nil || bcrypt.CompareHashAndPassword([]byte(got), []byte(testGuestProxy.Password)) != nil {
		t.Fatalf("PasswordHash %q does not check: %v", got, err)
	}
	for name, c := range map[string]struct{ tmpl, id, host string }{
		"unknown field": {"{{.Secret}}", "p1", "pf-p1"},
		"bad template":  {"{{.ID", "p1", "pf-p1"},
		"bad id":        {"", "p1\nruncmd: [x]", "pf-p1"},
		"bad hostname":  {"", "p1", "pf-p1\nruncmd: [x]"},
	} {
		if got, err := userData(c.tmpl, testGuestProxy, c.id, c.host, fleet.Network{}); err == nil {
			t.Errorf("%s: rendered %q", name, got)
		}
	}
}

// The default user-data is a cloud-config that writes squid's whole
// configuration and a password file holding a bcrypt hash (never the
// password), then installs (if missing) and starts squid and the guest
// agent. Each access setting shows in squid's lines.
func TestDefaultUserData_configuresSquid(t *testing.T) {
	type file struct {
		Path, Owner, Permissions, Content string
	}
	var doc struct {
		Hostname   string     `yaml:"hostname"`
		WriteFiles []file     `yaml:"write_files"`
		RunCmd     [][]string `yaml:"runcmd"`
	}
	render := func(gp GuestProxy) (string, map[string]file) {
		t.Helper()
		ud, err := userData("", gp, "p1", "pf-p1", fleet.Network{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ud, "#cloud-config\n") {
			t.Fatalf("no #cloud-config line:\n%s", ud)
		}
		doc.WriteFiles = nil
		if err := yamlDecode(ud, &doc); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, ud)
		}
		files := map[string]file{}
		for _, f := range doc.WriteFiles {
			files[f.Path] = f
		}
		return ud, files
	}
	ud, files := render(testGuestProxy)
	if doc.Hostname != "pf-p1" {
		t.Errorf("hostname %q", doc.Hostname)
	}
	if strings.Contains(ud, testGuestProxy.Password) {
		t.Errorf("the user-data holds the password:\n%s", ud)
	}
	conf := files[squidConfPath].Content
	for _, want := range []string{
		"http_port 3128\nvisible_hostname pf-p1\n", "http_access deny !proxyfleet_safe_ports\n",
		"request_header_access Cache-Control deny all\n", "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/proxyfleet.passwd\n",
		"acl proxyfleet_users proxy_auth REQUIRED\n", "acl proxyfleet_allow src 198.18.0.0/15 198.18.0.1/32\n",
		"acl proxyfleet_deny dst 127.0.0.0/8 ::1/128 0.0.0.0/8 ::/128 169.254.0.0/16 fe80::/10 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10 fc00::/7\n",
		"http_access deny !proxyfleet_safe_ports\nhttp_access deny proxyfleet_guest\nhttp_access deny proxyfleet_deny\nhttp_access deny !proxyfleet_allow\nhttp_access allow proxyfleet_users\nhttp_access deny all\n",
		"via off\n", "forwarded_for delete\n", "request_header_access X-Forwarded-For deny all\n",
		"request_header_access Forwarded deny all\n", "access_log none\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("squid.conf lacks %q:\n%s", want, conf)
		}
	}
	pw := files[squidPasswdPath]
	user, hash, _ := strings.Cut(strings.TrimSpace(pw.Content), ":")
	if user != "fleet" || bcrypt.CompareHashAndPassword([]byte(hash), []byte(testGuestProxy.Password)) != nil {
		t.Errorf("password file %q does not check", pw.Content)
	}
	if pw.Owner != "root:proxy" || pw.Permissions != "0640" {
		t.Errorf("password file owner %q, mode %q", pw.Owner, pw.Permissions)
	}
	if n := len(doc.RunCmd); n == 0 || !strings.Contains(strings.Join(doc.RunCmd[n-1], " "), "systemctl restart squid") {
		t.Errorf("runcmd %q does not end starting squid", doc.RunCmd)
	}
	// Allow-list only: no credential, any allowed source.
	_, files = render(GuestProxy{Port: 8080, Allow: testGuestProxy.Allow})
	conf = files[squidConfPath].Content
	if _, ok := files[squidPasswdPath]; ok || strings.Contains(conf, "auth_param") || !strings.Contains(conf, "http_port 8080\n") ||
		!strings.Contains(conf, "http_access deny !proxyfleet_allow\nhttp_access allow all\n") {
		t.Errorf("allow-list only:\n%s", conf)
	}
	// Credential only: no source acl.
	_, files = render(GuestProxy{User: "fleet", Password: "x"})
	if conf = files[squidConfPath].Content; strings.Contains(conf, "proxyfleet_allow") {
		t.Errorf("credential only:\n%s", conf)
	}
	// A deny list of its own replaces the default; the guest's own
	// addresses stay refused.
	mine, err := deny.Parse("proxy.deny", []string{"fd00::/8", "198.51.100.7"})
	if err != nil {
		t.Fatal(err)
	}
	_, files = render(GuestProxy{User: "fleet", Password: "x", Deny: &mine})
	if conf = files[squidConfPath].Content; !strings.Contains(conf, "\nacl proxyfleet_deny dst fd00::/8 198.51.100.7/32\n") ||
		!strings.Contains(conf, "\nhttp_access deny proxyfleet_guest\nhttp_access deny proxyfleet_deny\nhttp_access allow proxyfleet_users\n") {
		t.Errorf("a deny list:\n%s", conf)
	}
	// An empty one: no acl (squid refuses one without values), no rule.
	_, files = render(GuestProxy{User: "fleet", Password: "x", Deny: &deny.List{}})
	if conf = files[squidConfPath].Content; strings.Contains(conf, "proxyfleet_deny") ||
		!strings.Contains(conf, "\nhttp_access deny proxyfleet_guest\nhttp_access allow proxyfleet_users\n") {
		t.Errorf("nothing denied:\n%s", conf)
	}
}

// Proxies open to anyone are refused unless said; bad values name the
// field.
func TestGuestProxyValidate(t *testing.T) {
	for name, c := range map[string]struct {
		gp    GuestProxy
		field string
	}{
		"open":          {GuestProxy{}, "Proxy"},
		"user no pw":    {GuestProxy{User: "u"}, "Proxy.Password"},
		"pw no user":    {GuestProxy{Password: "p", Open: true}, "Proxy.User"},
		"bad user":      {GuestProxy{User: "a:b", Password: "p"}, "Proxy.User"},
		"long pw":       {GuestProxy{User: "u", Password: strings.Repeat("p", 73)}, "Proxy.Password"},
		"newline in pw": {GuestProxy{User: "u", Password: "p\nq"}, "Proxy.Password"},
		"bad port":      {GuestProxy{Port: 70000, Open: true}, "Proxy.Port"},
	} {
		var oe *OptionError
		if err := c.gp.validate(); !errors.As(err, &oe) || oe.Field != c.field {
			t.Errorf("%s: %v, want field %s", name, err, c.field)
		}
	}
	for _, gp := range []GuestProxy{{Open: true}, testGuestProxy, {Allow: testGuestProxy.Allow}} {
		if err := gp.validate(); err != nil {
			t.Errorf("%+v: %v", gp, err)
		}
	}
}

// readISO reads every file in the image's root with the library's reader,
// and checks the volume id on the way.
func readISO(t *testing.T, img []byte) map[string]string {
	t.Helper()
	im, err := iso9660.OpenImage(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	label, err := im.Label()
	if err != nil || label != "cidata" {
		t.Fatalf("volume id %q, %v", label, err)
	}
	root, err := im.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	kids, err := root.GetChildren()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range kids {
		if k.IsDir() {
			t.Fatalf("unexpected directory %q", k.Name())
		}
		b, err := io.ReadAll(k.Reader())
		if err != nil {
			t.Fatal(err)
		}
		out[k.Name()] = string(b)
	}
	return out
}

// A valid proxy id or host name can look like a YAML bool, null or number
// ("true", "null", "123", "1.5", "yes", "012"); meta-data and the default
// user-data must still give cloud-init the string, not true or 123, or the
// guest gets no hostname or another one (found by FuzzSeed).
func TestSeed_valuesReadBackAsStrings(t *testing.T) {
	for _, v := range []string{"true", "null", "123", "1.5", "yes", "off", "012", "0x1f", "1e5"} {
		img, err := seedISO(v, v, "", fleet.Network{})
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		md := readISO(t, img)["meta-data"]
		if got := yamlStrings(t, md); got["instance-id"] != v || got["local-hostname"] != v {
			t.Errorf("%q: meta-data reads as %q:\n%s", v, got, md)
		}
		ud, err := userData("", testGuestProxy, "p1", v, fleet.Network{})
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if got := yamlStrings(t, ud); got["hostname"] != v {
			t.Errorf("%q: default user-data reads as %q:\n%s", v, got, ud)
		}
	}
}

// An IPv4-only plan's default user-data turns IPv6 off on eth0, at once
// and for later boots; a plan with IPv6 addresses, or none, leaves it.
func TestDefaultUserData_ipv4OnlyTurnsIPv6Off(t *testing.T) {
	var doc struct {
		BootCmd    [][]string `yaml:"bootcmd"`
		WriteFiles []struct {
			Path, Content string
		} `yaml:"write_files"`
	}
	for name, c := range map[string]struct {
		n   fleet.Network
		off bool
	}{
		"ipv4 only": {fleet.Network{MAC: "52:54:00:00:00:01", IPv4: netip.MustParseAddr("198.18.101.5")}, true},
		"dual":      {fleet.Network{MAC: "52:54:00:00:00:01", IPv4: netip.MustParseAddr("198.18.101.5"), IPv6: []netip.Addr{netip.MustParseAddr("2001:db8:101::5")}}, false},
		"ipv6 only": {fleet.Network{MAC: "52:54:00:00:00:01", IPv6: []netip.Addr{netip.MustParseAddr("2001:db8:101::5")}}, false},
		"dhcp":      {fleet.Network{}, false},
	} {
		ud, err := userData("", testGuestProxy, "p1", "pf-p1", c.n)
		if err != nil {
			t.Fatal(err)
		}
		doc.BootCmd, doc.WriteFiles = nil, nil
		if err := yamlDecode(ud, &doc); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", name, err, ud)
		}
		boot := slices.ContainsFunc(doc.BootCmd, func(c []string) bool {
			return slices.Equal(c, []string{"sysctl", "-w", "net.ipv6.conf.eth0.disable_ipv6=1"})
		})
		file := slices.ContainsFunc(doc.WriteFiles, func(f struct{ Path, Content string }) bool {
			return strings.HasPrefix(f.Path, "/etc/sysctl.d/") && f.Content == "net.ipv6.conf.eth0.disable_ipv6 = 1\n"
		})
		if boot != c.off || file != c.off {
			t.Errorf("%s: bootcmd sysctl %v, sysctl.d file %v; want %v:\n%s", name, boot, file, c.off, ud)
		}
	}
}
