package kvm

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

func testDomainParams() domainParams {
	return domainParams{
		Type:      "qemu",
		ID:        "p1",
		CPUs:      2,
		MemoryMiB: 256,
		Network:   "pfnet",
		Disk:      diskRef{Path: "/var/lib/libvirt/images/pf-p1-disk.qcow2"},
		Seed:      diskRef{Path: "/var/lib/libvirt/images/pf-p1-seed.iso"},
		Kernel:    "/var/lib/libvirt/images/pf-kernel-h1-0123456789abcdef",
		Initrd:    "/var/lib/libvirt/images/pf-initrd-h1-0123456789abcdef",
		Cmdline:   "console=ttyS0 quiet",
		Mark:      testMark("p1"),
	}
}

func parseDomain(t *testing.T, s string) libvirtxml.Domain {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(s); err != nil {
		t.Fatalf("unmarshal: %v\n%s", err, s)
	}
	return d
}

func TestDomain_fields(t *testing.T) {
	p := testDomainParams()
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	d := parseDomain(t, s)
	if d.Type != "qemu" || d.Name != "pf-p1" {
		t.Fatalf("type %q name %q", d.Type, d.Name)
	}
	if d.Memory == nil || d.Memory.Value != 256 || d.Memory.Unit != "MiB" {
		t.Fatalf("memory %+v", d.Memory)
	}
	if d.VCPU == nil || d.VCPU.Value != 2 {
		t.Fatalf("vcpu %+v", d.VCPU)
	}
	if d.OnCrash != "destroy" {
		t.Fatalf("on_crash %q", d.OnCrash)
	}
	if d.OS == nil || d.OS.Type == nil || d.OS.Type.Type != "hvm" {
		t.Fatalf("os %+v", d.OS)
	}
	if d.OS.Kernel != p.Kernel || d.OS.Initrd != p.Initrd || d.OS.Cmdline != p.Cmdline || len(d.OS.BootDevices) != 0 {
		t.Fatalf("direct kernel boot: %+v", d.OS)
	}
	if d.CPU == nil || d.CPU.Mode == "host-passthrough" {
		t.Fatalf("qemu domain with cpu %+v (host-passthrough crashes TCG on the test host)", d.CPU)
	}

	dev := d.Devices
	if dev == nil || len(dev.Disks) != 2 {
		t.Fatalf("devices %+v", dev)
	}
	vda, vdb := dev.Disks[0], dev.Disks[1]
	if vda.Target.Dev != "vda" || vda.Target.Bus != "virtio" || vda.Driver.Type != "qcow2" ||
		vda.Source.File == nil || vda.Source.File.File != p.Disk.Path || vda.ReadOnly != nil {
		t.Fatalf("vda %+v %+v %+v", vda.Target, vda.Driver, vda.Source)
	}
	if vdb.Target.Dev != "vdb" || vdb.Target.Bus != "virtio" || vdb.Driver.Type != "raw" || vdb.Device != "disk" ||
		vdb.Source.File == nil || vdb.Source.File.File != p.Seed.Path || vdb.ReadOnly == nil {
		t.Fatalf("vdb (seed) %+v %+v %+v readonly=%v", vdb.Target, vdb.Driver, vdb.Source, vdb.ReadOnly)
	}

	if len(dev.Interfaces) != 1 {
		t.Fatalf("interfaces %+v", dev.Interfaces)
	}
	ifc := dev.Interfaces[0]
	if ifc.Source == nil || ifc.Source.Network == nil || ifc.Source.Network.Network != "pfnet" || ifc.Model == nil || ifc.Model.Type != "virtio" {
		t.Fatalf("interface %+v", ifc)
	}

	if len(dev.Serials) != 1 || dev.Serials[0].Source == nil || dev.Serials[0].Source.Pty == nil {
		t.Fatalf("serial %+v", dev.Serials)
	}
	if len(dev.Consoles) != 1 || dev.Consoles[0].Target == nil || dev.Consoles[0].Target.Type != "serial" {
		t.Fatalf("console %+v", dev.Consoles)
	}

	if len(dev.Channels) != 1 {
		t.Fatalf("channels %+v", dev.Channels)
	}
	ch := dev.Channels[0]
	if ch.Source == nil || ch.Source.UNIX == nil || ch.Target == nil || ch.Target.VirtIO == nil || ch.Target.VirtIO.Name != "org.qemu.guest_agent.0" {
		t.Fatalf("agent channel %+v", ch)
	}
	if !strings.Contains(s, "<channel type=\"unix\">") {
		t.Fatalf("agent channel is not type unix:\n%s", s)
	}

	if d.Metadata == nil {
		t.Fatal("no metadata")
	}
	m, ok, err := parseMark(d.Metadata.XML)
	if err != nil || !ok || !reflect.DeepEqual(m, p.Mark) {
		t.Fatalf("mark from <metadata>: %+v %v %v", m, ok, err)
	}
	// And from the whole document, as virDomainGetXMLDesc gives it.
	if m, ok, err := parseMark(s); err != nil || !ok || !reflect.DeepEqual(m, p.Mark) {
		t.Fatalf("mark from the domain: %+v %v %v", m, ok, err)
	}
}

func TestDomain_bootFromDiskAndKVM(t *testing.T) {
	p := testDomainParams()
	p.Type, p.Kernel, p.Initrd, p.Cmdline = "kvm", "", "", ""
	p.Disk = diskRef{Pool: "default", Volume: overlayVolumeName("p1")}
	p.Seed = diskRef{Pool: "default", Volume: seedVolumeName("p1")}
	p.ConsoleLog = "/var/log/libvirt/qemu/pf-p1-console.log"
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	d := parseDomain(t, s)
	if d.Type != "kvm" || d.OS.Kernel != "" || len(d.OS.BootDevices) != 1 || d.OS.BootDevices[0].Dev != "hd" {
		t.Fatalf("type %q os %+v", d.Type, d.OS)
	}
	if d.CPU == nil || d.CPU.Mode != "host-passthrough" {
		t.Fatalf("kvm cpu %+v", d.CPU)
	}
	for i, want := range []string{"pf-p1-disk.qcow2", "pf-p1-seed.iso"} {
		src := d.Devices.Disks[i].Source
		if src == nil || src.Volume == nil || src.Volume.Pool != "default" || src.Volume.Volume != want {
			t.Fatalf("disk %d source %+v", i, src)
		}
	}
	if l := d.Devices.Serials[0].Log; l == nil || l.File != p.ConsoleLog {
		t.Fatalf("console log %+v", l)
	}

	p.CPUMode = "host-model"
	s, _ = domainXML(p)
	if d := parseDomain(t, s); d.CPU.Mode != "host-model" {
		t.Fatalf("cpu override %+v", d.CPU)
	}
}

func TestDomain_rejectsBadParams(t *testing.T) {
	for name, f := range map[string]func(*domainParams){
		"bad id":                 func(p *domainParams) { p.ID = "p1</name><name>x"; p.Mark.ID = p.ID },
		"type xen":               func(p *domainParams) { p.Type = "xen" },
		"no cpus":                func(p *domainParams) { p.CPUs = 0 },
		"negative memory":        func(p *domainParams) { p.MemoryMiB = -1 },
		"no network":             func(p *domainParams) { p.Network = "" },
		"initrd, no kernel":      func(p *domainParams) { p.Kernel = "" },
		"mark of another id":     func(p *domainParams) { p.Mark.ID = "p2" },
		"no disk":                func(p *domainParams) { p.Disk = diskRef{} },
		"path and volume":        func(p *domainParams) { p.Seed.Pool, p.Seed.Volume = "default", "v" },
		"volume, no pool":        func(p *domainParams) { p.Seed = diskRef{Volume: "v"} },
		"createdAt not RFC 3339": func(p *domainParams) { p.Mark.CreatedAt = p.Mark.CreatedAt.AddDate(-3000, 0, 0) },
	} {
		p := testDomainParams()
		f(&p)
		if s, err := domainXML(p); err == nil {
			t.Errorf("%s: accepted:\n%s", name, s)
		}
	}
}

// Everything that comes from outside (labels and command id via the mark,
// config values like the network, paths and the cmdline) is escaped by the
// encoder: the document has exactly the structure we built, and every value
// reads back unchanged.
func TestDomain_hostileValuesCannotInject(t *testing.T) {
	p := testDomainParams()
	evil := `'"/><devices><hostdev mode='subsystem'/></devices><name>x</name><!-- &amp; ]]>`
	p.Mark.CommandID = evil
	p.Mark.Labels = map[string]string{"inject": evil, "nl": "a\n</metadata>"}
	p.Network = evil
	p.Cmdline = "console=ttyS0 " + evil
	p.Disk.Path = "/pool/" + evil
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	d := parseDomain(t, s)
	if d.Name != "pf-p1" || len(d.Devices.Hostdevs) != 0 || len(d.Devices.Disks) != 2 || len(d.Devices.Interfaces) != 1 {
		t.Fatalf("structure changed: name %q, %d hostdevs, %d disks\n%s", d.Name, len(d.Devices.Hostdevs), len(d.Devices.Disks), s)
	}
	if strings.Contains(s, "<hostdev") || strings.Contains(s, "<!--") {
		t.Fatalf("a value became markup:\n%s", s)
	}
	if d.Devices.Interfaces[0].Source.Network.Network != evil || d.OS.Cmdline != p.Cmdline || d.Devices.Disks[0].Source.File.File != p.Disk.Path {
		t.Fatalf("values changed:\n%s", s)
	}
	m, ok, err := parseMark(s)
	if err != nil || !ok || !reflect.DeepEqual(m, p.Mark) {
		t.Fatalf("mark %+v %v %v", m, ok, err)
	}
}

func TestVolume_overlay(t *testing.T) {
	s, err := overlayVolumeXML("p1", 2<<30, "/var/lib/libvirt/images/pf-base-h1-0123456789abcdef.qcow2", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	var v libvirtxml.StorageVolume
	if err := v.Unmarshal(s); err != nil {
		t.Fatal(err)
	}
	if v.Name != "pf-p1-disk.qcow2" || v.Capacity == nil || v.Capacity.Value != 2<<30 || v.Capacity.Unit != "bytes" {
		t.Fatalf("name %q capacity %+v", v.Name, v.Capacity)
	}
	if v.Target == nil || v.Target.Format == nil || v.Target.Format.Type != "qcow2" {
		t.Fatalf("target %+v", v.Target)
	}
	if b := v.BackingStore; b == nil || b.Path != "/var/lib/libvirt/images/pf-base-h1-0123456789abcdef.qcow2" || b.Format == nil || b.Format.Type != "qcow2" {
		t.Fatalf("backing store %+v", v.BackingStore)
	}
	for name, err := range map[string]error{
		"bad id":      second(overlayVolumeXML("../p1", 1, "/b", "qcow2")),
		"no base":     second(overlayVolumeXML("p1", 1, "", "qcow2")),
		"base format": second(overlayVolumeXML("p1", 1, "/b", "vmdk")),
		"zero size":   second(overlayVolumeXML("p1", 0, "/b", "raw")),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestVolume_plain(t *testing.T) {
	base, _ := baseVolumeName("h1", testSHA, "raw")
	kernel, _ := kernelVolumeName("h1", testSHA)
	for _, c := range []struct{ name, format string }{
		{base, "raw"}, {kernel, "raw"}, {seedVolumeName("p1"), "raw"},
	} {
		s, err := plainVolumeXML(c.name, 12345, c.format)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var v libvirtxml.StorageVolume
		if err := v.Unmarshal(s); err != nil {
			t.Fatal(err)
		}
		if v.Name != c.name || v.Capacity.Value != 12345 || v.Target.Format.Type != c.format || v.BackingStore != nil {
			t.Fatalf("%s: %+v", c.name, v)
		}
	}
	for name, err := range map[string]error{
		"not ours":        second(plainVolumeXML("debian.qcow2", 1, "qcow2")),
		"overlay name":    second(plainVolumeXML(overlayVolumeName("p1"), 1, "qcow2")),
		"format mismatch": second(plainVolumeXML(base, 1, "qcow2")),
		"bad format":      second(plainVolumeXML(kernel, 1, "iso")),
		"zero size":       second(plainVolumeXML(kernel, 0, "raw")),
		"injection":       second(plainVolumeXML("pf-p1</name><x/>-seed.iso", 1, "raw")),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The XML is valid against libvirt's own schema (virt-xml-validate from
// libvirt-clients, and xmllint from libxml2-utils, which it runs; `make
// testhost` installs both).
func TestDomain_libvirtSchema(t *testing.T) {
	tool, err := exec.LookPath("virt-xml-validate")
	if err == nil {
		_, err = exec.LookPath("xmllint") // virt-xml-validate runs it
	}
	if err != nil {
		t.Fatalf("schema check needs virt-xml-validate and xmllint (make testhost installs them): %v", err)
	}
	dir := t.TempDir()
	p := testDomainParams()
	p.ConsoleLog = "/tmp/console.log"
	dom, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Type, p.Kernel, p.Initrd, p.Cmdline = "kvm", "", "", ""
	p.Disk = diskRef{Pool: "default", Volume: overlayVolumeName("p1")}
	p.Seed = diskRef{Pool: "default", Volume: seedVolumeName("p1")}
	dom2, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	p.MAC = "52:54:00:12:34:56"
	p.Mark.Egress = []netip.Addr{netip.MustParseAddr("198.18.101.5"), netip.MustParseAddr("2001:db8:101::5")}
	p.Mark.Addr = p.Mark.Egress[0]
	dom3, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	ov, _ := overlayVolumeXML("p1", 1<<30, "/b.qcow2", "qcow2")
	pv, _ := plainVolumeXML(seedVolumeName("p1"), 4096, "raw")
	for _, c := range []struct{ file, schema, doc string }{
		{"d1.xml", "domain", dom}, {"d2.xml", "domain", dom2}, {"d3.xml", "domain", dom3},
		{"v1.xml", "storagevol", ov}, {"v2.xml", "storagevol", pv},
	} {
		f := filepath.Join(dir, c.file)
		if err := os.WriteFile(f, []byte(c.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(tool, f, c.schema).CombinedOutput(); err != nil {
			t.Errorf("%s does not validate: %v\n%s\n%s", c.file, err, out, c.doc)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// Values XML 1.0 cannot carry (control characters, invalid UTF-8, U+FFFE)
// are refused: encoding/xml would write U+FFFD in their place, and the
// definition would name another network, file or pool than configured
// (found by FuzzDomainXML).
func TestDomain_refusesWhatXMLCannotCarry(t *testing.T) {
	for name, f := range map[string]func(*domainParams){
		"network":     func(p *domainParams) { p.Network = "pf\x01net" },
		"cmdline":     func(p *domainParams) { p.Cmdline = "console=ttyS0\x00" },
		"disk path":   func(p *domainParams) { p.Disk.Path = "/pool/\xff.qcow2" },
		"seed pool":   func(p *domainParams) { p.Seed = diskRef{Pool: "pool\ufffe", Volume: "pf-p1-seed.iso"} },
		"kernel":      func(p *domainParams) { p.Kernel = "/k\x1b" },
		"initrd":      func(p *domainParams) { p.Initrd = "/i\x7f\x00" },
		"console log": func(p *domainParams) { p.ConsoleLog = "/log\x02" },
		"cpu mode":    func(p *domainParams) { p.CPUMode = "host-model\x00" },
	} {
		p := testDomainParams()
		f(&p)
		if s, err := domainXML(p); err == nil {
			t.Errorf("%s: accepted, defined as\n%s", name, s)
		}
	}
	if s, err := overlayVolumeXML("p1", 1, "/pool/base\x01.qcow2", "qcow2"); err == nil {
		t.Errorf("overlay with a control character in its base path: accepted, defined as\n%s", s)
	}
	// Tabs, newlines and all other XML characters are escaped and read back.
	p := testDomainParams()
	p.Cmdline = "console=ttyS0\tquiet\r\n" + strings.Repeat("é𝄞", 100)
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := parseDomain(t, s); d.OS.Cmdline != p.Cmdline {
		t.Fatalf("cmdline reads back as %q, want %q", d.OS.Cmdline, p.Cmdline)
	}
}

// The zero Network leaves the domain definition exactly as it was before
// networks were planned: the golden files are domainXML's output from
// before (testDomainParams, then the disk-boot variant of
// TestDomain_bootFromDiskAndKVM).
func TestDomain_zeroNetworkIsUnchanged(t *testing.T) {
	p := testDomainParams()
	check := func(golden string, p domainParams) {
		t.Helper()
		want, err := os.ReadFile("testdata/golden/" + golden)
		if err != nil {
			t.Fatal(err)
		}
		got, err := domainXML(p)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Fatalf("%s: the definition changed:\n%s\nwant\n%s", golden, got, want)
		}
	}
	check("domain-kernel-boot.xml", p)
	p.Type, p.Kernel, p.Initrd, p.Cmdline = "kvm", "", "", ""
	p.Disk = diskRef{Pool: "default", Volume: overlayVolumeName("p1")}
	p.Seed = diskRef{Pool: "default", Volume: seedVolumeName("p1")}
	p.ConsoleLog = "/var/log/libvirt/qemu/pf-p1-console.log"
	check("domain-disk-boot.xml", p)
}

// A MAC goes onto the interface as <mac address=…/>, and only a canonical
// one (checkNetwork's form): anything else is refused, never written in
// another form than the seed matches.
func TestDomain_mac(t *testing.T) {
	p := testDomainParams()
	p.MAC = "52:54:00:ab:cd:ef"
	p.Mark.Egress = []netip.Addr{netip.MustParseAddr("198.18.101.5")}
	p.Mark.Addr = p.Mark.Egress[0]
	s, err := domainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	d := parseDomain(t, s)
	ifc := d.Devices.Interfaces[0]
	if ifc.MAC == nil || ifc.MAC.Address != p.MAC || ifc.Source.Network.Network != "pfnet" {
		t.Fatalf("interface %+v (mac %+v)", ifc, ifc.MAC)
	}
	if !strings.Contains(s, `<mac address="52:54:00:ab:cd:ef"></mac>`) {
		t.Fatalf("no <mac> element:\n%s", s)
	}
	if m, ok, err := parseMark(s); err != nil || !ok || !reflect.DeepEqual(m, p.Mark) {
		t.Fatalf("mark reads back as %#v (ours %v, %v), want %#v", m, ok, err, p.Mark)
	}
	for _, bad := range []string{"52:54:00:AB:CD:EF", "52-54-00-ab-cd-ef", "5254.00ab.cdef", "52:54:00:ab:cd", "00:00:00:00:00:00:00:01", "x", "52:54:00:ab:cd:ef\x00"} {
		p.MAC = bad
		if s, err := domainXML(p); err == nil {
			t.Errorf("mac %q accepted:\n%s", bad, s)
		}
	}
}
