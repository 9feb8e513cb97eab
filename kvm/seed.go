package kvm

import (
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"text/template"

	"github.com/kdomanski/iso9660"

	"proxyfleet/fleet"
)

// The NoCloud seed: a small ISO9660 image with the volume id "cidata" and
// two files, meta-data and user-data, attached to the guest read-only as its
// second virtio disk. cloud-init (and the test guest, testguest/seed.go)
// finds it by label or by trying /dev/vd*, mounts it as iso9660, and reads
// its instance-id and hostname from meta-data and its configuration from
// user-data. A proxy with a static network (fleet.Network.Static) gets a
// third file, network-config (networkConfig, network.go), which cloud-init
// applies instead of its fallback of DHCP on the first interface; without
// one the seed is the two files as ever.
//
// It is written in Go (github.com/kdomanski/iso9660), not with genisoimage
// on the worker or the host: the worker then needs no tool installed, and
// nothing runs on the host but libvirt.
//
// What that library writes (v0.4.0): a primary volume descriptor only, no
// Joliet and no Rock Ridge, and every name "mangled" to lower case with a
// ";1" version, characters outside ISO9660's d-characters becoming '_'. The
// '-' of "meta-data" and "user-data" is kept (the library's d-character set
// has it), so the directory records say "meta-data;1", "user-data;1" and
// "network-config;1".
// Linux's isofs without Rock Ridge maps names to lower case and drops the
// ";1", so the guest sees "meta-data" and "user-data", the names cloud-init
// wants. The test guest also accepts the other forms a plain ISO9660 writer
// may leave ("META_DATA;1", "user_data."), should the library ever mangle
// harder. TestSeed_namesAsTheGuestSeesThem pins the stored names.
const (
	seedVolumeID = "cidata"
	metaDataFile = "meta-data"
	userDataFile = "user-data"
	netCfgFile   = "network-config"
)

var (
	// instanceIDRE bounds what goes into meta-data between double quotes:
	// nothing that needs escaping there, and nothing that could open a new
	// key, a comment or a document.
	instanceIDRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)
	// hostnameRE is an RFC 1123 host name of lowercase labels.
	hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
)

// seedISO returns the NoCloud seed image for one proxy.
//
// instanceID should change whenever the proxy is recreated (the proxy id
// with the spec hash or command id, say): cloud-init runs its per-instance
// modules again only for a new instance-id. instanceID and hostname are
// checked, then written double-quoted: the checks leave no character that
// needs escaping, so meta-data stays the simple "key: value" file every
// NoCloud reader understands, and the quotes keep a value like "true",
// "null" or "1.5" a string.
//
// network is the proxy's as checkNetwork left it: a static one adds
// network-config; the zero one adds nothing.
func seedISO(instanceID, hostname, userData string, network fleet.Network) ([]byte, error) {
	if !instanceIDRE.MatchString(instanceID) {
		return nil, fmt.Errorf("seed: instance id %q: want letters, digits, '.', '_' or '-'", instanceID)
	}
	if len(hostname) > 253 || !hostnameRE.MatchString(hostname) {
		return nil, fmt.Errorf("seed: hostname %q is not a lowercase RFC 1123 host name", hostname)
	}
	metaData := "instance-id: \"" + instanceID + "\"\nlocal-hostname: \"" + hostname + "\"\n"
	files := []struct{ name, data string }{
		{metaDataFile, metaData},
		{userDataFile, userData},
	}
	if network.Static() {
		nc, err := networkConfig(network)
		if err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		files = append(files, struct{ name, data string }{netCfgFile, nc})
	}

	// The writer stages files in a temporary directory of its own, which
	// Cleanup removes.
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer w.Cleanup()
	for _, f := range files {
		if err := w.AddFile(strings.NewReader(f.data), f.name); err != nil {
			return nil, fmt.Errorf("seed: add %s: %w", f.name, err)
		}
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, seedVolumeID); err != nil {
		return nil, fmt.Errorf("seed: write image: %w", err)
	}
	return buf.Bytes(), nil
}

// userDataVars are the fields a proxy.user_data template can use.
type userDataVars struct {
	ID       string // proxy id
	Hostname string
	Port     int      // the proxy's port
	User     string   // the credential's user; "" when none is required
	Password string   // its password (the seed then holds it: see PasswordHash)
	Allow    []string // the source networks that may use the proxy, as CIDRs; empty: any
	// Deny are the destination networks the proxy must refuse, as CIDRs
	// (GuestProxy.Deny; the default list when that is nil); empty: none.
	Deny []string
	// Egress are the proxy's addresses (IPv4 first, as fleet.Network.Egress
	// lists them) as text; empty for a proxy whose network is the host's
	// DHCP. A request names the one it is to leave from in the header
	// messages.HeaderEgress, which the proxy must remove.
	Egress []string
	// Nameservers are the guest's DNS resolvers (fleet.Network.Nameservers).
	Nameservers []string
	gp          GuestProxy
}

// PasswordHash is the password's bcrypt hash (with a fresh salt), for a
// template that writes a password file ({{.PasswordHash}}), so the seed
// need not hold the password itself. It is computed only if used.
func (v userDataVars) PasswordHash() (string, error) {
	if v.gp.User == "" {
		return "", nil
	}
	line, err := passwdLine(v.gp)
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(line, v.gp.User+":"), nil
}

// userData renders the Options.UserData template for one proxy
// (text/template, fields .ID, .Hostname, .Port, .User, .Password, .Allow,
// .Deny, .Egress, .Nameservers and .PasswordHash); .Egress are n's addresses
// (fleet.Network.Egress, as checkNetwork left them) and .Nameservers its
// resolvers, none for a network left to DHCP. An empty template means the default one, which configures
// squid (see guestproxy.go). A template that names another
// field, or does not parse, is an error rather than a seed with "<no
// value>" in it. The values are not escaped: the id and hostname are
// restricted to characters that need no escaping in YAML, and the rest of
// the template is the operator's. A template should quote them
// ("{{.ID}}"), as the default one does: bare, a valid id or hostname may
// read as a bool, null or number.
func userData(tmpl string, gp GuestProxy, id, hostname string, n fleet.Network) (string, error) {
	if err := checkID(id); err != nil {
		return "", fmt.Errorf("user-data: %w", err)
	}
	if len(hostname) > 253 || !hostnameRE.MatchString(hostname) {
		return "", fmt.Errorf("user-data: hostname %q is not a lowercase RFC 1123 host name", hostname)
	}
	if tmpl == "" {
		return defaultUserData(id, hostname, gp, n.Egress(), n.Nameservers)
	}
	t, err := parseUserData(tmpl)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	v := userDataVars{ID: id, Hostname: hostname, Port: gp.port(), User: gp.User, Password: gp.Password, Allow: gp.allowStrings(),
		Deny: gp.denyStrings(), Egress: addrStrings(n.Egress()), Nameservers: addrStrings(n.Nameservers), gp: gp}
	if err := t.Execute(&b, v); err != nil {
		return "", fmt.Errorf("user-data template: %w", err)
	}
	return b.String(), nil
}

// addrStrings are addresses as text; empty, not nil, for none, so a
// template's range and len see a list either way.
func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// parseUserData parses a user-data template; New calls it too, so a
// template that cannot parse stops the provider at start.
func parseUserData(tmpl string) (*template.Template, error) {
	t, err := template.New("user_data").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return nil, fmt.Errorf("user-data template: %w", err)
	}
	return t, nil
}
