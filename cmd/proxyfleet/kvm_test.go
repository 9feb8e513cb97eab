package main

import (
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"proxyfleet/config"
	"proxyfleet/deny"
	"proxyfleet/kvm"
)

const testSHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Every kvm key of a host entry, its images and proxy.user_data reach the
// provider's options; none is lost on the way.
func TestKVMOptions_everyKeyIsMapped(t *testing.T) {
	c, err := config.Parse([]byte(`
hosts:
  - name: beelink
    ssh: {address: "host.example:2222", user: pf, key_file: /k, known_hosts: /kh}
    socket: /s
    uri: qemu+unix:///system
    pool: p
    network: n
    domain_type: qemu
    budgets: {call: 1s, transfer_stall: 2s, close: 3s, connect: 4s, keepalive: 5s}
images:
  - {name: a, url: "https://m/a.qcow2", sha256: "` + testSHA + `", format: raw,
     kernel: {url: "file:///k", sha256: "` + testSHA + `"}, initrd: {url: "file:///i", sha256: "` + testSHA + `"},
     cmdline: "console=ttyS0"}
  - {name: b, url: "file:///b.qcow2", sha256: "` + testSHA + `"}
proxy: {port: 8080, user_data: "#cloud-config\n", auth: {user: fleet}, allow: [198.18.0.0/15, 198.18.0.1], open: true,
        deny: ['fd00::/8', 169.254.169.254]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.LoadSecrets(func(string) string { return "from-env" }); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	got, err := kvmOptions(c, c.Hosts[0], log)
	if err != nil {
		t.Fatal(err)
	}
	denied, _ := deny.Parse("proxy.deny", []string{"fd00::/8", "169.254.169.254"})
	want := kvm.Options{
		Host: kvm.HostOptions{
			Name: "beelink", Address: "host.example:2222", User: "pf", KeyFile: "/k", KnownHosts: "/kh",
			Socket: "/s", URI: "qemu+unix:///system", Pool: "p", Network: "n", DomainType: "qemu",
			Budgets: kvm.Budgets{Call: time.Second, TransferStall: 2 * time.Second, Close: 3 * time.Second,
				Connect: 4 * time.Second, Keepalive: 5 * time.Second},
		},
		Images: []kvm.ImageSource{
			{Name: "a", URL: "https://m/a.qcow2", SHA256: testSHA, Format: "raw",
				Kernel:  &kvm.ArtifactSource{URL: "file:///k", SHA256: testSHA},
				Initrd:  &kvm.ArtifactSource{URL: "file:///i", SHA256: testSHA},
				Cmdline: "console=ttyS0"},
			{Name: "b", URL: "file:///b.qcow2", SHA256: testSHA},
		},
		UserData: "#cloud-config\n",
		Proxy: kvm.GuestProxy{Port: 8080, User: "fleet", Password: "from-env", Open: true,
			Allow: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("198.18.0.1/32")},
			Deny:  &denied},
		Logger: log,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("options\n got %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

// What the config leaves out, kvm fills with its own defaults, which are
// the values docs/CONFIGURATION.md documents for a host entry.
func TestKVMOptions_defaultsAreKVMs(t *testing.T) {
	c, err := config.Parse([]byte(`
hosts:
  - name: beelink
    ssh: {address: "host.example:22", user: pf, key_file: /k, known_hosts: /kh}
images:
  - {name: debian-12, url: "https://m/d.qcow2", sha256: "` + testSHA + `"}
proxy: {open: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	o, err := kvmOptions(c, c.Hosts[0], slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	o = o.WithDefaults()
	h := o.Host
	if h.Socket != "/run/libvirt/libvirt-sock" || h.URI != "qemu:///system" || h.Pool != "default" ||
		h.Network != "default" || h.DomainType != "kvm" || o.Images[0].Format != "qcow2" {
		t.Errorf("host defaults: %+v, image %+v", h, o.Images[0])
	}
	want := kvm.Budgets{Call: 30 * time.Second, TransferStall: 30 * time.Second, Close: 5 * time.Second,
		Connect: 10 * time.Second, Keepalive: 10 * time.Second}
	if h.Budgets != want {
		t.Errorf("budgets %+v, want %+v", h.Budgets, want)
	}
	if o.Proxy.Port != 3128 {
		t.Errorf("proxy port %d, want 3128", o.Proxy.Port)
	}
	// proxy.deny absent: the default list, written out.
	if o.Proxy.Deny == nil || !slices.Equal(o.Proxy.Deny.Strings(), deny.Default().Strings()) {
		t.Errorf("proxy deny %v, want the default list", o.Proxy.Deny)
	}
}
