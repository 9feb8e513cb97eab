package kvm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Fuzz targets of what the provider writes (`make fuzz` runs each for a
// bounded time; `go test -run Fuzz ./kvm/` runs their seeds and the
// testdata/fuzz corpus, with no test host).

// hostile are values the seeds put in every free-form field: XML
// metacharacters, control characters, invalid UTF-8, long unicode.
var hostile = []string{
	"", "p1", `'"/><devices><hostdev mode='subsystem'/></devices><!-- &amp; ]]>`,
	"a\x00b\x01\x1f\x7f", "\t\n\r", " lead and trail ", "\xff\xfe not utf-8", "\ufffe\uffff\ufdd0",
	strings.Repeat("é𝄞漢", 30), "\u2028\u0085", "</proxyfleet:label></proxyfleet:mark><evil/>",
}

// FuzzDomainXML: every value that reaches a domain or volume definition
// either reads back through libvirtxml (and parseMark) exactly as it went
// in, or the definition is refused. Which one, per field:
//   - the proxy id: validated (messages.ValidID), so never escaped at all;
//   - config and libvirt values (network, pool, kernel, initrd and disk
//     paths, cmdline, console log, CPU mode): refused unless XML 1.0 can
//     carry them (xmlText); tabs, newlines and every other XML character
//     are escaped by encoding/xml and read back unchanged;
//   - mark fields that name things (spec hash, host entry, image, label
//     keys): refused unless plain text (plainText);
//   - free-form mark values (command id, label values): anything; what XML
//     cannot carry is stored base64;
//   - the MAC: refused unless "" or the canonical form checkNetwork leaves.
func FuzzDomainXML(f *testing.F) {
	macs := []string{"", "52:54:00:12:34:56", "52:54:00:AB:CD:EF", "52-54-00-ab-cd-ef", "52:54:00:ab:cd"}
	for i, h := range hostile {
		f.Add("p1", h, "/k", h, "/pool/"+h, "default", h, "", h, "beelink", "debian-12", "3f2a9c", "team", h, int64(i)*1e15+123456789, i%2 == 0, macs[i%len(macs)])
		f.Add("p-"+string(rune('a'+i)), "pfnet", "", "", "/d", h, "", h, "cmd-42", h, h, h, h, "v", int64(-i)*1e15, i%2 == 1, h)
	}
	for _, n := range []string{"pf-base-h1-0123456789abcdef.qcow2", "pf-kernel-h-2-0123456789abcdef", "pf-initrd-h1-0123456789ABCDEF",
		"pf-base-x-0123456789abcdef-disk.qcow2", "pf-p1-seed.iso", "pf-base-h1-0123456789abcdef.raw.qcow2", "pf-pf-p1"} {
		f.Add("base-h1-0123456789abcdef", n, "", "", n, "default", "", "", "c", "h1", n, "", "k", "", int64(0), false, "")
	}
	f.Fuzz(func(t *testing.T, id, network, kernel, cmdline, diskPath, pool, consoleLog, cpuMode,
		commandID, host, image, specHash, labelKey, labelValue string, nanos int64, kvm bool, mac string) {
		p := domainParams{
			Type: DomainQEMU, ID: id, CPUs: 2, MemoryMiB: 256, Network: network, MAC: mac,
			Disk:    diskRef{Path: diskPath},
			Seed:    diskRef{Pool: pool, Volume: seedVolumeName(id)},
			Kernel:  kernel,
			Cmdline: cmdline, ConsoleLog: consoleLog, CPUMode: cpuMode,
			Mark: mark{
				Owner: markOwner, ID: id, CommandID: commandID, SpecHash: specHash,
				CreatedAt: time.Unix(0, nanos).UTC(), Host: host, Image: image,
				Labels: map[string]string{labelKey: labelValue},
			},
		}
		if kvm {
			p.Type = DomainKVM
		}
		if kernel != "" {
			p.Initrd = kernel + ".initrd"
		}
		reject := !messages.ValidID(id) || network == "" || diskPath == "" || pool == "" ||
			(kernel == "" && cmdline != "")
		for _, v := range []string{network, kernel, p.Initrd, cmdline, diskPath, pool, consoleLog, cpuMode} {
			reject = reject || !xmlTextForTest(v)
		}
		for _, v := range []string{specHash, host, image, labelKey} {
			reject = reject || !plainText(v)
		}
		if mac != "" {
			hw, err := net.ParseMAC(mac)
			reject = reject || err != nil || len(hw) != 6 || hw.String() != mac
		}

		s, err := domainXML(p)
		if reject != (err != nil) {
			t.Fatalf("domainXML: error %v, want refused %v", err, reject)
		}
		if err == nil {
			checkDomainReadsBack(t, p, s)
		}

		checkNames(t, id, host, sha256hex(image), diskPath, network, image)

		v, err := overlayVolumeXML(id, 1<<30, diskPath, "qcow2")
		if want := !messages.ValidID(id) || diskPath == "" || !xmlTextForTest(diskPath); want != (err != nil) {
			t.Fatalf("overlayVolumeXML: error %v, want refused %v", err, want)
		}
		if err == nil {
			var vol libvirtxml.StorageVolume
			if err := vol.Unmarshal(v); err != nil {
				t.Fatalf("unmarshal volume: %v\n%s", err, v)
			}
			if vol.Name != overlayVolumeName(id) || vol.BackingStore == nil || vol.BackingStore.Path != diskPath {
				t.Fatalf("volume reads back as %+v\n%s", vol, v)
			}
		}
	})
}

// checkNames: the names of a proxy's domain and volumes and of a host
// entry's cached volumes parse back to what built them exactly when the id
// and host entry are valid; any other string that parses as one of our
// names is rebuilt from its parts byte for byte (one name, one meaning); a
// volume name ours reads back from its definition.
func checkNames(t *testing.T, id, host, sha string, others ...string) {
	t.Helper()
	if got, ok := parseDomainName(domainName(id)); ok != messages.ValidID(id) || (ok && got != id) {
		t.Fatalf("domain name of %q parses as %q, %v", id, got, ok)
	}
	for _, c := range []struct {
		name string
		kind volumeKind
	}{{overlayVolumeName(id), kindOverlay}, {seedVolumeName(id), kindSeed}} {
		v, ok := parseVolumeName(c.name)
		if ok != messages.ValidID(id) || (ok && v != (volumeName{Kind: c.kind, ID: id})) {
			t.Fatalf("%s volume name %q of %q parses as %+v, %v", c.kind, c.name, id, v, ok)
		}
	}
	names := others
	for _, build := range []func() (string, error){
		func() (string, error) { return baseVolumeName(host, sha, "qcow2") },
		func() (string, error) { return baseVolumeName(host, sha, "raw") },
		func() (string, error) { return kernelVolumeName(host, sha) },
		func() (string, error) { return initrdVolumeName(host, sha) },
	} {
		name, err := build()
		if (err == nil) != messages.ValidID(host) {
			t.Fatalf("cached volume name for host %q: %q, %v", host, name, err)
		}
		if err == nil {
			v, ok := parseVolumeName(name)
			if !ok || v.Host != host || v.Digest != sha[:digestLen] {
				t.Fatalf("cached volume name %q parses as %+v, %v", name, v, ok)
			}
			names = append(names, name)
		}
	}
	for _, name := range append(names, domainName(id), overlayVolumeName(id), seedVolumeName(id)) {
		if got, ok := parseDomainName(name); ok && domainName(got) != name {
			t.Fatalf("domain name %q parses as %q", name, got)
		}
		v, ok := parseVolumeName(name)
		if !ok {
			continue
		}
		var again string
		var err error
		switch v.Kind {
		case kindOverlay:
			again = overlayVolumeName(v.ID)
		case kindSeed:
			again = seedVolumeName(v.ID)
		case kindBase:
			again, err = baseVolumeName(v.Host, v.Digest+strings.Repeat("0", 64-digestLen), v.Format)
		case kindKernel:
			again, err = kernelVolumeName(v.Host, v.Digest+strings.Repeat("0", 64-digestLen))
		case kindInitrd:
			again, err = initrdVolumeName(v.Host, v.Digest+strings.Repeat("0", 64-digestLen))
		}
		if err != nil || again != name {
			t.Fatalf("volume name %q parses as %+v, which names %q (%v)", name, v, again, err)
		}
		if v.Kind == kindOverlay {
			continue // defined by overlayVolumeXML
		}
		format := v.Format
		if format == "" {
			format = "raw"
		}
		def, err := plainVolumeXML(name, 1, format)
		if err != nil {
			t.Fatalf("plainVolumeXML(%q): %v", name, err)
		}
		var vol libvirtxml.StorageVolume
		if err := vol.Unmarshal(def); err != nil || vol.Name != name {
			t.Fatalf("volume %q reads back as %q, %v", name, vol.Name, err)
		}
	}
}

func sha256hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// checkDomainReadsBack: every value of p is in the definition s as it went
// in, and s holds nothing but what domainXML builds.
func checkDomainReadsBack(t *testing.T, p domainParams, s string) {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(s); err != nil {
		t.Fatalf("unmarshal: %v\n%s", err, s)
	}
	// The same structure: what libvirtxml read marshals to the same bytes.
	if again, err := d.Marshal(); err != nil || again != s {
		t.Fatalf("re-marshalled definition differs (%v):\n%s\n%s", err, s, again)
	}
	dev := d.Devices
	if d.Name != domainName(p.ID) || d.Type != p.Type || d.OS == nil || dev == nil ||
		len(dev.Disks) != 2 || len(dev.Interfaces) != 1 || len(dev.Serials) != 1 {
		t.Fatalf("structure changed:\n%s", s)
	}
	got := []string{d.OS.Kernel, d.OS.Initrd, d.OS.Cmdline, dev.Interfaces[0].Source.Network.Network,
		dev.Disks[0].Source.File.File, dev.Disks[1].Source.Volume.Pool, dev.Disks[1].Source.Volume.Volume, d.CPU.Mode}
	mode := p.CPUMode
	if mode == "" {
		mode = cpuFor(p.Type, "").Mode
	}
	want := []string{p.Kernel, p.Initrd, p.Cmdline, p.Network, p.Disk.Path, p.Seed.Pool, p.Seed.Volume, mode}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("values read back as %q, want %q\n%s", got, want, s)
	}
	if mac := dev.Interfaces[0].MAC; (p.MAC == "") != (mac == nil) || (mac != nil && mac.Address != p.MAC) {
		t.Fatalf("mac %+v, want %q", mac, p.MAC)
	}
	if log := dev.Serials[0].Log; (p.ConsoleLog == "") != (log == nil) || (log != nil && log.File != p.ConsoleLog) {
		t.Fatalf("console log %+v, want %q", log, p.ConsoleLog)
	}
	m, ok, err := parseMark(s)
	if err != nil || !ok || !reflect.DeepEqual(m, p.Mark) {
		t.Fatalf("mark reads back as %#v (ours %v, %v), want %#v\n%s", m, ok, err, p.Mark, s)
	}
}

// FuzzSeed: rendering the NoCloud seed never panics; meta-data and the
// default user-data are valid YAML whose values are exactly the strings that
// went in (or the inputs are refused); the ISO carries user-data byte for
// byte.
func FuzzSeed(f *testing.F) {
	for _, h := range append(hostile, "true", "null", "123", "1.5", "0x1f", "yes", "off", "1e5", "012", "pf-p1", "a.b.c") {
		f.Add(h, h, h)
		f.Add("p1", h, "#cloud-config\n"+h)
	}
	f.Fuzz(func(t *testing.T, id, hostname, tmpl string) {
		checkUserData(t, "", id, hostname)
		// An operator's template that quotes the values, as seed.go says to.
		checkUserData(t, "#cloud-config\nfqdn: \"{{.Hostname}}.example\"\nwrite_files:\n  - path: /etc/proxy-id\n    content: '{{.ID}}'\n", id, hostname)
		// Any template: an error or a rendering, never a panic.
		_, _ = userData(tmpl, testGuestProxy, id, hostname, fleet.Network{})

		instance := id
		img, err := seedISO(instance, hostname, tmpl, fleet.Network{})
		if want := !instanceIDRE.MatchString(instance) || !hostnameRE.MatchString(hostname) || len(hostname) > 253; want != (err != nil) {
			t.Fatalf("seedISO(%q, %q): error %v, want refused %v", instance, hostname, err, want)
		}
		if err != nil {
			return
		}
		files := readISO(t, img)
		if files["user-data"] != tmpl || len(files) != 2 {
			t.Fatalf("user-data %q, want %q (files %v)", files["user-data"], tmpl, files)
		}
		md := yamlStrings(t, files["meta-data"])
		if md["instance-id"] != instance || md["local-hostname"] != hostname || len(md) != 2 {
			t.Fatalf("meta-data reads as %q, want instance-id %q, local-hostname %q:\n%s", md, instance, hostname, files["meta-data"])
		}
	})
}

// checkUserData renders tmpl (whose values are quoted) and checks it reads
// back with id and hostname as they went in, or that they were refused.
func checkUserData(t *testing.T, tmpl, id, hostname string) {
	t.Helper()
	ud, err := userData(tmpl, testGuestProxy, id, hostname, fleet.Network{})
	if want := !messages.ValidID(id) || !hostnameRE.MatchString(hostname) || len(hostname) > 253; want != (err != nil) {
		t.Fatalf("userData(%q, %q): error %v, want refused %v", id, hostname, err, want)
	}
	if err != nil {
		return
	}
	if !strings.HasPrefix(ud, "#cloud-config\n") {
		t.Fatalf("user-data does not start with #cloud-config:\n%s", ud)
	}
	var doc struct {
		Hostname   string `yaml:"hostname"`
		FQDN       string `yaml:"fqdn"`
		WriteFiles []struct {
			Content string `yaml:"content"`
		} `yaml:"write_files"`
	}
	u := yamlStrings(t, ud)
	if err := yamlDecode(ud, &doc); err != nil {
		t.Fatalf("user-data is not YAML: %v\n%s", err, ud)
	}
	if tmpl == "" {
		if u["hostname"] != hostname {
			t.Fatalf("user-data hostname reads as %q, want %q:\n%s", u["hostname"], hostname, ud)
		}
		return
	}
	if doc.FQDN != hostname+".example" || len(doc.WriteFiles) != 1 || doc.WriteFiles[0].Content != id {
		t.Fatalf("user-data reads as %+v:\n%s", doc, ud)
	}
}

// xmlTextForTest is the rule FuzzDomainXML holds domainXML to: valid UTF-8
// of characters XML 1.0 allows.
func xmlTextForTest(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !(r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF) {
			return false
		}
	}
	return true
}

func yamlDecode(s string, v any) error { return yaml.Unmarshal([]byte(s), v) }

// yamlStrings reads a YAML mapping's top-level scalars as cloud-init would,
// keeping each as a string only if YAML reads it as one: a value that YAML
// 1.2 (go.yaml.in/yaml) or 1.1 (PyYAML, cloud-init's) resolves to a bool,
// number or null is kept as "!!tag value", so it never equals the input.
func yamlStrings(t *testing.T, s string) map[string]string {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(s), &n); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, s)
	}
	if n.Kind != yaml.DocumentNode || len(n.Content) != 1 || n.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("not one YAML mapping:\n%s", s)
	}
	out := map[string]string{}
	kids := n.Content[0].Content
	for i := 0; i+1 < len(kids); i += 2 {
		k, v := kids[i], kids[i+1]
		if v.Kind != yaml.ScalarNode {
			continue
		}
		tag := v.ShortTag()
		if tag == "!!str" && v.Style == 0 && yaml11NotString(v.Value) {
			tag = "!!yaml1.1"
		}
		if tag == "!!str" {
			out[k.Value] = v.Value
		} else {
			out[k.Value] = fmt.Sprintf("%s %s", tag, v.Value)
		}
	}
	return out
}

// yaml11NotString: plain scalars YAML 1.1 resolves to a bool, a number in
// a base or form YAML 1.2 dropped, or null.
func yaml11NotString(s string) bool {
	switch strings.ToLower(s) {
	case "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "":
		return true
	}
	if len(s) > 1 && s[0] == '0' && strings.Trim(s, "01234567_") == "" {
		return true // octal
	}
	if strings.HasPrefix(s, "0b") && strings.Trim(s[2:], "01_") == "" {
		return true
	}
	return false
}

// FuzzParseMark: whatever libvirt (or someone else) hands back, parseMark
// never panics, and a mark it accepts is ours and writes back out to a mark
// that parses to the same value.
func FuzzParseMark(f *testing.F) {
	f.Add(libvirtDumpXML)
	f.Add(libvirtGetMetadata)
	for _, h := range hostile {
		m := testMark("p1")
		m.CommandID, m.Labels = h, map[string]string{"k": h}
		if s, err := m.xml(); err == nil {
			f.Add(s)
		}
	}
	f.Add(`<domain><name>pf-p1</name><metadata><m:mark xmlns:m="https://proxyfleet.dev/xmlns/mark/1"><m:owner>proxyfleet</m:owner><m:id>p1</m:id><m:createdAt>2026-01-02T03:04:05Z</m:createdAt><m:label key="a">x</m:label><m:label key="a">y</m:label></m:mark></metadata></domain>`)
	f.Add(`<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-01-02T03:04:05Z</createdAt><commandId enc="base64"> YQ== </commandId></mark>`)
	f.Add(`<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-01-02T03:04:05.5+01:00</createdAt><host> h </host></mark>`)
	m := testMark("p1")
	m.Egress = []netip.Addr{netip.MustParseAddr("198.18.101.5"), netip.MustParseAddr("2001:db8::5")}
	m.Addr = m.Egress[0]
	if s, err := m.xml(); err == nil {
		f.Add(s)
	}
	f.Add(`<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-01-02T03:04:05Z</createdAt><egress> ::ffff:1.2.3.4 </egress><egress>2001:DB8::5</egress><addr>2001:db8::5</addr></mark>`)
	f.Add(`<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-01-02T03:04:05Z</createdAt><egress>fe80::1%eth0</egress><addr>fe80::1%eth0</addr></mark>`)
	f.Fuzz(func(t *testing.T, doc string) {
		m, ok, err := parseMark(doc)
		if err != nil || !ok {
			return
		}
		if m.Owner != markOwner || !messages.ValidID(m.ID) {
			t.Fatalf("accepted a mark that is not ours: %#v", m)
		}
		s, err := m.xml()
		if err != nil {
			// Only a mark whose naming fields are not plain text cannot be
			// written back; parseMark reads what it is given.
			for _, v := range append([]string{m.SpecHash, m.Host, m.Image}, labelKeys(m)...) {
				if !plainText(v) {
					return
				}
			}
			t.Fatalf("accepted mark %#v does not write back: %v", m, err)
		}
		m2, ok, err := parseMark(s)
		if ok && m2.CreatedAt.Equal(m.CreatedAt) {
			m2.CreatedAt = m.CreatedAt // one instant; a mark is written in UTC
		}
		if err != nil || !ok || !reflect.DeepEqual(m2, m) {
			t.Fatalf("mark %#v rewritten reads back as %#v, %v, %v\n%s", m, m2, ok, err, s)
		}
	})
}

func labelKeys(m mark) []string {
	var ks []string
	for k := range m.Labels {
		ks = append(ks, k)
	}
	return ks
}

// FuzzNetworkConfig: whatever network a plan hands over, checkNetwork
// either refuses it or returns one whose MAC the domain definition takes
// and whose network-config reads back (under YAML 1.2, every value quoted
// for 1.1) as exactly its addresses and gateways; the seed carries
// network-config exactly when the network is static.
func FuzzNetworkConfig(f *testing.F) {
	f.Add("52:54:00:12:34:56", "198.18.101.5", "198.18.101.1", "2001:db8:101::5", "2001:db8:101::6", "fe80::1")
	f.Add("12:34:56:12:34:56", "", "", "1:2:3:4:5:6:7:8", "", "1:2:3:4:5:6:7:1")
	f.Add("52-54-00-AB-CD-EF", "203.0.113.7", "203.0.113.1", "", "", "")
	f.Add("", "198.18.101.5", "198.18.101.1", "", "", "")
	f.Add("52:54:00:12:34:56", "::ffff:198.18.101.5", "198.18.101.1", "fe80::5%eth0", "2001:db8::5", "2001:db8::5")
	f.Add("01:00:5e:00:00:01", "", "198.18.101.1", "", "", "")
	f.Fuzz(func(t *testing.T, mac, v4, g4, v6a, v6b, g6 string) {
		parse := func(s string) netip.Addr {
			a, _ := netip.ParseAddr(s)
			return a
		}
		n := fleet.Network{MAC: mac, IPv4: parse(v4), IPv4Gateway: parse(g4), IPv6Gateway: parse(g6)}
		for _, s := range []string{v6a, v6b} {
			if a := parse(s); a.IsValid() {
				n.IPv6 = append(n.IPv6, a)
			}
		}
		n, err := checkNetwork(n)
		if err != nil {
			return
		}
		p := testDomainParams()
		p.MAC = n.MAC
		if _, err := domainXML(p); err != nil {
			t.Fatalf("checked mac %q refused by the domain: %v", n.MAC, err)
		}
		img, err := seedISO("p1", "pf-p1", "#cloud-config\n", n)
		if err != nil {
			t.Fatalf("seed of checked network %+v: %v", n, err)
		}
		files := readISO(t, img)
		if _, ok := files["network-config"]; ok != n.Static() || len(files) != 2+btoi(ok) {
			t.Fatalf("network %+v (static %v): seed files %q", n, n.Static(), files)
		}
		if n.Static() {
			checkNetCfg(t, files["network-config"], n)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
