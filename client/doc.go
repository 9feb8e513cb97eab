// Package client is the library behind proxyfleet's client verbs: it
// publishes create and delete commands (and waits for their outcome), reads
// a proxy's latest state and result (and its desired record, when the user
// may read it), lists the fleet, reads the rotation and the hosts (Hosts:
// owners, room, quarantine) and watches state events live (Watch returns a stream of updates; PrintWatch renders one).
// It needs no more than the client role of deploy/nats/accounts.conf, and
// of proxyfleet it imports only messages, the wire contract.
//
// It parses no flags, never exits the process and writes only to the
// io.Writer it is given, so cmd/proxyfleet (or any other program) can wire
// it up. Every value it returns encodes to JSON as is, for a --json output.
package client
