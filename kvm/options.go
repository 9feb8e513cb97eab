package kvm

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// What the package takes: the options of one host entry's provider, with
// their defaults in this file and nowhere else. The zero value of any field
// that has a default means the default; Validate names the first bad field.

// Defaults of HostOptions, ImageSource and SSHConfig.
const (
	DefaultSocket     = "/run/libvirt/libvirt-sock" // libvirtd's read-write socket on a host
	DefaultURI        = string(libvirt.QEMUSystem)  // the libvirt URI opened on a host's daemon
	DefaultPool       = "default"                   // storage pool of a host entry's volumes
	DefaultNetwork    = "default"                   // libvirt network proxies are attached to
	DefaultDomainType = DomainKVM
	DefaultFormat     = "qcow2" // of an image's disk: "qcow2" or "raw"
	// DefaultKeepaliveTimeout is how long an SSH keepalive may wait for
	// its reply before the link is killed.
	DefaultKeepaliveTimeout = 10 * time.Second
)

// Hypervisor types a host may run domains as (HostOptions.DomainType).
const (
	DomainKVM  = "kvm"  // production: hardware virtualization
	DomainQEMU = "qemu" // TCG emulation: the test host, where nested KVM hangs
)

// Budgets are the time limits of one host's links. Zero fields take
// DefaultBudgets.
type Budgets struct {
	// Call bounds one libvirt call on the shared link.
	Call time.Duration
	// Connect bounds a dial: TCP, SSH handshake, socket forward and the
	// libvirt connect-open.
	Connect time.Duration
	// TransferStall is how long a transfer may move no bytes before its
	// dedicated link is killed.
	TransferStall time.Duration
	// Close bounds Close and the close of a dedicated link.
	Close time.Duration
	// Keepalive is how often the SSH client asks the host for a reply; a
	// reply missing for DefaultKeepaliveTimeout kills the link. Negative
	// disables keepalives.
	Keepalive time.Duration
}

// DefaultBudgets are used for the zero fields of Budgets.
var DefaultBudgets = Budgets{
	Call:          30 * time.Second,
	Connect:       10 * time.Second,
	TransferStall: 30 * time.Second,
	Close:         5 * time.Second,
	Keepalive:     10 * time.Second,
}

// WithDefaults returns b with its zero fields (and, but for Keepalive,
// its negative ones) set from DefaultBudgets.
func (b Budgets) WithDefaults() Budgets {
	for _, f := range []struct{ v, def *time.Duration }{
		{&b.Call, &DefaultBudgets.Call}, {&b.Connect, &DefaultBudgets.Connect},
		{&b.TransferStall, &DefaultBudgets.TransferStall}, {&b.Close, &DefaultBudgets.Close},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	if b.Keepalive == 0 {
		b.Keepalive = DefaultBudgets.Keepalive
	}
	return b
}

// HostOptions is one host entry: how to reach its libvirtd and where its
// proxies go. Two entries may name one daemon; each sees only what it made.
type HostOptions struct {
	// Name is the entry's name (lowercase letters, digits and '-'): every
	// mark and cached volume carries it, and every error names it.
	Name string
	// Address is host:port of the host's sshd. User logs in with the
	// private key in KeyFile. KnownHosts is an OpenSSH known_hosts file
	// that must hold the host's key: there is no way to skip the check.
	Address, User, KeyFile, KnownHosts string
	// Socket is libvirtd's socket on the host; empty: DefaultSocket.
	Socket string
	// URI is opened on the host's daemon; empty: DefaultURI.
	URI string
	// Pool holds the entry's volumes; empty: DefaultPool.
	Pool string
	// Network is the libvirt network proxies attach to; empty:
	// DefaultNetwork.
	Network string
	// DomainType is DomainKVM or DomainQEMU; empty: DefaultDomainType.
	DomainType string
	// Budgets bound every call to the host.
	Budgets Budgets
}

// WithDefaults returns h with every empty field that has a default set.
func (h HostOptions) WithDefaults() HostOptions {
	for _, f := range []struct {
		v   *string
		def string
	}{
		{&h.Socket, DefaultSocket}, {&h.URI, DefaultURI}, {&h.Pool, DefaultPool},
		{&h.Network, DefaultNetwork}, {&h.DomainType, DefaultDomainType},
	} {
		if *f.v == "" {
			*f.v = f.def
		}
	}
	h.Budgets = h.Budgets.WithDefaults()
	return h
}

// linkConfig is the configuration of the entry's links.
func (h HostOptions) linkConfig() LinkConfig {
	return LinkConfig{
		SSH: SSHConfig{
			Host: h.Name, Address: h.Address, User: h.User, KeyFile: h.KeyFile,
			KnownHostsFile: h.KnownHosts, Socket: h.Socket,
		},
		URI:     h.URI,
		Budgets: h.Budgets,
	}
}

// ImageSource is a base image proxies boot from: a disk, and optionally
// the kernel and initrd of a direct kernel boot, each fetched by URL
// (file://, http:// or https://) and checked by its sha256.
type ImageSource struct {
	Name   string
	URL    string
	SHA256 string
	// Format of the disk: "qcow2" or "raw"; empty: DefaultFormat.
	Format  string
	Kernel  *ArtifactSource // nil: the disk boots itself
	Initrd  *ArtifactSource // only with a Kernel
	Cmdline string          // the kernel's command line
}

// ArtifactSource is a file fetched by URL and checked by its sha256.
type ArtifactSource struct {
	URL    string
	SHA256 string
}

// WithDefaults returns im with its empty Format set.
func (im ImageSource) WithDefaults() ImageSource {
	if im.Format == "" {
		im.Format = DefaultFormat
	}
	return im
}

// Options of the provider of one host entry (New).
type Options struct {
	Host HostOptions
	// Images proxies may boot from, by name.
	Images []ImageSource
	// UserData is the text/template of every proxy's cloud-init
	// user-data (see userData); empty: the default one, which sets the
	// hostname and configures the guest's proxy server from Proxy.
	UserData string
	// Proxy configures the guests' proxy servers: port, credential,
	// allow-list, the destinations refused. Validate refuses proxies
	// open to anyone unless Proxy.Open says so.
	Proxy  GuestProxy
	Logger *slog.Logger     // nil: slog.Default()
	Now    func() time.Time // stamps marks; nil: time.Now
	// OnProgress, if set, hears of base image transfers. It must not
	// block.
	OnProgress func(Progress)
	// Link overrides the link built from Host (tests).
	Link *LinkConfig
	// Hooks run at named points of a create (tests stage crashes there).
	Hooks Hooks
	// Observer hears the links' calls, dials, deaths and overruns and
	// the image bytes uploaded, for metrics; nil: nothing hears them.
	// It is given to Link too when Link has none.
	Observer Observer
}

// Hooks are called at named points of Create. A hook that returns an error
// fails the create there, as a crash would leave it (no clean-up runs).
type Hooks struct {
	// AfterOverlay runs after the overlay and seed volumes are made,
	// before the domain is defined.
	AfterOverlay func(id string) error
	// AfterDefine runs after the domain is defined, before it is started.
	AfterDefine func(id string) error
}

// WithDefaults returns o with every zero field that has a default set,
// in its host entry and its images too.
func (o Options) WithDefaults() Options {
	o.Host = o.Host.WithDefaults()
	o.Images = append([]ImageSource(nil), o.Images...)
	for i := range o.Images {
		o.Images[i] = o.Images[i].WithDefaults()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	return o
}

// OptionError names a bad field of Options by its Go path
// ("Host.DomainType", "Images[1].Kernel.SHA256").
type OptionError struct {
	Field  string
	Reason string
}

func (e *OptionError) Error() string { return "kvm options: " + e.Field + ": " + e.Reason }

func badOption(field, format string, args ...any) error {
	return &OptionError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate returns the first bad field of o, after defaults, as an
// *OptionError. The SSH fields of Host are not needed when Link is set.
func (o Options) Validate() error {
	o = o.WithDefaults()
	h := o.Host
	if err := checkHostEntry(h.Name); err != nil {
		return badOption("Host.Name", "%v", err)
	}
	if o.Link == nil {
		if _, _, err := net.SplitHostPort(h.Address); err != nil {
			return badOption("Host.Address", "want host:port: %v", err)
		}
		for _, f := range []struct{ name, v string }{
			{"Host.User", h.User}, {"Host.KeyFile", h.KeyFile}, {"Host.KnownHosts", h.KnownHosts},
		} {
			if f.v == "" {
				return badOption(f.name, "required")
			}
		}
	}
	if h.DomainType != DomainKVM && h.DomainType != DomainQEMU {
		return badOption("Host.DomainType", "%q is not %s or %s", h.DomainType, DomainKVM, DomainQEMU)
	}
	if err := o.Proxy.validate(); err != nil {
		return err
	}
	if o.UserData != "" {
		// A template that does not parse, or names a field there is
		// not, stops the provider now rather than failing every create.
		if _, err := userData(o.UserData, o.Proxy, "p1", "p1", fleet.Network{}); err != nil {
			return badOption("UserData", "%v", err)
		}
	}
	seen := map[string]bool{}
	for i, im := range o.Images {
		f := fmt.Sprintf("Images[%d]", i)
		if !messages.ValidID(im.Name) {
			return badOption(f+".Name", "%q is not a valid image name", im.Name)
		}
		if seen[im.Name] {
			return badOption(f+".Name", "%q is named twice", im.Name)
		}
		seen[im.Name] = true
		if err := checkSource(f, ArtifactSource{URL: im.URL, SHA256: im.SHA256}); err != nil {
			return err
		}
		if im.Format != "qcow2" && im.Format != "raw" {
			return badOption(f+".Format", "%q is not qcow2 or raw", im.Format)
		}
		if im.Initrd != nil && im.Kernel == nil {
			return badOption(f+".Initrd", "needs a Kernel")
		}
		for _, a := range []struct {
			f string
			a *ArtifactSource
		}{{f + ".Kernel", im.Kernel}, {f + ".Initrd", im.Initrd}} {
			if a.a == nil {
				continue
			}
			if err := checkSource(a.f, *a.a); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSource checks an artifact's URL and digest.
func checkSource(f string, a ArtifactSource) error {
	if _, err := sourceKind(a.URL); err != nil {
		return badOption(f+".URL", "%v", err)
	}
	if !isHex(strings.ToLower(a.SHA256)) || len(a.SHA256) != 64 {
		return badOption(f+".SHA256", "want 64 hex digits")
	}
	return nil
}
