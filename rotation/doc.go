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
// The rotation's feed and its pages, both answered by the health process
// that holds the publisher's lease (see messages.RotationChanges):
//
//   - it subscribes to <prefix>.rotation.changes, keeping what arrives;
//   - it reads the whole rotation in pages on <prefix>.rotation.get, each
//     at most 64 KiB, whose versions may grow from one page to the next
//     while the rotation moves on;
//   - it applies the kept messages after the first page's version, in
//     order: every change is the whole entry of one proxy (or its
//     leaving), so applying one again is harmless, and once the version
//     held reaches the last page's the members are exactly the rotation
//     at that version (their number is then checked against each
//     message's size);
//   - from then on it applies each message whose prev is the version it
//     holds. A proxy's Host, Labels, Egress and Since come with its entry.
//
// Ready is closed once the pages have been read, so a program that waits
// for it never picks from a half-read rotation. The cost per change is one
// small message (a proxy's entry, about 200 bytes) whatever the size of
// the fleet; only a read of the pages is O(fleet), and it happens at the
// start and after a gap.
//
// Read reads the rotation once by the same protocol, keeping no Rotation:
// it waits until the feed has brought the last page's version, so what it
// returns is the rotation exactly at one version of the publisher's (for
// a program that lists it once, such as package client).
//
// # Gaps
//
// A message whose prev is not the version held means one was lost (a
// reconnect, a slow subscription) or a new publisher speaks (prev 0: a
// takeover of the lease, whose rotation may differ from the old
// publisher's in ways no message says): the rotation is read again, and
// what the pages no longer hold is dropped. When the feed is silent for
// Config.CheckInterval (health repeats its version every third of its
// lease's TTL, 5s by default, when it has nothing else to say), one page
// of one proxy is asked for: its version is the publisher's, and one that
// the feed has not brought by the next look means a lost message. Each
// read again is counted (Stats.Restarts): at info level for a new
// publisher, at warn level for a gap. With no health process answering
// (none runs, or none holds the lease yet), the rotation is kept as it is,
// and the pages are asked for again with a backoff that grows to
// Config.RetryMax, logged at info level at first and at error level once
// that lasts 30 s (then every 30 s). It depends neither on the snapshot
// subject (<prefix>.rotation, which a large rotation outgrows) nor on
// PROXY_ROTATION, PROXY_EVENTS or PROXY_CHECKS.
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
// proxy's index entries are updated in place: O(its labels)) and a pick copies and sorts
// nothing: the rotation is held as a slice of members with positions (for
// round robin) and, per label key and value, a set of the same kind; a
// pick with labels walks the smallest set that one of its labels names.
// Pick and PickSession allocate nothing on success. Proxies (a sorted copy)
// is for listing, not for the request path.
//
// Run also follows PROXY_BANS (package bans) into memory: Banned(addr,
// site) tells, in O(1) and without allocating, whether an egress address
// is banned for a request's site (bans.Site of its host). Ban and AddBan
// ask health, on <prefix>.ban, to store a ban every follower then sees;
// the ban holds in the asking process at once (HoldBan alone does only
// that). AskBan sends a request without a Rotation. BansReady is closed
// once the bucket was read whole.
//
// Of proxyfleet it imports only messages, the wire contract, and bans;
// it needs no more than the client role of deploy/nats/accounts.conf
// (subscribing to the feed, asking for its pages, publishing reports,
// asking for bans and reading PROXY_BANS).
package rotation
