package messages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

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
	// cool-down (CoolDownMS).
	Until      time.Time `json:"until,omitzero"`
	CoolDownMS int64     `json:"cool_down_ms,omitempty"`
	// Reason is the failure that quarantined the host (or kept it).
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

// AddrState is a host's address assignments (package addrplan decides
// them). A slot is a place in the plan: an IPv4 slot is one IPv4
// address, an IPv6 slot the plan's ipv6_per_proxy addresses. Slots are
// numbered from 1; 0 means none.
//
// Every proxy holding a slot is also in HostRecord.Proxies, and no slot
// is held by two proxies: both are changed together, by compare-and-set
// of the whole record.
type AddrState struct {
	// Slots are the slots each proxy holds, by proxy id.
	Slots map[string]AddrSlots `json:"slots,omitempty"`
	V4    SlotSpace            `json:"v4,omitzero"`
	V6    SlotSpace            `json:"v6,omitzero"`
}

// HostAddrs is a host record's AddrState as the record stores it. A
// decoded record keeps it in that form and Decode parses it, so a reader
// that needs only a host's room (every worker's view of every host,
// decoding each write of every record) does not build it: with a hundred
// proxies a host, parsing it more than doubled the cost of decoding a
// record. The zero HostAddrs is an empty AddrState; a HostAddrs is never
// changed, only replaced (EncodeAddrs), so copies of a record share it
// safely.
type HostAddrs struct{ raw []byte }

// EncodeAddrs is st as a record stores it; the zero HostAddrs for an
// empty st.
func EncodeAddrs(st AddrState) HostAddrs {
	if len(st.Slots) == 0 && st.V4.IsZero() && st.V6.IsZero() {
		return HostAddrs{}
	}
	b, err := json.Marshal(st)
	if err != nil {
		panic(fmt.Sprintf("encode address state: %v", err)) // maps of ints and strings always encode
	}
	return HostAddrs{raw: b}
}

// Decode parses the assignments; an error names what is malformed. The
// AddrState returned is the caller's own to change.
func (h HostAddrs) Decode() (AddrState, error) {
	var st AddrState
	if len(h.raw) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(h.raw, &st); err != nil {
		return AddrState{}, fmt.Errorf("decode addresses: %w", err)
	}
	return st, nil
}

// IsZero says whether h holds no assignments (encoding/json's omitzero).
func (h HostAddrs) IsZero() bool { return len(h.raw) == 0 }

// MarshalJSON writes the stored form as it is.
func (h HostAddrs) MarshalJSON() ([]byte, error) {
	if len(h.raw) == 0 {
		return []byte("{}"), nil
	}
	return h.raw, nil
}

// UnmarshalJSON keeps a copy of b, checked only to be a JSON object (or
// null, no assignments); Decode parses it.
func (h *HostAddrs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")) || bytes.Equal(b, []byte("{}")):
		h.raw = nil
	case len(b) > 0 && b[0] == '{':
		h.raw = bytes.Clone(b)
	default:
		return fmt.Errorf("addresses: want an object, got %.20q", b)
	}
	return nil
}

// AddrSlots are one proxy's slots: its IPv4 slot and its IPv6 slot, 0
// where the plan has none of that family. A record writes them as the
// pair [v4, v6], a third of the bytes of an object with a hundred
// proxies a host.
type AddrSlots struct {
	V4 int
	V6 int
}

// MarshalJSON writes s as [v4, v6].
func (s AddrSlots) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]int{s.V4, s.V6})
}

// UnmarshalJSON reads [v4, v6]; slots are never negative.
func (s *AddrSlots) UnmarshalJSON(b []byte) error {
	var pair []int
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("slots: want [v4, v6]: %w", err)
	}
	if len(pair) != 2 || pair[0] < 0 || pair[1] < 0 {
		return fmt.Errorf("slots: want [v4, v6] of slots 0 or more, got %v", pair)
	}
	s.V4, s.V6 = pair[0], pair[1]
	return nil
}

// SlotSpace is what a host's record keeps of one family's slots besides
// who holds them: slots 1 to Next have been given at least once (or
// passed over by a proxy found holding a later one), and
// Freed says when slots not held now were last freed. A slot at most
// Next that is not held and not in Freed was freed long ago (entries are
// dropped once they no longer decide anything).
type SlotSpace struct {
	Next  int               `json:"next,omitempty"`
	Freed map[int]time.Time `json:"freed,omitempty"`
}

// IsZero says whether sp says nothing (encoding/json's omitzero).
func (sp SlotSpace) IsZero() bool { return sp.Next == 0 && len(sp.Freed) == 0 }

// Quarantined reports whether the host is in quarantine.
func (r HostRecord) Quarantined() bool { return r.State == HostQuarantined }
