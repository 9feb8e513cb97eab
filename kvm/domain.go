package kvm

import (
	"errors"
	"fmt"
	"net"
	"unicode/utf8"

	"libvirt.org/go/libvirtxml"
)

// Domain and volume XML.
//
// Everything here is built as libvirtxml values and marshalled by
// encoding/xml, never by string concatenation (DESIGN.md, semantics 7): ids,
// labels, command ids and config values reach these documents, and only an
// encoder escapes them correctly every time. Nothing here does I/O; the
// paths of volumes are looked up by the caller and passed in.

// agentChannel is the virtio-serial port name the QEMU guest agent (and the
// test guest's agent) listens on; libvirt's agent address source talks to it.
const agentChannel = "org.qemu.guest_agent.0"

// diskRef says where a disk's data is: a path on the host, or a volume in a
// libvirt pool. Exactly one of Path and Volume is set.
type diskRef struct {
	Path   string
	Pool   string
	Volume string
}

func (r diskRef) source() (*libvirtxml.DomainDiskSource, error) {
	switch {
	case r.Path != "" && r.Volume == "":
		return &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: r.Path}}, nil
	case r.Path == "" && r.Volume != "" && r.Pool != "":
		return &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: r.Pool, Volume: r.Volume}}, nil
	}
	return nil, fmt.Errorf("want a path or a pool and volume, have %+v", r)
}

// domainParams is everything one domain's XML depends on.
type domainParams struct {
	// Type is the host's domain_type: "kvm" or "qemu".
	Type      string
	ID        string // proxy id; the domain is named domainName(ID)
	CPUs      int
	MemoryMiB int
	// Network is the host's libvirt network the proxy's interface joins.
	Network string
	// MAC is the interface's hardware address in canonical form (lowercase,
	// colon-separated, as checkNetwork leaves it); "" lets libvirt choose.
	MAC string
	// Disk is the proxy's qcow2 overlay (vda); Seed is its NoCloud seed ISO
	// (vdb, read-only, raw).
	Disk diskRef
	Seed diskRef
	// Kernel and Initrd are paths on the host of the image's kernel and
	// initrd volumes, for direct kernel boot; empty Kernel boots the disk.
	Kernel  string
	Initrd  string
	Cmdline string
	// ConsoleLog, if set, is a file on the host the serial console is also
	// written to, for post-mortems of guests that never got an address.
	ConsoleLog string
	// CPUMode overrides the CPU mode chosen from Type (see cpuFor).
	CPUMode string
	Mark    mark
}

// domainXML returns the domain definition for p.
//
// Choices and why:
//   - on_crash is destroy: a crashed proxy is reported failed (fleet.Instance)
//     and replaced by the executor, not restarted in place by libvirt.
//   - on_poweroff is destroy and on_reboot restart, libvirt's defaults, spelled
//     out so the definition says what a guest's own reboot does.
//   - a serial console with a <console> on it: the kernel's console=ttyS0
//     lands there, so `virsh console` works and ConsoleLog can keep it.
//   - the guest-agent channel is a unix socket libvirt creates itself (no
//     path given), so two domains never fight over a path.
//   - ACPI and APIC, so a graceful shutdown (virDomainShutdown) reaches the
//     guest.
//   - no graphics, no sound, no USB tablet: a proxy has no screen.
//   - the interface carries MAC when one is given (a static network: its
//     seed's network-config finds the interface by it); without one the
//     definition has no <mac> and libvirt chooses, as for a DHCP network.
func domainXML(p domainParams) (string, error) {
	if err := checkID(p.ID); err != nil {
		return "", fmt.Errorf("domain xml: %w", err)
	}
	if p.Type != DomainKVM && p.Type != DomainQEMU {
		return "", fmt.Errorf("domain xml: domain type %q is not kvm or qemu", p.Type)
	}
	if p.CPUs < 1 || p.MemoryMiB < 1 {
		return "", fmt.Errorf("domain xml: %d cpus, %d MiB: both must be positive", p.CPUs, p.MemoryMiB)
	}
	if p.Network == "" {
		return "", errors.New("domain xml: no network")
	}
	if p.MAC != "" {
		if hw, err := net.ParseMAC(p.MAC); err != nil || len(hw) != 6 || hw.String() != p.MAC {
			return "", fmt.Errorf("domain xml: mac %q is not a canonical 48-bit ethernet address", p.MAC)
		}
	}
	if p.Kernel == "" && (p.Initrd != "" || p.Cmdline != "") {
		return "", errors.New("domain xml: initrd or cmdline without a kernel")
	}
	for _, f := range []struct{ name, v string }{
		{"network", p.Network}, {"disk path", p.Disk.Path}, {"disk pool", p.Disk.Pool}, {"disk volume", p.Disk.Volume},
		{"seed path", p.Seed.Path}, {"seed pool", p.Seed.Pool}, {"seed volume", p.Seed.Volume},
		{"kernel", p.Kernel}, {"initrd", p.Initrd}, {"cmdline", p.Cmdline},
		{"console log", p.ConsoleLog}, {"cpu mode", p.CPUMode},
	} {
		if !xmlText(f.v) {
			return "", fmt.Errorf("domain xml: %s %q has characters XML cannot carry", f.name, f.v)
		}
	}
	if p.Mark.ID != p.ID {
		return "", fmt.Errorf("domain xml: mark for %q on proxy %q", p.Mark.ID, p.ID)
	}
	markXML, err := p.Mark.xml()
	if err != nil {
		return "", fmt.Errorf("domain xml: %w", err)
	}
	disk, err := p.Disk.source()
	if err != nil {
		return "", fmt.Errorf("domain xml: disk: %w", err)
	}
	seed, err := p.Seed.source()
	if err != nil {
		return "", fmt.Errorf("domain xml: seed: %w", err)
	}

	boot := &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}
	if p.Kernel != "" {
		boot.Kernel, boot.Initrd, boot.Cmdline = p.Kernel, p.Initrd, p.Cmdline
	} else {
		boot.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}

	port0 := uint(0)
	var log *libvirtxml.DomainChardevLog
	if p.ConsoleLog != "" {
		log = &libvirtxml.DomainChardevLog{File: p.ConsoleLog, Append: "on"}
	}

	var mac *libvirtxml.DomainInterfaceMAC
	if p.MAC != "" {
		mac = &libvirtxml.DomainInterfaceMAC{Address: p.MAC}
	}

	d := libvirtxml.Domain{
		Type:     p.Type,
		Name:     domainName(p.ID),
		Metadata: &libvirtxml.DomainMetadata{XML: markXML},
		Memory:   &libvirtxml.DomainMemory{Value: uint(p.MemoryMiB), Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Placement: "static", Value: uint(p.CPUs)},
		OS:       boot,
		Features: &libvirtxml.DomainFeatureList{
			ACPI: &libvirtxml.DomainFeature{},
			APIC: &libvirtxml.DomainFeatureAPIC{},
		},
		CPU:        cpuFor(p.Type, p.CPUMode),
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
					Source: disk,
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				},
				{
					// A disk, not a cdrom: the test guest finds its seed by
					// trying /dev/vd*, and a virtio cdrom does not exist.
					Device:   "disk",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Source:   seed,
					Target:   &libvirtxml.DomainDiskTarget{Dev: "vdb", Bus: "virtio"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Interfaces: []libvirtxml.DomainInterface{{
				MAC: mac,
				Source: &libvirtxml.DomainInterfaceSource{
					Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: p.Network},
				},
				Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"},
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port0},
				Log:    log,
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port0},
			}},
			Channels: []libvirtxml.DomainChannel{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
				Target: &libvirtxml.DomainChannelTarget{
					VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: agentChannel},
				},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
	s, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("domain xml: %w", err)
	}
	return s, nil
}

// xmlText reports whether XML 1.0 can carry s: valid UTF-8 of the
// characters XML allows. encoding/xml escapes tab, CR and LF, so those read
// back unchanged; anything else outside XML's range it would silently drop
// or replace with U+FFFD, and the definition would name another network,
// file or pool than the one configured. Such values are refused.
func xmlText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == '\t', r == '\n', r == '\r':
		case r < 0x20, r >= 0xD800 && r <= 0xDFFF, r == 0xFFFE, r == 0xFFFF:
			return false
		}
	}
	return true
}

// cpuFor picks the guest CPU. host-passthrough gives a kvm guest the host's
// CPU as is, the fastest choice for a proxy that never migrates; under TCG
// there is no host CPU to pass through, and on the test host asking for it
// crashes QEMU ("failed to set MSR", TESTHOST.md), so a qemu domain gets
// QEMU's own generic model, which TCG always emulates. override, if set,
// is used as the mode instead ("host-model", "maximum", ...).
func cpuFor(domainType, override string) *libvirtxml.DomainCPU {
	mode := override
	if mode == "" {
		mode = "custom"
		if domainType == DomainKVM {
			mode = "host-passthrough"
		}
	}
	if mode != "custom" {
		return &libvirtxml.DomainCPU{Mode: mode, Check: "none"}
	}
	return &libvirtxml.DomainCPU{Mode: "custom", Match: "exact", Check: "none",
		Model: &libvirtxml.DomainCPUModel{Fallback: "allow", Value: "qemu64"}}
}

// overlayVolumeXML returns the definition of proxy id's disk: a qcow2 volume
// whose backing store is the cached base image at basePath in baseFormat.
// capacityBytes is the guest-visible size; it must be at least the base
// image's virtual size, which the caller reads from the base volume. The
// backing format is always given: without it QEMU would probe the base's
// format, which lets a raw image that looks like qcow2 name files of its own.
func overlayVolumeXML(id string, capacityBytes uint64, basePath, baseFormat string) (string, error) {
	if err := checkID(id); err != nil {
		return "", fmt.Errorf("overlay volume xml: %w", err)
	}
	if basePath == "" {
		return "", errors.New("overlay volume xml: no base path")
	}
	if !xmlText(basePath) {
		return "", fmt.Errorf("overlay volume xml: base path %q has characters XML cannot carry", basePath)
	}
	if baseFormat != "qcow2" && baseFormat != "raw" {
		return "", fmt.Errorf("overlay volume xml: base format %q is not qcow2 or raw", baseFormat)
	}
	if capacityBytes == 0 {
		return "", errors.New("overlay volume xml: zero capacity")
	}
	v := libvirtxml.StorageVolume{
		Name:       overlayVolumeName(id),
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacityBytes},
		Target: &libvirtxml.StorageVolumeTarget{
			Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"},
		},
		BackingStore: &libvirtxml.StorageVolumeBackingStore{
			Path:   basePath,
			Format: &libvirtxml.StorageVolumeTargetFormat{Type: baseFormat},
		},
	}
	s, err := v.Marshal()
	if err != nil {
		return "", fmt.Errorf("overlay volume xml: %w", err)
	}
	return s, nil
}

// plainVolumeXML returns the definition of a volume that an upload fills: a
// base image, a kernel, an initrd or a seed ISO. name must be one of ours
// (parseVolumeName) of a kind that is uploaded, so that a sweep can find the
// volume again; format is "raw" or "qcow2"; capacityBytes is the size of
// what will be uploaded.
func plainVolumeXML(name string, capacityBytes uint64, format string) (string, error) {
	v, ok := parseVolumeName(name)
	if !ok || v.Kind == kindOverlay {
		return "", fmt.Errorf("volume xml: %q is not the name of an uploaded volume of ours", name)
	}
	if format != "raw" && format != "qcow2" {
		return "", fmt.Errorf("volume xml: format %q is not raw or qcow2", format)
	}
	if v.Kind == kindBase && v.Format != format {
		return "", fmt.Errorf("volume xml: %q named %s, created as %s", name, v.Format, format)
	}
	if capacityBytes == 0 {
		return "", errors.New("volume xml: zero capacity")
	}
	vol := libvirtxml.StorageVolume{
		Name:       name,
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacityBytes},
		Target: &libvirtxml.StorageVolumeTarget{
			Format: &libvirtxml.StorageVolumeTargetFormat{Type: format},
		},
	}
	s, err := vol.Marshal()
	if err != nil {
		return "", fmt.Errorf("volume xml: %w", err)
	}
	return s, nil
}
