// Package rotation is the consumer library of proxyfleet's rotation: it
// follows the set of proxies clients may use now and picks one per
// request, so that a Go program uses the fleet in three lines:
//
//	rot, err := rotation.Follow(ctx, nc, rotation.Config{User: "fleet", Password: pw})
//	defer rot.Close()
//	client := &http.Client{Transport: &http.Transport{Proxy: rot.Proxy}}
//
// # What it follows
//
// Three sources, each watched rather than polled (client.Rotation reads the
// same three once):
//
//   - the KV bucket PROXY_ROTATION, the membership (key = proxy id, value =
//     ip:port), written by the publishing health process; a proxy is in the
//     rotation exactly while its key is there, and its Since is when the key
//     was written;
//   - the stream PROXY_EVENTS, through an ordered consumer that delivers the
//     last event of every proxy and then new ones: a proxy's Host and Labels
//     are its latest event's;
//   - the KV bucket PROXY_CHECKS (messages.CheckRecord): a proxy's Egress is
//     its record's, when the record is of the address the proxy has now.
//
// Ready is closed once all three have delivered their initial values, so a
// program that waits for it never picks from a half-read rotation. Only
// PROXY_ROTATION decides membership: a proxy whose event or check is
// missing (the stream or bucket gone, a consumer being remade) is still
// picked, with no host, labels or egress known; it is only passed over by a
// Selector that asks for labels, since it cannot be shown to have them.
//
// # Repairs
//
// A source that breaks is made anew: a KV watcher whose channel closes, an
// ordered consumer that reports missed heartbeats or a deleted consumer, or
// a stream or bucket found missing or created anew by the look at it every
// Config.CheckInterval (a stream info request; the only periodic request,
// needed because a bucket deleted and created again between two
// heartbeats would otherwise be resumed at a sequence of the old one). A
// new watcher or consumer reads every initial value again; at its end,
// what the new one did not deliver is dropped (a delete missed while
// broken). Each remake waits a backoff that grows to Config.RetryMax, is
// logged at error level and counted (Stats.Restarts). A stream or bucket
// that is missing (at start, or after a delete) is waited for, logged at
// error level once and then every 30 s, as health does: roles other than
// set-up never create them. Membership read before a break is kept until
// the remade watcher says otherwise.
//
// # Picking
//
// Pick chooses by the configured Strategy: round-robin (the default; each
// matching proxy in turn), random, or least-busy (the fewest requests in
// flight, counted by Acquire). PickSession maps a key (a user's session)
// to a proxy by rendezvous hashing (highest random weight) of the key and
// the proxy id, so a key stays on its proxy while that proxy stays, and
// when a proxy leaves only its keys move. A Selector narrows the choice by
// labels and excludes ids (a failover's tried ones). A proxy this process
// reported (Report) is passed over for Config.Cooldown while another
// matches; Report also publishes a messages.Report on
// <prefix>.report.<id>, on which health probes the proxy at once (a report
// never takes a proxy out by itself).
//
// The fleet may reach 50,000 proxies, so the work per change is O(1) (a
// proxy's index entries are updated in place) and a pick copies and sorts
// nothing: the rotation is held as a slice of members with positions (for
// round robin) and, per label key and value, a set of the same kind; a
// pick with labels walks the smallest set that one of its labels names.
// Pick and PickSession allocate nothing on success. Proxies (a sorted copy)
// is for listing, not for the request path.
//
// Of proxyfleet it imports only messages, the wire contract; it needs no
// more than the client role of deploy/nats/accounts.conf (reading
// PROXY_ROTATION, PROXY_EVENTS and PROXY_CHECKS, publishing reports).
package rotation
