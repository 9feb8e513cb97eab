package messages

import (
	"encoding/json"
	"time"
)

// Version is the only wire version this build speaks.
const Version = 1

// MaxBodySize bounds every body. It is far below NATS's default payload
// limit (1 MiB) so that an oversized body still reaches intake and is
// rejected with its field named instead of being refused by the server.
const MaxBodySize = 64 << 10

// Operations.
const (
	OpCreate = "create"
	OpDelete = "delete"
)

// Result outcomes.
const (
	OutcomeAccepted   = "accepted"
	OutcomeRejected   = "rejected"
	OutcomeSuperseded = "superseded"
	OutcomeDone       = "done"
	OutcomeFailed     = "failed"
)

// Proxy states.
const (
	StateProvisioning = "provisioning"
	StateRunning      = "running"
	StateFailed       = "failed"
	StateDeleting     = "deleting"
	StateDeleted      = "deleted"
)

// Address sources.
const (
	SourceAgent = "agent"
	SourceLease = "lease"
	SourceARP   = "arp"
	SourceSim   = "sim"
	// SourcePlan is an address the host's address plan gave the proxy:
	// known before the guest boots, and checked against the guest agent's
	// report where the agent answers.
	SourcePlan = "plan"
)

// Limits on a create's sizes.
const (
	MinCPUs      = 1
	MaxCPUs      = 64
	MinMemoryMiB = 64
	MaxMemoryMiB = 256 << 10
	MaxLabels    = 32
)

// CreateCommand is published by clients on <prefix>.cmd.create.<id>.
// Zero values of optional fields mean "use the configured default".
type CreateCommand struct {
	V         int               `json:"v"`
	ID        string            `json:"id"`
	Host      string            `json:"host,omitempty"`
	Image     string            `json:"image,omitempty"`
	CPUs      int               `json:"cpus,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// DeleteCommand is published by clients on <prefix>.cmd.delete.<id>.
type DeleteCommand struct {
	V  int    `json:"v"`
	ID string `json:"id"`
}

// Result answers one command on <prefix>.result.<id>.
type Result struct {
	V         int       `json:"v"`
	ID        string    `json:"id"`
	CommandID string    `json:"command_id"`
	Op        string    `json:"op"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason"`
	Field     string    `json:"field"`
	Class     string    `json:"class"`
	At        time.Time `json:"at"`
}

// StateEvent reports a proxy's observed state on <prefix>.state.<id>.
// Seq grows by one per event of a proxy and never goes back, also across
// workers and crashes.
type StateEvent struct {
	V         int    `json:"v"`
	ID        string `json:"id"`
	State     string `json:"state"`
	Host      string `json:"host"`
	IP        string `json:"ip"`
	Port      int    `json:"port"`
	Source    string `json:"source"`
	Reason    string `json:"reason"`
	Class     string `json:"class"`
	CommandID string `json:"command_id"`
	// CommandSeq is the PROXY_CMDS sequence of that command (0 from
	// publishers older than it): no event of an older command is stored
	// after one of a newer command.
	CommandSeq uint64    `json:"command_seq,omitempty"`
	Seq        uint64    `json:"seq"`
	At         time.Time `json:"at"`
	// Labels are the labels of the create command this event reports on
	// (its desired record's), so that readers of the events (health, the
	// rotation's consumers) can select proxies by label. Added to the
	// contract: optional, absent when the proxy has none and from older
	// workers.
	Labels map[string]string `json:"labels,omitempty"`
	// Egress are the addresses the proxy's host's address plan gave it,
	// the addresses its requests may leave from (its IPv4 address first),
	// on a running event, written as CompactEgress writes them (an
	// aligned run of addresses as its prefix). Added to the contract:
	// optional, absent for a proxy left to its network's DHCP and from
	// older workers.
	Egress []string `json:"egress,omitempty"`
}

// RotationEntry is one proxy clients may use.
type RotationEntry struct {
	ID    string    `json:"id"`
	Addr  string    `json:"addr"`
	Host  string    `json:"host"`
	Since time.Time `json:"since"`
	// Egress is the address the probe target saw the proxy's requests
	// come from (its public address), when health's probe target reports
	// it. Added to the contract: optional, absent when unknown.
	Egress string `json:"egress,omitempty"`
	// Labels are the proxy's labels (from its create command, through
	// its state events). Optional, absent when it has none.
	Labels map[string]string `json:"labels,omitempty"`
	// EgressAddrs are the addresses its host's address plan gave it, the
	// addresses a client may ask it to leave from (its running event's
	// Egress, written as CompactEgress writes them). Added to the
	// contract: optional, absent for a proxy left to its network's DHCP.
	EgressAddrs []string `json:"egress_addrs,omitempty"`
}

// Verdicts of health's checks of a proxy (CheckRecord.Verdict).
const (
	// VerdictOK: the proxy passed its checks (refused a request without
	// credentials where credentials are required; added no header that
	// carries the client's address).
	VerdictOK = "ok"
	// VerdictOpen: the proxy answered a request that carried no
	// credentials, though the fleet's proxies require them. Never in the
	// rotation.
	VerdictOpen = "open"
	// VerdictLeaky: the proxy's requests reached the target carrying the
	// client's address (or the fleet's credentials) in a header. Never
	// in the rotation.
	VerdictLeaky = "leaky"
	// VerdictMismatch: the proxy's requests reached the target from an
	// address its host's plan did not give it (a NAT left in place, a
	// wrong route): it does not leave from the addresses it stands for.
	// Never in the rotation.
	VerdictMismatch = "mismatch"
)

// CheckRecord is what the publishing health process found of one proxy
// candidate, in the bucket PROXY_CHECKS (key = proxy id): the address it
// checked, the egress address its probe target saw, and whether the proxy
// is refused and why. It is written when any of these change and deleted
// when the proxy stops being a candidate. A proxy is in the rotation only
// with verdict ok (or none yet: probes that check nothing, as for sim
// hosts).
type CheckRecord struct {
	V       int       `json:"v"`
	ID      string    `json:"id"`
	Addr    string    `json:"addr"`
	Egress  string    `json:"egress,omitempty"`
	Verdict string    `json:"verdict"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at"`
}

// Rotation is the whole rotation at one version: the snapshot published on
// <prefix>.rotation (at most once per health.snapshot_interval, see
// RotationTruncated) and served on GET /rotation. Proxies are sorted by id.
type Rotation struct {
	V       int             `json:"v"`
	Version uint64          `json:"version"`
	Proxies []RotationEntry `json:"proxies"`
	At      time.Time       `json:"at"`
	// Truncated says that the snapshot did not fit in one message (NATS's
	// max_payload, or health.snapshot_max_bytes): Proxies is null, Size
	// and Bytes say how large it is, and Feed names the subject of the
	// rotation's changes, which a subscriber follows instead (see
	// RotationChanges). Added to the contract: optional, absent on a
	// whole snapshot.
	Truncated bool `json:"truncated,omitempty"`
	// Size is the number of proxies in the rotation (on a truncated
	// snapshot).
	Size int `json:"size,omitempty"`
	// Bytes is the size the whole snapshot would have (on a truncated
	// snapshot).
	Bytes int `json:"bytes,omitempty"`
	// Feed is the subject of the rotation's changes (on a truncated
	// snapshot).
	Feed string `json:"feed,omitempty"`
}

// Report says that a proxy failed a consumer of the rotation (a gateway,
// a program using package rotation), on <prefix>.report.<id>. Health
// probes the proxy at once and counts a failure only if its own probe
// fails: a report never removes a proxy by itself.
type Report struct {
	V  int    `json:"v"`
	ID string `json:"id"`
	// Addr is the address that failed (ip:port); a report of an address
	// the proxy no longer has is ignored.
	Addr string `json:"addr,omitempty"`
	// Reason says what failed: "connect: connection refused", "CONNECT
	// answered 502", "timeout"... (at most 256 bytes are kept).
	Reason string `json:"reason"`
	// By names the reporter (a gateway instance), for the logs.
	By string    `json:"by,omitempty"`
	At time.Time `json:"at"`
}

// DeadLetter is a command that ran out of attempts, on <prefix>.dead.<id>.
type DeadLetter struct {
	V         int             `json:"v"`
	ID        string          `json:"id"`
	CommandID string          `json:"command_id"`
	Op        string          `json:"op"`
	Seq       uint64          `json:"seq"`
	Attempts  int             `json:"attempts"`
	LastError string          `json:"last_error"`
	Class     string          `json:"class"`
	Command   json.RawMessage `json:"command,omitempty"`
	At        time.Time       `json:"at"`
}
