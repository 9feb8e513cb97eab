package kvm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"proxyfleet/fleet"
)

const testSHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// The defaults of what kvm owns live in options.go alone, and every path
// to a link takes them from there: a host entry's options, a LinkConfig
// built by hand, and DialSSH's own SSHConfig. They are the values
// docs/CONFIGURATION.md documents (budgets: call 30s, transfer_stall 30s,
// close 5s, connect 10s, keepalive 10s), so no two paths can disagree.
func TestOptions_defaultsInOnePlace(t *testing.T) {
	want := Budgets{Call: 30 * time.Second, TransferStall: 30 * time.Second, Close: 5 * time.Second,
		Connect: 10 * time.Second, Keepalive: 10 * time.Second}
	if DefaultBudgets != want {
		t.Fatalf("DefaultBudgets = %+v, want the documented %+v", DefaultBudgets, want)
	}
	o := Options{Host: HostOptions{Name: "h1"}, Images: []ImageSource{{Name: "i"}}}.WithDefaults()
	h := o.Host
	if h.Socket != "/run/libvirt/libvirt-sock" || h.URI != "qemu:///system" || h.Pool != "default" ||
		h.Network != "default" || h.DomainType != "kvm" || h.Budgets != want {
		t.Errorf("host defaults: %+v", h)
	}
	if o.Images[0].Format != "qcow2" || o.Logger == nil || o.Now == nil {
		t.Errorf("options defaults: %+v", o)
	}
	if b := (Budgets{Keepalive: -1}).WithDefaults(); b.Keepalive != -1 {
		t.Errorf("a negative keepalive (disabled) became %s", b.Keepalive)
	}

	// A link of a host entry: its SSH dial is bounded by the connect
	// budget and keeps alive at the keepalive budget.
	for _, tc := range []struct {
		name              string
		lc                LinkConfig
		connect, keepwant time.Duration
	}{
		{"entry, defaults", HostOptions{Name: "h1", Address: "h:22"}.WithDefaults().linkConfig(), want.Connect, want.Keepalive},
		{"entry, set", HostOptions{Name: "h1", Address: "h:22", Budgets: Budgets{Connect: 3 * time.Second, Keepalive: 4 * time.Second}}.WithDefaults().linkConfig(), 3 * time.Second, 4 * time.Second},
		{"bare LinkConfig", LinkConfig{SSH: SSHConfig{Address: "h:22"}}, want.Connect, want.Keepalive},
	} {
		tc.lc.SSH.User, tc.lc.SSH.KeyFile, tc.lc.SSH.KnownHostsFile = "u", "/k", "/kh"
		k, err := NewLink(tc.lc)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		s := k.cfg.SSH
		if s.ConnectTimeout != tc.connect || s.KeepaliveInterval != tc.keepwant || s.KeepaliveTimeout != DefaultKeepaliveTimeout ||
			k.cfg.Budgets.Connect != tc.connect || k.cfg.URI != DefaultURI || s.Socket != DefaultSocket {
			t.Errorf("%s: link config %+v, want connect %s, keepalive %s", tc.name, k.cfg, tc.connect, tc.keepwant)
		}
		if err := k.Close(); err != nil {
			t.Error(err)
		}
	}
	if s := (SSHConfig{}).withDefaults(); s.ConnectTimeout != want.Connect || s.KeepaliveInterval != want.Keepalive {
		t.Errorf("DialSSH's own defaults: connect %s, keepalive %s; want %s, %s",
			s.ConnectTimeout, s.KeepaliveInterval, want.Connect, want.Keepalive)
	}
}

// Validate names the first bad field, and New refuses bad options as a
// permanent *OptionError before it makes a link.
func TestOptions_validateNamesTheField(t *testing.T) {
	good := func() Options {
		return Options{
			Host: HostOptions{Name: "h1", Address: "h:22", User: "u", KeyFile: "/k", KnownHosts: "/kh"},
			Images: []ImageSource{{Name: "i", URL: "file:///i.raw", SHA256: testSHA256, Format: "raw",
				Kernel: &ArtifactSource{URL: "https://m/k", SHA256: strings.ToUpper(testSHA256)}}},
			Proxy: testGuestProxy,
		}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Options)
	}{
		{"Host.Name", func(o *Options) { o.Host.Name = "Bad_Name" }},
		{"Host.Address", func(o *Options) { o.Host.Address = "nope" }},
		{"Host.User", func(o *Options) { o.Host.User = "" }},
		{"Host.KnownHosts", func(o *Options) { o.Host.KnownHosts = "" }},
		{"Host.DomainType", func(o *Options) { o.Host.DomainType = "xen" }},
		{"Proxy", func(o *Options) { o.Proxy = GuestProxy{} }},
		{"Proxy.Password", func(o *Options) { o.Proxy.Password = "" }},
		{"UserData", func(o *Options) { o.UserData = "{{.Nope}}" }},
		{"UserData", func(o *Options) { o.UserData = "{{.ID" }},
		{"Images[0].Name", func(o *Options) { o.Images[0].Name = "" }},
		{"Images[1].Name", func(o *Options) { o.Images = append(o.Images, o.Images[0]) }},
		{"Images[0].URL", func(o *Options) { o.Images[0].URL = "ftp://m/i" }},
		{"Images[0].SHA256", func(o *Options) { o.Images[0].SHA256 = testSHA256[:16] }},
		{"Images[0].Format", func(o *Options) { o.Images[0].Format = "vmdk" }},
		{"Images[0].Kernel.SHA256", func(o *Options) { o.Images[0].Kernel.SHA256 = "z" }},
		{"Images[0].Initrd", func(o *Options) {
			o.Images[0].Initrd, o.Images[0].Kernel = o.Images[0].Kernel, nil
		}},
	} {
		o := good()
		tc.edit(&o)
		var oe *OptionError
		if err := o.Validate(); !errors.As(err, &oe) || oe.Field != tc.field {
			t.Errorf("%s: Validate() = %v, want the field named", tc.field, err)
		}
		p, err := New(o)
		if p != nil {
			p.Close()
		}
		if !errors.As(err, &oe) || oe.Field != tc.field || fleet.ClassOf(err) != fleet.ClassPermanent {
			t.Errorf("%s: New: %v (%s), want a permanent *OptionError", tc.field, err, fleet.ClassOf(err))
		}
	}
	// With a link of its own (tests), the entry's SSH fields are not needed.
	o := good()
	o.Host.Address, o.Host.User = "", ""
	o.Link = &LinkConfig{SSH: SSHConfig{Address: "h:22", User: "u", KeyFile: "/k", KnownHostsFile: "/kh"}}
	if err := o.Validate(); err != nil {
		t.Errorf("with Link set: %v", err)
	}
}
