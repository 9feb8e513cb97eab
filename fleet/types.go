package fleet

import "time"

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
}
