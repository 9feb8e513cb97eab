package addrplan

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Defaults of a plan's settings, where its config leaves them out.
const (
	// DefaultReuseAfter is how long a freed address waits before it is
	// given again.
	DefaultReuseAfter = time.Hour
	// DefaultIPv6PerProxy is how many IPv6 addresses a proxy leaves from.
	DefaultIPv6PerProxy = 1
	// MaxIPv6PerProxy bounds ipv6_per_proxy.
	MaxIPv6PerProxy = 256
	// MaxSlots bounds the slots of one family on one host: a plan with
	// more addresses uses its first MaxSlots slots. It keeps an
	// assignment's scan small, and a derived MAC's slot number in 15 bits
	// (the 16th tells an IPv6-only slot's MAC apart).
	MaxSlots = 1<<15 - 1
	// MaxNameservers bounds nameservers: glibc's resolver reads the
	// first three of resolv.conf.
	MaxNameservers = 3
)

// Config is a host's address plan as the config file gives it (the
// host's `addresses`); the same record goes into the host's record in
// PROXY_HOSTS.
type Config = messages.AddrPlan

// bad is a plan's config error, a *messages.FieldError naming the field
// below the plan (`ipv4[1]`, `macs`).
func bad(field, format string, args ...any) error {
	return &messages.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Plan is a host's validated address plan: which addresses each slot
// gives. It holds no assignments (those are in the host's record) and is
// safe for concurrent use.
type Plan struct {
	cfg    Config
	host   string
	v4     []netip.Prefix // blocks, in the config's order
	v4skip [][2]bool      // per block: skip its network and broadcast address
	v4n    int
	gw4    netip.Addr
	macs   map[netip.Addr]string
	v6     []netip.Prefix
	v6per  int
	v6n    int
	v6cnt  []int // slots of each v6 prefix
	gw6    netip.Addr
	dns    []netip.Addr
	reuse  time.Duration
}

// New validates c, the plan of the host named host, and returns it.
func New(host string, c Config) (*Plan, error) {
	p := &Plan{cfg: c, host: host, macs: map[netip.Addr]string{}}
	if len(c.IPv4) == 0 && len(c.IPv6) == 0 {
		return nil, bad("ipv4", "a plan needs IPv4 or IPv6 addresses")
	}
	for i, s := range c.IPv4 {
		pr, err := parsePrefix(s)
		if err != nil || !pr.Addr().Is4() {
			return nil, bad(fmt.Sprintf("ipv4[%d]", i), "%q is not an IPv4 CIDR or address", s)
		}
		if pr.Masked() != pr {
			return nil, bad(fmt.Sprintf("ipv4[%d]", i), "%q has bits set past its prefix length (want %s)", s, pr.Masked())
		}
		for j, o := range p.v4 {
			if o.Overlaps(pr) {
				return nil, bad(fmt.Sprintf("ipv4[%d]", i), "%s overlaps ipv4[%d] (%s)", pr, j, o)
			}
		}
		p.v4 = append(p.v4, pr)
		skip := pr.Bits() <= 30
		p.v4skip = append(p.v4skip, [2]bool{skip, skip})
	}
	if c.IPv4Gateway != "" {
		a, err := netip.ParseAddr(c.IPv4Gateway)
		if err != nil || !a.Is4() {
			return nil, bad("ipv4_gateway", "%q is not an IPv4 address", c.IPv4Gateway)
		}
		if len(c.IPv4) == 0 {
			return nil, bad("ipv4_gateway", "set without ipv4 addresses")
		}
		p.gw4 = a
	}
	p.v4n = min(p.count4(), MaxSlots)
	if len(c.IPv4) > 0 && p.v4n == 0 {
		return nil, bad("ipv4", "no usable address (a gateway or a network's own addresses only)")
	}
	seenMAC := map[string]string{}
	for k, v := range c.MACs {
		a, err := netip.ParseAddr(k)
		if err != nil || !a.Is4() || !p.has4(a) {
			return nil, bad("macs", "%q is not an IPv4 address of the plan", k)
		}
		hw, err := net.ParseMAC(v)
		if err != nil || len(hw) != 6 {
			return nil, bad("macs", "%s: %q is not a 48-bit MAC address", k, v)
		}
		if hw[0]&1 != 0 {
			return nil, bad("macs", "%s: %s is a multicast address", k, hw)
		}
		m := hw.String()
		if o, ok := seenMAC[m]; ok {
			return nil, bad("macs", "%s is given to %s and %s", m, o, k)
		}
		seenMAC[m] = k
		p.macs[a] = m
	}
	p.v6per = c.IPv6PerProxy
	if p.v6per == 0 {
		p.v6per = DefaultIPv6PerProxy
	}
	if p.v6per < 1 || p.v6per > MaxIPv6PerProxy {
		return nil, bad("ipv6_per_proxy", "%d is out of range [1, %d]", c.IPv6PerProxy, MaxIPv6PerProxy)
	}
	if c.IPv6PerProxy != 0 && len(c.IPv6) == 0 {
		return nil, bad("ipv6_per_proxy", "set without ipv6 prefixes")
	}
	if c.IPv6Gateway != "" {
		a, err := netip.ParseAddr(c.IPv6Gateway)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return nil, bad("ipv6_gateway", "%q is not an IPv6 address", c.IPv6Gateway)
		}
		if len(c.IPv6) == 0 {
			return nil, bad("ipv6_gateway", "set without ipv6 prefixes")
		}
		p.gw6 = a
	}
	for i, s := range c.IPv6 {
		pr, err := netip.ParsePrefix(s)
		if err != nil || !pr.Addr().Is6() || pr.Addr().Is4In6() {
			return nil, bad(fmt.Sprintf("ipv6[%d]", i), "%q is not an IPv6 prefix", s)
		}
		if pr.Masked() != pr {
			return nil, bad(fmt.Sprintf("ipv6[%d]", i), "%q has bits set past its prefix length (want %s)", s, pr.Masked())
		}
		for j, o := range p.v6 {
			if o.Overlaps(pr) {
				return nil, bad(fmt.Sprintf("ipv6[%d]", i), "%s overlaps ipv6[%d] (%s)", pr, j, o)
			}
		}
		n := slots6(pr, p.v6per)
		if n < 1 {
			return nil, bad(fmt.Sprintf("ipv6[%d]", i), "%s holds no slot of %d addresses (the first %d are left out)", pr, p.v6per, p.v6per)
		}
		p.v6 = append(p.v6, pr)
		p.v6cnt = append(p.v6cnt, n)
	}
	for _, n := range p.v6cnt {
		p.v6n = min(p.v6n+n, MaxSlots)
	}
	if len(c.Nameservers) > MaxNameservers {
		return nil, bad("nameservers", "%d given, at most %d (a guest's resolver reads no more)", len(c.Nameservers), MaxNameservers)
	}
	for i, s := range c.Nameservers {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() {
			return nil, bad(fmt.Sprintf("nameservers[%d]", i), "%q is not a unicast IP address without a zone", s)
		}
		if slices.Contains(p.dns, a) {
			return nil, bad(fmt.Sprintf("nameservers[%d]", i), "%s given twice", a)
		}
		p.dns = append(p.dns, a)
	}
	switch {
	case c.ReuseAfter < 0:
		p.reuse = 0
	case c.ReuseAfter == 0:
		p.reuse = DefaultReuseAfter
	default:
		p.reuse = c.ReuseAfter
	}
	return p, nil
}

// parsePrefix reads a CIDR or a single address (a /32 or /128).
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// slots6 is how many slots of per addresses pr holds, the first slot's
// place left out (it holds the prefix's subnet-router anycast address,
// and ::1, often the gateway), at most MaxSlots.
func slots6(pr netip.Prefix, per int) int {
	size := new(big.Int).Lsh(big.NewInt(1), uint(128-pr.Bits()))
	n := size.Div(size, big.NewInt(int64(per)))
	n.Sub(n, big.NewInt(1))
	if n.Sign() <= 0 {
		return 0
	}
	if n.Cmp(big.NewInt(MaxSlots)) > 0 {
		return MaxSlots
	}
	return int(n.Int64())
}

// span4 is block i's usable addresses: offsets first to last of the
// block, less gw (the gateway's offset, -1 when it is not among them).
func (p *Plan) span4(i int) (first, last, gw int) {
	size := 1 << (32 - p.v4[i].Bits())
	first, last, gw = 0, size-1, -1
	if p.v4skip[i][0] {
		first++
	}
	if p.v4skip[i][1] {
		last--
	}
	if p.gw4.IsValid() && p.v4[i].Contains(p.gw4) {
		if g := int(diff4(p.gw4, p.v4[i].Addr())); g >= first && g <= last {
			gw = g
		}
	}
	return first, last, gw
}

// usable4n is how many usable addresses block i has.
func (p *Plan) usable4n(i int) int {
	first, last, gw := p.span4(i)
	n := last - first + 1
	if gw >= 0 {
		n--
	}
	return max(n, 0)
}

// count4 counts the usable IPv4 addresses, up to MaxSlots+1.
func (p *Plan) count4() int {
	n := 0
	for i := range p.v4 {
		n = min(n+p.usable4n(i), MaxSlots+1)
	}
	return n
}

func add4(a netip.Addr, k int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(k)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func add6(a netip.Addr, k uint64) netip.Addr {
	b := a.As16()
	lo := uint64(b[8])<<56 | uint64(b[9])<<48 | uint64(b[10])<<40 | uint64(b[11])<<32 |
		uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15])
	hi := uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
	nlo := lo + k
	if nlo < lo {
		hi++
	}
	var o [16]byte
	for i := range 8 {
		o[i] = byte(hi >> (56 - 8*i))
		o[8+i] = byte(nlo >> (56 - 8*i))
	}
	return netip.AddrFrom16(o)
}

func (p *Plan) has4(a netip.Addr) bool {
	for i, pr := range p.v4 {
		if pr.Contains(a) {
			first, last, gw := p.span4(i)
			k := int(diff4(a, pr.Addr()))
			return k >= first && k <= last && k != gw
		}
	}
	return false
}

func diff4(a, b netip.Addr) uint32 {
	x, y := a.As4(), b.As4()
	return (uint32(x[0])<<24 | uint32(x[1])<<16 | uint32(x[2])<<8 | uint32(x[3])) -
		(uint32(y[0])<<24 | uint32(y[1])<<16 | uint32(y[2])<<8 | uint32(y[3]))
}

// Config is the plan as its config gave it: a copy, the caller's to
// change or decode into.
func (p *Plan) Config() Config {
	c := p.cfg
	c.IPv4, c.IPv6, c.Nameservers, c.MACs = slices.Clone(c.IPv4), slices.Clone(c.IPv6), slices.Clone(c.Nameservers), maps.Clone(c.MACs)
	return c
}

// Host is the name of the plan's host.
func (p *Plan) Host() string { return p.host }

// Slots4 and Slots6 are how many slots of each family the plan has.
func (p *Plan) Slots4() int { return p.v4n }
func (p *Plan) Slots6() int { return p.v6n }

// PerProxy6 is how many IPv6 addresses a slot gives.
func (p *Plan) PerProxy6() int { return p.v6per }

// ReuseAfter is how long a freed slot waits before it is given again.
func (p *Plan) ReuseAfter() time.Duration { return p.reuse }

// IPv4 is the address of IPv4 slot n (from 1); invalid for a slot the
// plan does not have.
func (p *Plan) IPv4(n int) netip.Addr {
	if n < 1 || n > p.v4n {
		return netip.Addr{}
	}
	left := n - 1
	for i, pr := range p.v4 {
		if c := p.usable4n(i); left >= c {
			left -= c
			continue
		}
		first, _, gw := p.span4(i)
		off := first + left
		if gw >= 0 && off >= gw {
			off++
		}
		return add4(pr.Addr(), off)
	}
	return netip.Addr{}
}

// IPv6 are the addresses of IPv6 slot n (from 1); nil for a slot the
// plan does not have.
func (p *Plan) IPv6(n int) []netip.Addr {
	if n < 1 || n > p.v6n {
		return nil
	}
	left := n - 1
	for i, pr := range p.v6 {
		if left >= p.v6cnt[i] {
			left -= p.v6cnt[i]
			continue
		}
		first := add6(pr.Addr(), uint64(left+1)*uint64(p.v6per))
		out := make([]netip.Addr, p.v6per)
		for j := range out {
			out[j] = add6(first, uint64(j))
		}
		return out
	}
	return nil
}

// Slot4Of is the IPv4 slot that gives a, 0 if none does.
func (p *Plan) Slot4Of(a netip.Addr) int {
	if !a.Is4() {
		return 0
	}
	n := 0
	for i, pr := range p.v4 {
		if !pr.Contains(a) {
			n += p.usable4n(i)
			continue
		}
		first, last, gw := p.span4(i)
		k := int(diff4(a, pr.Addr()))
		if k < first || k > last || k == gw {
			return 0
		}
		n += k - first + 1
		if gw >= 0 && k > gw {
			n--
		}
		if n > p.v4n {
			return 0
		}
		return n
	}
	return 0
}

// Slot6Of is the IPv6 slot whose addresses include a, 0 if none does.
func (p *Plan) Slot6Of(a netip.Addr) int {
	if !a.Is6() || a.Is4In6() {
		return 0
	}
	base := 0
	for i, pr := range p.v6 {
		if !pr.Contains(a) {
			base += p.v6cnt[i]
			continue
		}
		off := new(big.Int).Sub(new(big.Int).SetBytes(a.AsSlice()), new(big.Int).SetBytes(pr.Addr().AsSlice()))
		k := off.Div(off, big.NewInt(int64(p.v6per)))
		if k.Sign() <= 0 || !k.IsInt64() || k.Int64() > int64(p.v6cnt[i]) {
			return 0
		}
		if n := base + int(k.Int64()); n <= p.v6n {
			return n
		}
		return 0
	}
	return 0
}

// Network is the interface slots s give on this plan's host: addresses,
// gateways (invalid where the plan leaves them to the host's network),
// MAC and nameservers (none where the plan leaves them to the host's
// network).
func (p *Plan) Network(s Slots) fleet.Network {
	var n fleet.Network
	if s.V4 > 0 {
		n.IPv4 = p.IPv4(s.V4)
		if n.IPv4.IsValid() {
			n.IPv4Gateway = p.gw4
		}
	}
	if s.V6 > 0 {
		n.IPv6 = p.IPv6(s.V6)
		if n.IPv6 != nil {
			n.IPv6Gateway = p.gw6
		}
	}
	if n.Static() {
		n.MAC = p.mac(s, n.IPv4)
		n.Nameservers = slices.Clone(p.dns)
	}
	return n
}

// mac is a provider's MAC for a4, else one derived from the host and the
// slot: QEMU's locally administered prefix 52:54:00, a byte of the host
// name's hash, and the slot number (an IPv6 slot's with the top bit set
// when the proxy has no IPv4 slot). So no two proxies of one host share
// a MAC, and hosts rarely do.
func (p *Plan) mac(s Slots, a4 netip.Addr) string {
	if m, ok := p.macs[a4]; ok {
		return m
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.host))
	n := s.V4
	if n == 0 {
		n = s.V6 | 0x8000
	}
	return net.HardwareAddr{0x52, 0x54, 0x00, byte(h.Sum32()), byte(n >> 8), byte(n)}.String()
}

// Slots are one proxy's slots: its IPv4 and IPv6 slot, each from 1, 0
// where it has none.
type Slots struct{ V4, V6 int }

// Overlap says whether two plans share an address: one address must
// never be given on two hosts.
func Overlap(a, b *Plan) error {
	for _, x := range a.v4 {
		for _, y := range b.v4 {
			if x.Overlaps(y) {
				return fmt.Errorf("%s of %s overlaps %s of %s", x, a.host, y, b.host)
			}
		}
	}
	for _, x := range a.v6 {
		for _, y := range b.v6 {
			if x.Overlaps(y) {
				return fmt.Errorf("%s of %s overlaps %s of %s", x, a.host, y, b.host)
			}
		}
	}
	return nil
}

// ErrNoAddress is a plan with no free address for another proxy.
var ErrNoAddress = errors.New("no free address")

// FullError says which family of a host's plan has no free slot.
type FullError struct {
	Host    string
	Family  string // "ipv4" or "ipv6"
	Held    int
	Cooling int
	Slots   int
}

func (e *FullError) Error() string {
	return fmt.Sprintf("host %s has no free %s address (%d of %d held, %d freed within reuse_after)",
		e.Host, e.Family, e.Held, e.Slots, e.Cooling)
}

func (e *FullError) Is(target error) bool { return target == ErrNoAddress }

// sortedKeys lists a map's int keys in order.
func sortedKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
