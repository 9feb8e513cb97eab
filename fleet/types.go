package fleet

import (
	"net/netip"
	"time"
)

// Spec is what a create asks one host for. SpecHash identifies the parts of
// the spec that need a new VM when they change (image, sizes, labels); the
// provider stores it in the domain's mark and reports it back.
type Spec struct {
	ID        string
	Image     string
	CPUs      int
	MemoryMiB int
	Labels    map[string]string
	CommandID string
	SpecHash  string
	// Network is the proxy's interface as its host's address plan gives
	// it; the zero Network leaves the interface to the host's network
	// (DHCP). It is not part of SpecHash: a proxy keeps its addresses for
	// as long as it holds its place on the host.
	Network Network
}

// Network is a proxy's interface configured statically from its host's
// address plan: its addresses are known before the guest boots, and
// default routes go to on-link gateways (so an address outside the
// host's own subnet works, as a routed block or a provider's single
// address needs).
type Network struct {
	// MAC is the interface's hardware address: a provider's virtual MAC
	// where the plan names one, else one the plan derives from the
	// host and slot. "" lets the hypervisor choose.
	MAC string
	// IPv4 is the guest's IPv4 address (a /32 on its interface) and
	// IPv4Gateway its on-link default gateway; both invalid when the
	// plan gives the proxy no IPv4 address.
	IPv4        netip.Addr
	IPv4Gateway netip.Addr
	// IPv6 are the guest's IPv6 addresses (each a /128 on its
	// interface), the addresses its proxy may leave from; IPv6Gateway is
	// their on-link default gateway.
	IPv6        []netip.Addr
	IPv6Gateway netip.Addr
	// Nameservers are the guest's DNS resolvers (squid's among them);
	// none: the host network's own addresses where its DNS answers, as
	// the provider finds them, else the guest image's.
	Nameservers []netip.Addr
}

// Static reports whether the plan configures the interface (any address).
func (n Network) Static() bool { return n.IPv4.IsValid() || len(n.IPv6) > 0 }

// Addr is the proxy's address of record: its IPv4 address, else its first
// IPv6 address; invalid for a network left to DHCP.
func (n Network) Addr() netip.Addr {
	if n.IPv4.IsValid() {
		return n.IPv4
	}
	if len(n.IPv6) > 0 {
		return n.IPv6[0]
	}
	return netip.Addr{}
}

// Egress lists every address the proxy may leave from: its IPv4 address
// first, then its IPv6 addresses.
func (n Network) Egress() []netip.Addr {
	out := make([]netip.Addr, 0, 1+len(n.IPv6))
	if n.IPv4.IsValid() {
		out = append(out, n.IPv4)
	}
	return append(out, n.IPv6...)
}

// Instance is a proxy as observed on its host, read back from the host
// (never remembered by the provider).
type Instance struct {
	ID string
	// State is messages.StateProvisioning (defined, booting, or active with
	// no address yet), messages.StateRunning (active with an address) or
	// messages.StateFailed (the domain exists but is shut off or crashed).
	State     string
	IP        string
	Source    string // which address source answered (messages.Source*)
	CommandID string
	SpecHash  string
	CreatedAt time.Time
	Reason    string
	// Egress are the addresses the host's address plan gave the proxy
	// (Network.Egress, as read back from the host); empty for a proxy
	// whose interface is left to DHCP.
	Egress []netip.Addr
}
