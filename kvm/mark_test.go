package kvm

import (
	"encoding/xml"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func testMark(id string) mark {
	return mark{
		Owner:     markOwner,
		ID:        id,
		CommandID: "cmd-42",
		SpecHash:  "3f2a9c",
		CreatedAt: time.Date(2026, 11, 30, 7, 1, 2, 345000000, time.UTC),
		Host:      "beelink",
		Image:     "debian-12",
		Labels:    map[string]string{"team": "edge", "tier": "b"},
	}
}

func TestMark_roundTripElement(t *testing.T) {
	m := testMark("p1")
	s, err := m.xml()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s, `<proxyfleet:mark xmlns:proxyfleet="`+markNS+`">`) {
		t.Fatalf("element does not declare its own namespace: %s", s)
	}
	got, ok, err := parseMark(s)
	if err != nil || !ok {
		t.Fatalf("parseMark: %v, %v", ok, err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
	if in := got.instance(); in.ID != "p1" || in.CommandID != "cmd-42" || in.SpecHash != "3f2a9c" || !in.CreatedAt.Equal(m.CreatedAt) {
		t.Fatalf("instance %+v", in)
	}
	// The same spec gives the same bytes (labels are sorted).
	if s2, _ := m.xml(); s2 != s {
		t.Fatalf("marshal is not deterministic:\n%s\n%s", s, s2)
	}
}

// libvirt may hand back the element with another prefix, or with the
// namespace as the default one; both are the same element.
func TestMark_parsesAnyPrefix(t *testing.T) {
	for _, doc := range []string{
		`<pf:mark xmlns:pf="` + markNS + `"><pf:owner>proxyfleet</pf:owner><pf:id>p1</pf:id><pf:createdAt>2026-11-30T07:01:02Z</pf:createdAt></pf:mark>`,
		`<mark xmlns="` + markNS + `">
		   <owner>proxyfleet</owner>
		   <id>p1</id>
		   <createdAt>2026-11-30T07:01:02Z</createdAt>
		 </mark>`,
	} {
		m, ok, err := parseMark(doc)
		if err != nil || !ok || m.ID != "p1" || !m.CreatedAt.Equal(time.Date(2026, 11, 30, 7, 1, 2, 0, time.UTC)) {
			t.Errorf("%s: %+v %v %v", doc, m, ok, err)
		}
	}
}

// The shape virDomainGetXMLDesc returns: the mark inside <metadata> next to
// other applications' elements.
func TestMark_fromDomainXML(t *testing.T) {
	m := testMark("p1")
	el, _ := m.xml()
	doc := `<domain type='qemu' id='3'>
  <name>pf-p1</name>
  <uuid>7c1d1c6e-0000-4000-8000-000000000001</uuid>
  <description>&lt;proxyfleet:mark&gt; in text is not a mark</description>
  <metadata>
    <other:thing xmlns:other="https://example.com/other"><other:owner>proxyfleet</other:owner></other:thing>
    ` + el + `
  </metadata>
  <memory unit='KiB'>262144</memory>
  <devices><disk type='file' device='disk'><source file='/x'/><target dev='vda' bus='virtio'/></disk></devices>
</domain>`
	got, ok, err := parseMark(doc)
	if err != nil || !ok || !reflect.DeepEqual(got, m) {
		t.Fatalf("got %+v, %v, %v", got, ok, err)
	}
}

func TestMark_notOurs(t *testing.T) {
	other := strings.Replace(mustMarkXML(t, testMark("p1")), ">proxyfleet</proxyfleet:owner>", ">someone-else</proxyfleet:owner>", 1)
	otherNS := strings.Replace(mustMarkXML(t, testMark("p1")), markNS, "https://proxyfleet.dev/xmlns/mark/2", 1)
	for name, doc := range map[string]string{
		"domain without metadata":    `<domain type='kvm'><name>pf-p1</name><memory>1</memory></domain>`,
		"domain with other metadata": `<domain type='kvm'><name>pf-p1</name><metadata><a:x xmlns:a="https://a/"/></metadata></domain>`,
		"mark of another owner":      other,
		"mark in another namespace":  otherNS,
		"domain with foreign mark":   `<domain><name>pf-p1</name><metadata>` + other + `</metadata></domain>`,
		"mark outside metadata":      `<domain><name>pf-p1</name><devices>` + mustMarkXML(t, testMark("p1")) + `</devices></domain>`,
	} {
		m, ok, err := parseMark(doc)
		if ok || err != nil {
			t.Errorf("%s: ours=%v err=%v mark=%+v", name, ok, err, m)
		}
	}
}

func TestMark_unreadable(t *testing.T) {
	good := mustMarkXML(t, testMark("p1"))
	for name, doc := range map[string]string{
		"empty":          "",
		"not xml":        "<domain",
		"other root":     "<network><name>x</name></network>",
		"bad id":         strings.Replace(good, ">p1<", ">P1<", 1),
		"bad createdAt":  strings.Replace(good, "2026-11-30T07:01:02.345Z", "yesterday", 1),
		"two marks":      `<domain><name>pf-p1</name><metadata>` + good + good + `</metadata></domain>`,
		"cloned domain":  `<domain><name>pf-p1-clone</name><metadata>` + good + `</metadata></domain>`,
		"bad base64":     strings.Replace(good, "<proxyfleet:commandId>cmd-42", `<proxyfleet:commandId enc="base64">!!`, 1),
		"unknown enc":    strings.Replace(good, "<proxyfleet:commandId>", `<proxyfleet:commandId enc="rot13">`, 1),
		"label twice":    strings.Replace(good, "</proxyfleet:mark>", `<proxyfleet:label key="team">x</proxyfleet:label></proxyfleet:mark>`, 1),
		"two roots":      good + good,
		"unclosed inner": `<domain><name>pf-p1</name><metadata>` + good,
	} {
		if m, ok, err := parseMark(doc); err == nil || ok {
			t.Errorf("%s: want an error, have ours=%v err=%v mark=%+v", name, ok, err, m)
		}
	}
}

// Values with XML's special characters are escaped by the encoder and read
// back unchanged; values XML cannot carry (control characters) or whose
// whitespace a re-indenting serializer might change are stored base64.
func TestMark_hostileValuesSurvive(t *testing.T) {
	m := testMark("p1")
	m.CommandID = `"><proxyfleet:owner>evil</proxyfleet:owner><x a='` + "&amp;\x00\x01\t\n\r]]>"
	m.Labels = map[string]string{
		"a":     `</proxyfleet:label></proxyfleet:mark><evil/>`,
		"b.c/d": "it's \"quoted\" & <tagged>",
		"e":     "  leading and trailing  ",
		"f":     "line\nbreak",
		"g":     "\xff\xfe not utf-8",
		"h":     "",
	}
	s, err := m.xml()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s, "<evil") || strings.Contains(s, "<tagged") || strings.Contains(s, "<x ") {
		t.Fatalf("a value became markup: %s", s)
	}
	got, ok, err := parseMark(s)
	if err != nil || !ok || !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v, %v, %v\nwant %+v\n%s", got, ok, err, m, s)
	}
	// The element has exactly one owner, ours, and parses as XML on its own.
	var generic struct {
		Owners []string `xml:"owner"`
	}
	if err := xml.Unmarshal([]byte(s), &generic); err != nil || len(generic.Owners) != 1 || generic.Owners[0] != markOwner {
		t.Fatalf("owners %v, %v", generic.Owners, err)
	}
}

func TestMark_refusesWhatItCannotMatch(t *testing.T) {
	for name, f := range map[string]func(*mark){
		"bad id":        func(m *mark) { m.ID = "p1'><x" },
		"no createdAt":  func(m *mark) { m.CreatedAt = time.Time{} },
		"host with nl":  func(m *mark) { m.Host = "h1\n" },
		"image with nl": func(m *mark) { m.Image = "x\x00" },
		"label key":     func(m *mark) { m.Labels = map[string]string{"k\x01": "v"} },
	} {
		m := testMark("p1")
		f(&m)
		if s, err := m.xml(); err == nil {
			t.Errorf("%s: marshalled %s", name, s)
		}
	}
	// An empty owner is filled in: every mark we write is ours.
	m := testMark("p1")
	m.Owner = ""
	s, err := m.xml()
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, _ := parseMark(s); !ok || got.Owner != markOwner {
		t.Fatalf("owner %q, ours %v", got.Owner, ok)
	}
}

func mustMarkXML(t *testing.T, m mark) string {
	t.Helper()
	s, err := m.xml()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// What libvirt 9.0 gave back for a domain defined from domainXML with
// hostile values in the mark: virsh dumpxml re-indents the metadata, and
// virsh metadata --uri (virDomainGetMetadata, type element) strips the
// element's namespace. Both must read back as the mark that was written.
const (
	libvirtDumpXML = `<domain type='qemu'>
  <name>pf-xmlcheck-tmp</name>
  <uuid>b0201cd6-2262-4487-b15a-5cebe9163ea5</uuid>
  <metadata>
    <proxyfleet:mark xmlns:proxyfleet="https://proxyfleet.dev/xmlns/mark/1">
      <proxyfleet:owner>proxyfleet</proxyfleet:owner>
      <proxyfleet:id>xmlcheck-tmp</proxyfleet:id>
      <proxyfleet:commandId enc="base64">YwEJCiAgeCAiPCY+Jw==</proxyfleet:commandId>
      <proxyfleet:specHash>3f2a9c</proxyfleet:specHash>
      <proxyfleet:createdAt>2026-11-30T07:01:02.345Z</proxyfleet:createdAt>
      <proxyfleet:host>beelink</proxyfleet:host>
      <proxyfleet:image>debian-12</proxyfleet:image>
      <proxyfleet:label key="a">&lt;/proxyfleet:label&gt;&lt;evil/&gt; &amp; "q" 'a'</proxyfleet:label>
      <proxyfleet:label key="b" enc="base64">IHNwCm5sIA==</proxyfleet:label>
    </proxyfleet:mark>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>262144</currentMemory>
  <vcpu placement='static'>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type>
    <kernel>/var/lib/libvirt/images/pf-kernel-h1-0123456789abcdef</kernel>
    <boot dev='hd'/>
  </os>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
      <address type='virtio-serial' controller='0' bus='0' port='1'/>
    </channel>
  </devices>
</domain>
`
	libvirtGetMetadata = `<mark>
  <owner>proxyfleet</owner>
  <id>xmlcheck-tmp</id>
  <commandId enc="base64">YwEJCiAgeCAiPCY+Jw==</commandId>
  <specHash>3f2a9c</specHash>
  <createdAt>2026-11-30T07:01:02.345Z</createdAt>
  <host>beelink</host>
  <image>debian-12</image>
  <label key="a">&lt;/proxyfleet:label&gt;&lt;evil/&gt; &amp; "q" 'a'</label>
  <label key="b" enc="base64">IHNwCm5sIA==</label>
</mark>
`
)

func TestMark_whatLibvirtReturns(t *testing.T) {
	want := testMark("xmlcheck-tmp")
	want.CommandID = "c\x01\t\n  x \"<&>'"
	want.Labels = map[string]string{"a": `</proxyfleet:label><evil/> & "q" 'a'`, "b": " sp\nnl "}
	// It is what domainXML wrote.
	p := testDomainParams()
	p.ID, p.Mark = want.ID, want
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	written := parseDomain(t, s).Metadata.XML
	for name, doc := range map[string]string{"written": written, "dumpxml": libvirtDumpXML, "metadata": libvirtGetMetadata} {
		got, ok, err := parseMark(doc)
		if err != nil || !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v, %v, %v\nwant %+v", name, got, ok, err, want)
		}
	}
}

func TestMark_addresses(t *testing.T) {
	m := testMark("p1")
	egress := []netip.Addr{netip.MustParseAddr("198.18.101.5"), netip.MustParseAddr("2001:db8:101::5")}
	m.Egress, m.Addr = egress, egress[0]
	s, err := m.xml()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<proxyfleet:egress>198.18.101.5</proxyfleet:egress><proxyfleet:egress>2001:db8:101::5</proxyfleet:egress>",
		"<proxyfleet:addr>198.18.101.5</proxyfleet:addr>",
	} {
		if !strings.Contains(s, want) {
			t.Fatalf("no %s in\n%s", want, s)
		}
	}
	got, ok, err := parseMark(s)
	if err != nil || !ok || !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip: %#v %v %v, want %#v", got, ok, err, m)
	}
	in := got.instance()
	if !reflect.DeepEqual(in.Egress, egress) || !got.static() {
		t.Fatalf("instance egress %v, static %v", in.Egress, got.static())
	}
	// As libvirt may hand it back: re-indented, prefix stripped.
	again, ok, err := parseMark(`<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-11-30T07:01:02Z</createdAt>
	  <egress>
	    2001:db8::5
	  </egress>
	  <addr> 2001:db8::5 </addr>
	</mark>`)
	if err != nil || !ok || again.Addr != netip.MustParseAddr("2001:db8::5") || !reflect.DeepEqual(again.Egress, []netip.Addr{netip.MustParseAddr("2001:db8::5")}) {
		t.Fatalf("indented: %#v %v %v", again, ok, err)
	}

	// A mark without addresses (every mark before plans) is as before: no
	// elements written, none read, a DHCP proxy.
	old := testMark("p1")
	s, _ = old.xml()
	if strings.Contains(s, "egress") || strings.Contains(s, "addr") {
		t.Fatalf("a mark without addresses writes them:\n%s", s)
	}
	got, ok, err = parseMark(s)
	if err != nil || !ok || !reflect.DeepEqual(got, old) || got.static() || got.instance().Egress != nil {
		t.Fatalf("old mark: %#v %v %v", got, ok, err)
	}

	for name, f := range map[string]func(*mark){
		"addr not egress":     func(m *mark) { m.Addr = netip.MustParseAddr("198.18.101.77") },
		"no addr":             func(m *mark) { m.Addr = netip.Addr{} },
		"addr without egress": func(m *mark) { m.Egress = nil },
		"egress twice":        func(m *mark) { m.Egress = append(m.Egress, m.Egress[0]) },
		"zone":                func(m *mark) { m.Egress[1] = netip.MustParseAddr("fe80::1%eth0") },
		"invalid egress":      func(m *mark) { m.Egress[1] = netip.Addr{} },
	} {
		m := testMark("p1")
		m.Egress, m.Addr = slices.Clone(egress), egress[0]
		f(&m)
		if s, err := m.xml(); err == nil {
			t.Errorf("%s: written as %s", name, s)
		}
	}
	const head = `<mark><owner>proxyfleet</owner><id>p1</id><createdAt>2026-11-30T07:01:02Z</createdAt>`
	for name, body := range map[string]string{
		"addr not egress": `<egress>198.18.101.5</egress><addr>198.18.101.6</addr>`,
		"no addr":         `<egress>198.18.101.5</egress>`,
		"addr alone":      `<addr>198.18.101.5</addr>`,
		"bad egress":      `<egress>198.18.101.256</egress><addr>198.18.101.5</addr>`,
		"bad addr":        `<egress>198.18.101.5</egress><addr>x</addr>`,
		"zone":            `<egress>fe80::1%eth0</egress><addr>fe80::1%eth0</addr>`,
		"twice":           `<egress>198.18.101.5</egress><egress>198.18.101.5</egress><addr>198.18.101.5</addr>`,
	} {
		if m, ok, err := parseMark(head + body + `</mark>`); err == nil {
			t.Errorf("%s: read as %#v (ours %v)", name, m, ok)
		}
	}
}
