package messages

import "time"

// Desired is a proxy's desired state, the value of its key in PROXY_DESIRED
// (BucketDesired): the worker's intake writes it, the executors converge on
// it, and clients that may read the bucket show it. Records are never
// removed: a delete leaves a record with Op "delete", so that an older
// command arriving late still finds a higher Seq and is superseded.
type Desired struct {
	V         int               `json:"v"`
	ID        string            `json:"id"`
	Op        string            `json:"op"`
	Seq       uint64            `json:"seq"` // PROXY_CMDS sequence of the command
	CommandID string            `json:"command_id"`
	Host      string            `json:"host"`
	PrevHost  string            `json:"prev_host,omitempty"` // where it ran before a move, to clean up
	Image     string            `json:"image,omitempty"`
	CPUs      int               `json:"cpus,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	SpecHash  string            `json:"spec_hash,omitempty"`
	At        time.Time         `json:"at"`
}
