// Package worker turns proxy commands into converged proxies.
//
// Intake pulls commands from PROXY_CMDS, validates them, records each valid
// one as the proxy's desired state in PROXY_DESIRED (compare-and-set on the
// command's stream sequence, so the highest sequence wins whatever the
// redeliveries) and dispatches a work item to the proxy's host.
//
// Execution pulls work items from PROXY_WORK through one consumer per host.
// Each host consumer has a pinned priority group, so the server hands one
// host's work to one worker at a time and moves it to another when that
// worker stops pulling. The executor reads the desired state and the
// observed proxy (through the Provider declared here) and converges them,
// publishing state events with a per-proxy seq that only grows.
//
// Retries happen only for transient errors, through NakWithDelay with an
// exponential, jittered backoff, for a bounded number of attempts; then the
// proxy is failed and the command dead-lettered.
//
// Streams and buckets are set-up's: Topology.Setup creates and updates them
// (it needs an admin credential) and a Repairer recreates any that is
// deleted. A worker never creates one; it waits for what is missing and
// refuses to start when one disagrees with its config. Its consumers are its
// own: it creates or updates them at start and recreates them within
// CheckInterval when they are deleted under it.
package worker
