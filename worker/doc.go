// Package worker turns proxy commands into converged proxies.
//
// Intake pulls commands from PROXY_CMDS, validates them, places each create
// on a host with room (reserving it in the host's record in PROXY_HOSTS with
// compare-and-set, skipping quarantined hosts), records each valid one as
// the proxy's desired state in PROXY_DESIRED (compare-and-set on the
// command's stream sequence, so the highest sequence wins whatever the
// redeliveries) and dispatches a work item to the proxy's host.
//
// Execution pulls work items from PROXY_WORK through one consumer per host.
// Each host consumer has a pinned priority group, so the server hands one
// host's work to one worker at a time and moves it to another when that
// worker stops pulling. Workers share the hosts: each keeps a record in
// PROXY_WORKERS and pulls only the hosts that a rendezvous assignment with
// bounded load, computed alike by every worker from the live records, gives
// it; handing a host over, it keeps the pin until the host's work in flight
// has ended. The executor reads the desired state and the
// observed proxy (through the Provider declared here) and converges them,
// publishing state events with a per-proxy seq that only grows.
//
// Retries happen only for transient errors, through NakWithDelay with an
// exponential, jittered backoff, for a bounded number of attempts; then the
// proxy is failed and the command dead-lettered. A host whose calls keep
// failing transiently is quarantined: its work waits, spending no attempt,
// until a probe finds it answering again.
//
// Streams and buckets are set-up's (package topology): Topology.Setup
// creates and updates them (it needs an admin credential) and a Repairer
// recreates any that is deleted. A worker never creates one; it waits for
// what is missing and refuses to start when one disagrees with its config.
// Its consumers are its own, configured as Config.Topology says: it creates
// or updates them at start and recreates them within CheckInterval when
// they are deleted under it.
//
// # Lifecycle
//
// A Worker runs as one call, Run(ctx) error: it
// starts (waiting for the topology, creating its consumers), consumes
// until ctx is done, then drains (says so in its record, stops pulling,
// lets in-flight work finish holding its pins, hands back the rest, unpins
// its hosts, deletes its record, all within DrainTimeout whether NATS
// answers or not) and
// returns nil; it returns the error that kept it from starting, or, after
// draining, its NATS connection closed for good. Every goroutine of the
// run starts through one lifecycle (lifecycle.go), in a stage that drain
// stops in one order: the membership's loop, the consumers' supervisors,
// what the handlers lean on, the writers of the hosts' records. The
// defaults of Config
// are the constants of package worker/defaults (config fills a file's gaps
// with them too), applied by its WithDefaults, which takes those of the
// settings it shares with its consumers from Topology.WithDefaults.
//
// # Files
//
// worker.go is Config, Worker and New; run.go is Run (start, drain);
// lifecycle.go the stages every goroutine of a run starts in, and the
// order drain stops them in;
// defaults.go applies the defaults. intake.go turns commands into desired
// state (desired.go) and work; executor.go converges one proxy, observe.go
// re-reads a host's proxies, redrive.go makes again those whose domain is
// gone and sweeps the volumes nothing uses (through a provider that is a
// Sweeper), and events.go publishes their state events.
// placement.go chooses a create's host; room.go reserves and releases room
// and reconciles it, roomknown.go holds a planned host's work until its
// domains' slots are recorded, both through hostrec.go, which writes a host's record in
// PROXY_HOSTS; quarantine.go keeps a host's failures and quarantine.
// Both run their messages on a pool (pool.go), which keeps each in
// progress and binds it to the fence (fence.go) that abandons work once
// cut off from NATS; locks.go serialises one proxy's work. consumers.go
// keeps a consumer consumed, and also waits for the streams and buckets
// and compares them with the config; handover.go starts and stops pulling
// a host, keeping its pin until its work has ended; sharing.go joins the
// sharing of the hosts over the workers, package worker/hostshare (the
// worker's record, the assignment, claims, pins, stray pins), through the
// interface it declares; backoff.go the retry delays; provider.go the
// Provider a host implements. The JetStream requests nats.go makes no call
// for (a desired record read through the leader, the batched reads of last
// events and records) go through package internal/jsapi; no file here
// spells an API subject.
package worker
