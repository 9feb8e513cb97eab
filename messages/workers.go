package messages

import "time"

// Worker states in a WorkerRecord.
const (
	WorkerActive   = "active"   // pulling work for its share of the hosts
	WorkerDraining = "draining" // stopping: handing its hosts over
)

// WorkerRecord is a worker's heartbeat, the value of its key (its id) in
// BucketWorkers. Workers renew it well within the bucket's TTL, so a worker
// that died ages out; the live records are the membership every worker
// computes its share of the hosts from.
type WorkerRecord struct {
	V  int    `json:"v"`
	ID string `json:"id"` // stable and readable: hostname-pid, or --id
	// State is WorkerActive or WorkerDraining.
	State string `json:"state"`
	// Hosts are the hosts this worker executes (its providers).
	Hosts []string `json:"hosts"`
	// Pulling are the hosts it pulls now: its share, and any whose
	// assigned worker does not pull them.
	Pulling []string `json:"pulling,omitempty"`
	// Owned are the hosts whose work consumer it holds the pin of now.
	Owned []string `json:"owned"`
	// Pins are, by owned host, the pin id the server gave this worker:
	// the PinnedClientID of the host's work consumer while it owns it, by
	// which a reader of consumer info can name the owner.
	Pins    map[string]string `json:"pins,omitempty"`
	Started time.Time         `json:"started"`
	At      time.Time         `json:"at"`
}
