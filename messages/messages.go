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
}

// RotationEntry is one proxy clients may use.
type RotationEntry struct {
	ID    string    `json:"id"`
	Addr  string    `json:"addr"`
	Host  string    `json:"host"`
	Since time.Time `json:"since"`
}

// Rotation is the snapshot published on <prefix>.rotation on every change.
type Rotation struct {
	V       int             `json:"v"`
	Version uint64          `json:"version"`
	Proxies []RotationEntry `json:"proxies"`
	At      time.Time       `json:"at"`
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
