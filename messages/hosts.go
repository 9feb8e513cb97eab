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
	// cool-down (CoolDownMS).
	Until      time.Time `json:"until,omitzero"`
	CoolDownMS int64     `json:"cool_down_ms,omitempty"`
	// Reason is the failure that quarantined the host (or kept it).
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// Quarantined reports whether the host is in quarantine.
func (r HostRecord) Quarantined() bool { return r.State == HostQuarantined }
