package kvm

import (
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"proxyfleet/fleet"
)

// The mark is the element in a domain's <metadata> that says the domain is
// proxyfleet's and which proxy, command and spec it was made for, and, for
// a proxy with a static network, the addresses its host's plan gave it, so
// that Get and List report them without asking the guest or a lease.
//
// It is how the provider keeps no per-instance state (DESIGN.md, semantics
// 6): Get, List and the sweeps read the domain and its mark back from libvirt
// instead of remembering what they made. A domain is ours only if it carries
// a mark in markNS whose owner is markOwner; a domain name that merely starts
// with "pf-" is not enough, and a mark is not trusted on a domain whose name
// does not match its id (a virt-clone copies metadata).
//
// libvirt keeps elements of <metadata> only in a namespace of their own and
// addresses them by namespace URI (virDomainGetMetadata, type element), so
// the mark has one, versioned in its URI: a mark of another version is
// another element, not a misread one.
const (
	markNS     = "https://proxyfleet.dev/xmlns/mark/1"
	markPrefix = "proxyfleet" // the "key" argument of virDomainSetMetadata
	markOwner  = "proxyfleet"
)

// mark is what the provider writes on each domain it creates.
type mark struct {
	Owner     string // markOwner on every mark we write
	ID        string // proxy id
	CommandID string // the command the domain was created for
	SpecHash  string // fleet.Spec.SpecHash at creation
	CreatedAt time.Time
	Host      string // host entry the domain was created through
	Image     string // ImageSource.Name
	Labels    map[string]string
	// Egress and Addr are the static network the host's address plan gave
	// the proxy (fleet.Network.Egress and Addr): every address it may
	// leave from, and its address of record, which is one of them. Both
	// are empty for an interface left to DHCP, and in marks written
	// before plans, which read as such.
	Egress []netip.Addr
	Addr   netip.Addr
}

// markXMLOut is the element as written. encoding/xml cannot choose
// namespace prefixes, so the prefix is spelled out in the names and declared
// by hand: libvirt shows the mark as <proxyfleet:mark>, as virsh users
// expect, and the element is complete on its own (it declares its own
// namespace), which is what virDomainSetMetadata wants too.
type markXMLOut struct {
	XMLName   xml.Name      `xml:"proxyfleet:mark"`
	NS        string        `xml:"xmlns:proxyfleet,attr"`
	Owner     string        `xml:"proxyfleet:owner"`
	ID        string        `xml:"proxyfleet:id"`
	CommandID markText      `xml:"proxyfleet:commandId"`
	SpecHash  string        `xml:"proxyfleet:specHash"`
	CreatedAt string        `xml:"proxyfleet:createdAt"`
	Host      string        `xml:"proxyfleet:host"`
	Image     string        `xml:"proxyfleet:image"`
	Labels    []markLabelXM `xml:"proxyfleet:label"`
	Egress    []string      `xml:"proxyfleet:egress"`
	Addr      string        `xml:"proxyfleet:addr,omitempty"`
}

// markXMLIn is the element as read: encoding/xml resolves prefixes to
// namespace URIs when it decodes, whatever prefix libvirt or a person used.
// Children are matched by local name in any namespace, and the element's
// own namespace is checked by parseMark, because virDomainGetMetadata
// returns the element with its namespace stripped (seen with libvirt 9.0:
// <mark><owner>proxyfleet</owner>...).
type markXMLIn struct {
	XMLName   xml.Name      `xml:"mark"`
	Owner     string        `xml:"owner"`
	ID        string        `xml:"id"`
	CommandID markText      `xml:"commandId"`
	SpecHash  string        `xml:"specHash"`
	CreatedAt string        `xml:"createdAt"`
	Host      string        `xml:"host"`
	Image     string        `xml:"image"`
	Labels    []markLabelXM `xml:"label"`
	Egress    []string      `xml:"egress"`
	Addr      string        `xml:"addr"`
}

type markLabelXM struct {
	Key   string `xml:"key,attr"`
	Enc   string `xml:"enc,attr,omitempty"`
	Value string `xml:",chardata"`
}

// markText is a free-form value: the command id comes from a Nats-Msg-Id
// header and label values from clients, and either may hold characters XML
// 1.0 cannot carry at all (most control characters) or whitespace a
// re-indenting serializer might not keep. Such a value is stored base64 with
// enc="base64", so that it reads back exactly as written instead of failing
// the create or coming back altered.
type markText struct {
	Enc   string `xml:"enc,attr,omitempty"`
	Value string `xml:",chardata"`
}

const encBase64 = "base64"

func encodeText(s string) markText {
	if plainText(s) {
		return markText{Value: s}
	}
	return markText{Enc: encBase64, Value: base64.StdEncoding.EncodeToString([]byte(s))}
}

func (t markText) decode() (string, error) {
	switch t.Enc {
	case "":
		return t.Value, nil
	case encBase64:
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(t.Value))
		if err != nil {
			return "", fmt.Errorf("mark: bad base64 value: %w", err)
		}
		return string(b), nil
	}
	return "", fmt.Errorf("mark: unknown encoding %q", t.Enc)
}

// plainText reports whether s can be stored as XML text and read back
// unchanged: valid UTF-8 with no control characters (so no tab, CR or LF)
// and only characters XML 1.0 allows. Escaping of quotes, '<' and '&' is
// encoding/xml's job and needs no fallback.
func plainText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r < 0x20, r == 0x7f:
			return false
		case r >= 0xD800 && r <= 0xDFFF, r == 0xFFFE, r == 0xFFFF:
			return false
		}
	}
	return true
}

// xml returns the mark as a self-contained element, for a domain's
// <metadata> and for virDomainSetMetadata. Fields that name things (id,
// host entry, image, spec hash) must be plain text; they are validated
// upstream, and a mark that would need escaping there is refused rather
// than written in a form the sweeps cannot match.
func (m mark) xml() (string, error) {
	if err := checkID(m.ID); err != nil {
		return "", fmt.Errorf("mark: %w", err)
	}
	if m.Owner == "" {
		m.Owner = markOwner
	}
	for _, f := range []struct{ name, v string }{
		{"owner", m.Owner}, {"spec hash", m.SpecHash}, {"host", m.Host}, {"image", m.Image},
	} {
		if !plainText(f.v) {
			return "", fmt.Errorf("mark: %s %q has characters a mark cannot hold", f.name, f.v)
		}
	}
	if m.CreatedAt.IsZero() {
		return "", errors.New("mark: createdAt is not set")
	}
	if err := checkMarkAddrs(m.Egress, m.Addr); err != nil {
		return "", err
	}
	if y := m.CreatedAt.UTC().Year(); y < 1 || y > 9999 {
		// RFC 3339 has four-digit years; parseMark could not read it back.
		return "", fmt.Errorf("mark: createdAt %s is outside RFC 3339", m.CreatedAt)
	}
	out := markXMLOut{
		NS:        markNS,
		Owner:     m.Owner,
		ID:        m.ID,
		CommandID: encodeText(m.CommandID),
		SpecHash:  m.SpecHash,
		CreatedAt: m.CreatedAt.UTC().Format(time.RFC3339Nano),
		Host:      m.Host,
		Image:     m.Image,
	}
	for _, a := range m.Egress {
		out.Egress = append(out.Egress, a.String())
	}
	if m.Addr.IsValid() {
		out.Addr = m.Addr.String()
	}
	keys := make([]string, 0, len(m.Labels))
	for k := range m.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same spec gives the same bytes
	for _, k := range keys {
		if !plainText(k) {
			return "", fmt.Errorf("mark: label key %q has characters a mark cannot hold", k)
		}
		t := encodeText(m.Labels[k])
		out.Labels = append(out.Labels, markLabelXM{Key: k, Enc: t.Enc, Value: t.Value})
	}
	b, err := xml.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("mark: %w", err)
	}
	return string(b), nil
}

// parseMark reads the mark from what libvirt returns: either the mark
// element alone (virDomainGetMetadata with type element and markNS) or a
// whole domain description (virDomainGetXMLDesc), where it is looked for
// only as a child of <domain><metadata>, in markNS.
//
// virDomainGetMetadata strips the namespace from the element it returns,
// so a root <mark> with no namespace is taken as the mark: libvirt found it
// by markNS. A root element in any other namespace is not ours.
//
// ok is false, with a nil error, when the document carries no mark of ours:
// no mark element in markNS, or one whose owner is not markOwner. Such a
// domain is someone else's, and sweeps must leave it alone. An error means
// the document, or a mark that claims to be ours, cannot be read (bad XML,
// bad id or time, two marks, a mark whose id does not match the domain's
// name); callers should treat that domain as not ours either, and say why.
func parseMark(doc string) (m mark, ok bool, err error) {
	dec := xml.NewDecoder(strings.NewReader(doc))
	var (
		stack   []xml.Name // open elements above the current token
		in      *markXMLIn
		domName string
		root    string
	)
	for {
		tok, terr := dec.Token()
		if terr == io.EOF {
			break
		}
		if terr != nil {
			return mark{}, false, fmt.Errorf("mark: %w", terr)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			isMark := t.Name.Space == markNS && t.Name.Local == "mark"
			switch {
			case len(stack) == 0 && root != "":
				return mark{}, false, errors.New("mark: more than one root element")
			case len(stack) == 0 && (isMark || t.Name == xml.Name{Local: "mark"}):
				root = "mark"
				if in, err = decodeMark(dec, t); err != nil {
					return mark{}, false, err
				}
				continue
			case len(stack) == 0 && t.Name.Space != "":
				// Another application's element, or a mark of another
				// version: not ours, and not unreadable either.
				root = "foreign"
				if err := dec.Skip(); err != nil {
					return mark{}, false, fmt.Errorf("mark: %w", err)
				}
				continue
			case len(stack) == 0 && t.Name.Local != "domain":
				return mark{}, false, fmt.Errorf("mark: want <domain> or <mark>, have <%s>", t.Name.Local)
			case len(stack) == 0:
				root = "domain"
			case len(stack) == 1 && t.Name.Local == "name" && t.Name.Space == "":
				if err := dec.DecodeElement(&domName, &t); err != nil {
					return mark{}, false, fmt.Errorf("mark: domain name: %w", err)
				}
				continue
			case len(stack) == 2 && stack[1].Local == "metadata" && isMark:
				if in != nil {
					return mark{}, false, errors.New("mark: domain has two marks")
				}
				if in, err = decodeMark(dec, t); err != nil {
					return mark{}, false, err
				}
				continue
			}
			stack = append(stack, t.Name)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if root == "" {
		return mark{}, false, errors.New("mark: empty document")
	}
	if in == nil || in.Owner != markOwner {
		return mark{}, false, nil
	}
	m, err = in.mark()
	if err != nil {
		return mark{}, false, err
	}
	if root == "domain" && domName != domainName(m.ID) {
		return mark{}, false, fmt.Errorf("mark: mark of proxy %q on domain %q", m.ID, domName)
	}
	return m, true, nil
}

func decodeMark(dec *xml.Decoder, start xml.StartElement) (*markXMLIn, error) {
	var in markXMLIn
	if err := dec.DecodeElement(&in, &start); err != nil {
		return nil, fmt.Errorf("mark: %w", err)
	}
	return &in, nil
}

func (in *markXMLIn) mark() (mark, error) {
	m := mark{Owner: in.Owner, ID: in.ID, SpecHash: in.SpecHash, Host: in.Host, Image: in.Image}
	if err := checkID(m.ID); err != nil {
		return mark{}, fmt.Errorf("mark: %w", err)
	}
	var err error
	if m.CommandID, err = in.CommandID.decode(); err != nil {
		return mark{}, err
	}
	if m.CreatedAt, err = time.Parse(time.RFC3339Nano, in.CreatedAt); err != nil {
		return mark{}, fmt.Errorf("mark: createdAt: %w", err)
	}
	for _, l := range in.Labels {
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		if _, dup := m.Labels[l.Key]; dup {
			return mark{}, fmt.Errorf("mark: label %q twice", l.Key)
		}
		v, err := markText{Enc: l.Enc, Value: l.Value}.decode()
		if err != nil {
			return mark{}, err
		}
		m.Labels[l.Key] = v
	}
	for _, s := range in.Egress {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return mark{}, fmt.Errorf("mark: egress: %w", err)
		}
		m.Egress = append(m.Egress, a)
	}
	if s := strings.TrimSpace(in.Addr); s != "" {
		if m.Addr, err = netip.ParseAddr(s); err != nil {
			return mark{}, fmt.Errorf("mark: addr: %w", err)
		}
	}
	if err := checkMarkAddrs(m.Egress, m.Addr); err != nil {
		return mark{}, err
	}
	return m, nil
}

// checkMarkAddrs holds a mark's planned addresses, written or read, to one
// rule: none at all, or distinct egress addresses without zones and an
// address of record among them.
func checkMarkAddrs(egress []netip.Addr, addr netip.Addr) error {
	seen := make(map[netip.Addr]bool, len(egress))
	for _, a := range egress {
		switch {
		case !a.IsValid():
			return errors.New("mark: an egress address is not set")
		case a.Zone() != "":
			return fmt.Errorf("mark: egress %s has a zone", a)
		case seen[a]:
			return fmt.Errorf("mark: egress %s twice", a)
		}
		seen[a] = true
	}
	switch {
	case len(egress) == 0 && addr.IsValid():
		return fmt.Errorf("mark: address of record %s without egress addresses", addr)
	case len(egress) > 0 && !seen[addr]:
		return fmt.Errorf("mark: address of record %s is not among the egress addresses", addr)
	}
	return nil
}

// instance is what the mark alone says about a proxy; the caller adds the
// state and address it reads from the domain.
func (m mark) instance() fleet.Instance {
	return fleet.Instance{ID: m.ID, CommandID: m.CommandID, SpecHash: m.SpecHash, CreatedAt: m.CreatedAt,
		Egress: slices.Clone(m.Egress)}
}

// static reports whether the mark records a static network (a plan's
// addresses).
func (m mark) static() bool { return m.Addr.IsValid() }
