package messages

import "time"

// Host states in a HostRecord and in `proxyfleet hosts`.
const (
	HostOK          = "ok"
	HostQuarantined = "quarantined" // its calls kept failing: placement skips it, its work waits
	HostDraining    = "draining"    // its owning worker is stopping (from the WorkerRecord, never stored here)
)

// HostRecord is a host's record, the value of its key (the host name) in
// BucketHosts. Every writer reads it, changes its own part and writes it
// back with compare-and-set on the key's revision, so no write is lost:
// intake reserves room in Proxies before it records a desired state; the
// host's executor releases it once the proxy is gone from the host; the
// host's owner sets the quarantine.
type HostRecord struct {
	V    int    `json:"v"`
	Host string `json:"host"`
	// MaxProxies is the host's room, as the config of the last writer
	// says.
	MaxProxies int `json:"max_proxies"`
	// Proxies hold room on the host: each proxy placed here, or still
	// present here until it is removed, with the PROXY_CMDS sequence of
	// the latest command that placed it here (0 for a domain found here
	// with no reservation). A host never holds more than MaxProxies.
	Proxies map[string]uint64 `json:"proxies"`
	// State is HostOK or HostQuarantined, Since when it became so.
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Until ends the current cool-down of a quarantined host: then its
	// owner probes it, and it leaves quarantine or stays for a longer
	// cool-down (CoolDownMS). A quarantined host without Until is an
	// operator's (Manual): no probe ends it, only a release command.
	Until      time.Time `json:"until,omitzero"`
	CoolDownMS int64     `json:"cool_down_ms,omitempty"`
	// Reason is the failure that quarantined the host (or kept it), or
	// "operator: <why>" for an operator's quarantine (OperatorReason).
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
	// Plan is the host's address plan as the config of the last writer
	// says (absent: none), so readers (`proxyfleet addresses`) need no
	// config to show which addresses are held. Addresses are the
	// assignments under it: which slot each proxy holds and when slots
	// were freed; empty on a host without a plan. Both added to the
	// contract: optional.
	Plan      *AddrPlan `json:"plan,omitempty"`
	Addresses HostAddrs `json:"addresses,omitzero"`
}

// AddrPlan is a host's address plan as its config (the host's
// `addresses`) gives it; package addrplan validates it and numbers its
// addresses into slots.
type AddrPlan struct {
	// IPv4 are CIDRs or single addresses; each usable address is one
	// proxy's. A CIDR of /30 or wider leaves out its network and
	// broadcast addresses.
	IPv4 []string `json:"ipv4,omitempty" yaml:"ipv4"`
	// IPv4Gateway is the guests' on-link IPv4 gateway; empty: the host
	// network's own address.
	IPv4Gateway string `json:"ipv4_gateway,omitempty" yaml:"ipv4_gateway"`
	// MACs are providers' virtual MACs, by IPv4 address of the plan: a
	// proxy given that address gets that MAC.
	MACs map[string]string `json:"macs,omitempty" yaml:"macs"`
	// IPv6 are prefixes; each proxy gets IPv6PerProxy consecutive
	// addresses of one of them.
	IPv6 []string `json:"ipv6,omitempty" yaml:"ipv6"`
	// IPv6Gateway is the guests' on-link IPv6 gateway; empty: the host
	// network's own address.
	IPv6Gateway  string `json:"ipv6_gateway,omitempty" yaml:"ipv6_gateway"`
	IPv6PerProxy int    `json:"ipv6_per_proxy,omitempty" yaml:"ipv6_per_proxy"`
	// Nameservers are the DNS resolvers a guest with a planned address
	// uses (at most 3); none: the host network's own addresses where its
	// DNS answers (libvirt's dnsmasq), else the guest image's resolver.
	Nameservers []string `json:"nameservers,omitempty" yaml:"nameservers"`
	// ReuseAfter is how long a freed address waits before it is given
	// again; 0 takes addrplan's default (an hour), a negative one none.
	ReuseAfter time.Duration `json:"reuse_after_ns,omitempty" yaml:"reuse_after"`
}

// Quarantined reports whether the host is in quarantine.
func (r HostRecord) Quarantined() bool { return r.State == HostQuarantined }
