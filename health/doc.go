// Package health is proxyfleet's health consumer: it folds the proxies'
// state events and its own probes of them into the rotation, the set of
// proxies clients may use right now, and publishes it.
//
// # The fold
//
// Fold is the rotation as a pure function of the events and probe results
// seen so far: no NATS, no HTTP, no goroutines, and the time only through
// an injected clock and the times given to it. Each proxy keeps its last
// event's seq; an event at or below it is ignored, so duplicates,
// redeliveries and late arrivals change nothing, and a deleted proxy's seq
// stays as a tombstone. running with an address makes a proxy a candidate
// at that address; it enters the rotation after Rise passing probes in a
// row and leaves after Fall failing ones (and, still running, keeps being
// probed so it can come back). failed, deleting and deleted take it out at
// once and forget its counters; provisioning without an address (a
// restarted guest agent, the open half of H3) keeps its last address and
// place for a grace period, probed at that address meanwhile, after which
// Tick demotes it. The grace is only for the command and host that put the
// proxy in the rotation: a provisioning (or address-less running) event
// with another command_id or host is a re-create, a spec change or a move,
// and takes the old address out at once. Probe results are inputs like
// events (ApplyProbe): each carries the epoch of the candidate it was
// taken for, so a result that arrives after a delete or an address change
// is ignored, and one proxy's timeouts only ever count against that proxy.
// A proxy whose running event came from the sim driver (source sim) enters
// on that event and is never probed: its address is made up and it carries
// no traffic (the sim fleets and benchmarks rely on it). What a probe finds
// besides pass or fail (an egress, a leak, an open proxy; see below) is an
// input like any other, and which probes must check for an open proxy is
// the fold's to say (Target.CheckOpen), from the times given to it.
//
// Keeping the fold pure is what makes it cheap to trust: every rule is a
// test over plain values, with no server and no sleeps; every health
// process that reads the same events computes nearly the same rotation
// (probes taken from elsewhere may differ), so a standby can take over
// publishing without a hand-over; and the I/O around it (the consumer, the
// prober, the lease, the bucket, the snapshots, HTTP) is a thin shell that
// moves events and results in and snapshots out.
//
// # Probing
//
// A Prober checks one proxy; the fold never sees the network, and tests
// give it a fake. HTTPProber sends a request through the proxy as an HTTP
// forward proxy (a GET with an absolute URI, or CONNECT for an https
// target) to the configured target, with a fresh random nonce in the
// query, and passes only on a 200 whose body holds the nonce (or the
// configured expected value): a proxy answering from a cache, a captive
// page or an error page fails, and so does a port that merely accepts
// connections. By default the target is the health process's own
// GET /probe?nonce=N, served on ProbeListen, an address the guests can
// reach; an operator may point Target elsewhere (another health process's
// /probe, or any page with Expect). With none of Prober, Target and
// ProbeListen (the sim driver's fleets, or a config that forgot them),
// health probes a TCP connect to each proxy's address (TCPProber), so a VM
// with nothing listening on its proxy port never enters; this is logged
// once at warn level and shown by proxyfleet_health_probing 0. It proves
// nothing more: no credentials, egress, leak or open check.
//
// Probing goes in rounds, one per Interval: every candidate once, at most
// Concurrency probes at a time (so thousands of proxies never mean
// thousands of sockets; connections are not kept alive), each bounded by
// Timeout, a panic recovered and counted as a failure. Rounds never
// overlap; a round longer than the interval delays the next one rather
// than failing anyone. A rising candidate (Fold.Rising: running, not yet
// in the rotation, no failure since its last pass, not refused) is not
// left to the rounds: it is probed as soon as its event is folded and
// again as soon as each probe passes, ahead of the round's probes and
// within the same Concurrency, so a new proxy enters the rotation as soon
// as it passes Rise probes in a row (milliseconds, not Rise intervals).
// One that fails, or is refused, waits for the rounds, so a proxy that is
// down or misconfigured is never probed in a loop. A proxy has at most one
// probe in flight: one asked for while another is in flight is taken once
// that one ends. Both kinds of request are written by hand on a connection
// of their own (the bytes net/http would send), without a transport's
// goroutines and buffers per probe; for an https target, CONNECT, then TLS
// (crypto/tls, the target's name verified) and the GET inside the tunnel.
// Writing the CONNECT by hand is also what lets the prober tell the
// proxy's answer to it (a 407) from the target's.
//
// # What a probe verifies
//
// The fleet's proxies require Basic credentials (Config.ProxyUser and
// ProxyPassword, the fleet's proxy.auth), may be limited to source
// addresses, and must add no header that reveals their client. A probe
// checks the three:
//
//   - Credentials. Every request carries Proxy-Authorization: Basic, on
//     the GET for an http target and on the CONNECT for an https one
//     (never inside the tunnel). The password is in no log line, error,
//     metric or message: the prober keeps only the encoded header, and
//     cuts the credentials out of any error text, since a proxy's
//     malformed answer (an echo of the request) ends up quoted in
//     net/http's errors; reasons name headers, never their values.
//   - Open proxies. With credentials and an HTTP prober, a probe the fold
//     marks (every probe of a candidate not in the rotation, and of one in
//     it whose last conclusive check is OpenCheckInterval old, default 1m)
//     sends the same request again without them, once the first passed.
//     If it reaches the target (the same pass: a 200 with the nonce), the
//     proxy is open: it never enters, and one in the rotation leaves at
//     once (reason "open proxy: answered a request without credentials").
//     Any other answer (407, 403, another status or body, the proxy closing
//     the connection) is a refusal. A timeout, no connection, or a CONNECT
//     granted without credentials whose tunnel then fails is
//     inconclusive: it admits nothing (a candidate waits for a conclusive
//     check) and takes nobody out (the next probe checks again). So a
//     candidate enters only after Rise passes in a row and an open check,
//     its last, that was conclusive and refused.
//   - Leaks and egress. Health's own /probe answers the nonce alone on the
//     first line, then one line of JSON reporting the request that reached
//     it (see ProbeHandler): the address it came from (the proxy's egress)
//     and its headers (at most 64 lines and 8 KiB, credentials' values
//     replaced). The prober parses it strictly (exactly that shape, or no
//     report at all) and finds the proxy leaky if a header value holds the
//     client's address (this end of the prober's connection to the proxy,
//     as a whole address: X-Forwarded-For, Forwarded, Via...), or if
//     Proxy-Authorization reached the target (the proxy forwarded the
//     fleet's credentials); the reason names the header. A leaky proxy is
//     out like an open one. A proxy whose running event carries egress
//     addresses (its host's plan) and whose request came from another
//     address is out too: verdict mismatch, reason "egress mismatch: …". The egress goes into the fold, the snapshots'
//     entries (RotationEntry.Egress) and the check records. A target that
//     does not answer in this format (an external page, an earlier health
//     process, most https targets) yields no egress and no leak verdict:
//     the probe passes or fails on the nonce as before. Behind a load
//     balancer that rewrites the source address, the egress is the
//     balancer's.
//
// A refused proxy keeps being probed at the rounds' cadence, and a later
// conclusive clean finding clears its verdict (a refusing open check for
// an open one, a report without the header for a leaky one): nothing
// transient removes a healthy proxy for good. Proxies of the sim driver
// are admitted on their event with any prober, as they have no address to
// probe.
//
// A change of the egress of a proxy in the rotation is a change of its
// entry (on the feed, in the snapshot), not of PROXY_ROTATION (whose value
// is the address).
//
// # Checks
//
// The lease holder also writes PROXY_CHECKS: a messages.CheckRecord per
// candidate that has been checked (key = id; the address checked, the
// egress, the verdict ok, open or leaky, the reason, when it changed). A
// record is written when its address, egress, verdict or reason changes,
// never on a probe that found the same, so writes follow changes and not
// probes; it is deleted when the proxy stops being a candidate (failed,
// deleting, deleted, or a new address, whose record starts afresh). A
// candidate nothing conclusive is known of (no report, and with
// credentials no conclusive open check) has no record yet; with a TCP
// prober or a target that reports nothing and no credentials, none ever.
// On the first write after taking the lease (or after a failure) the
// writer reads the whole bucket and rewrites what differs from its fold;
// a candidate it has not checked yet keeps the record of its address that
// is there, so a restart or a takeover deletes nothing it has not looked
// at. Standbys compute the same records (served on their /checks) and
// write nothing. The keeper and the writer of PROXY_CHECKS are goroutines
// of their own: the records are a report, and a bucket that is missing,
// slow or refused to this process must never hold up the rotation. Every
// request ends before the lease's validity, as the rotation's do.
//
// # Publishing: the feed, its pages, the snapshot
//
// The lease holder publishes the rotation three ways, each costing
// O(change) per change whatever the size of the fleet:
//
//   - The feed, <prefix>.rotation.changes (messages.RotationChanges): the
//     fold marks the ids whose entry may have changed (Fold.TakeDirty);
//     the loop compares those alone with its view of what it published
//     (view.go: every entry with its JSON encoding, the ids in sorted
//     chunks, the encoded size) and sends the changes (entered and changed
//     with the whole entry, left with the id) in messages of at most
//     MaxBodySize, each with the version it brings and the one it follows.
//     Per message: a lease write (its version), the puts and deletes of
//     PROXY_ROTATION for its changes (up to 32 at a time), then the
//     message; so the bucket is never behind the feed. The first message
//     of a lease (and the one after a message that could not be sent)
//     lists nothing and follows no version (prev 0): the bucket is
//     reconciled with the whole rotation first (the one O(fleet) step,
//     per takeover), and consumers read the pages again, since this
//     process's rotation may differ from what the last publisher said. With
//     nothing to say for a third of the lease's TTL, a heartbeat repeats the
//     version (prev = version), so a consumer that lost the last message
//     learns it. The last 1 MiB of messages are kept for GET
//     /rotation?since=V.
//   - The pages, <prefix>.rotation.get (pages.go): request/reply, each page
//     the published view's proxies after an id, sorted, at most MaxBodySize;
//     answered only by a holder that has published (the subscription
//     follows the lease), so with none a request finds no responders at
//     once. A consumer subscribes to the feed, reads the pages, applies the
//     kept messages after the first page's version: exact (see
//     messages.RotationChanges and feed_test.go).
//   - The snapshot, <prefix>.rotation (messages.Rotation, v1): the view
//     joined from its encodings, at most once per SnapshotInterval (the
//     latest version), since it costs O(fleet) bytes, and after one of B
//     bytes not before B/SnapshotRate has passed. One larger than the
//     server's max_payload (or SnapshotMaxBytes), as the view's tracked size
//     says without encoding anything, is replaced by a notice (Truncated,
//     Size, Bytes, Feed; Proxies null): counted, logged at error level once
//     when the rotation stops fitting and at info level once when it fits
//     again, never a silent stale snapshot.
//
// PROXY_CHECKS is written the same way: the fold marks the ids whose
// record may have changed, and the writer looks at those alone, the whole
// bucket only after taking the lease or a failure.
//
// # One publisher at a time
//
// Every health process consumes and folds; only the holder of a lease in
// the KV bucket PROXY_LEASES (key LeaseKey) writes PROXY_ROTATION,
// publishes the feed and the snapshot, and answers the pages. Two
// publishers would interleave puts and deletes of the bucket from slightly
// different folds, and their versions would mean nothing. The lease is
// taken with Create, renewed every third of LeaseTTL with
// compare-and-set on its revision, and released (deleted at its revision)
// when Run stops. The bucket's own TTL (1m, set by the
// set-up step that creates it) only clears a lease nobody renews; expiry is read
// from the lease itself: a standby that sees the same revision for the
// TTL the holder wrote in the value, by the standby's own clock (so clocks
// need not agree), takes it over with compare-and-set. Per-key TTLs
// (jetstream.KeyTTL) would need LimitMarkerTTL on the bucket, which it
// does not have. Before each publish the holder renews the lease once
// more: a holder that lost it learns so before writing, and every request
// of the publish must end before the lease's validity (the time the
// renewal was sent, plus the TTL less a tenth), so a holder that was
// paused stops writing before a standby can take over.
//
// Standbys probe too. The alternative, sparing the proxies half the
// probes, leaves a standby with no counters when it takes over: it would
// have to publish a rotation it has not checked, or empty it while it
// rises. A probe is one small request per proxy per interval per process,
// and a hot standby's rotation (served on its /rotation) is ready at once.
// When it takes over it also adopts the proxies of PROXY_ROTATION that it
// has as running at the same address but not yet risen, so a takeover
// removes no passing proxy; Fall failures take out any that do not pass.
//
// # Versions
//
// A version (of a feed message, a page, a snapshot) is the revision (the
// stream sequence) of the lease write that allowed its publish, or one more than the last version the
// lease's value records if that is higher. Stream sequences only grow, in
// one process, across processes, across takeovers (the new holder's
// writes come after the old one's) and across restarts, even after the
// lease key has aged out of the bucket: so versions never go back, and
// need no store of their own. They skip (renewals use revisions too);
// published versions strictly grow, which is all a client may rely on.
// The value also records the last version published, for a standby's
// /rotation and as a floor should the bucket ever be created anew.
//
// # Starting from what is published
//
// At start, before consuming, the process loads PROXY_ROTATION into the
// fold as proxies that have already risen (Seed): a restart never empties
// the rotation while the process probes again. Events then apply as usual:
// a running event at the same address confirms a loaded proxy; another
// address, or failed, deleting, deleted, takes it out; provisioning starts
// its grace. Once caught up, loaded proxies no event spoke of are dropped
// (their deleted event aged out). From then on probes decide.
//
// # The consumer
//
// Health reads PROXY_EVENTS with a consumer of its own (named
// health-<instance>-<n>, in memory, without acks) that delivers the last
// event of every proxy first (DeliverLastPerSubjectPolicy over
// <prefix>.state.>), so a process that starts late rebuilds the whole
// picture, then follows new events. It publishes nothing until it has
// caught up with what the stream held when it started (a partial picture
// would look like proxies leaving); then, if it holds the lease, it
// reconciles PROXY_ROTATION with the fold (puts what differs, deletes keys
// of proxies not in the rotation), publishes the feed's first message and
// a snapshot and, from then on, publishes every change (see "Publishing").
// When publishing falls behind, the changes of the ids marked meanwhile go
// out together, each proxy's latest once. A failed publish is retried
// after reading the bucket again. It serves GET /rotation (503 until
// caught up; the holder's published view, a standby's own fold at the
// last version it knows was published; entries with their egress; the
// version as ETag, If-None-Match, and ?since=V: see Handler; header
// X-Proxyfleet-Lease says holder or standby), /checks (this
// process's check records, sorted by id: which proxies are refused and
// why), /healthz (liveness: 200 while it serves), /readyz (503 until
// caught up, while a stream or bucket it needs is gone, or while
// publishing, writing the check records or reading the lease fails),
// /metrics (client_golang's exposition of Config.Registry: rotation size,
// churn, probe outcomes by result and by kind, a probe latency histogram,
// a histogram of the wait from a running event to admission (latency.go),
// open checks by result, refused proxies and refusals by verdict, the
// lease holder flag, consumer repairs, the feed's changes, bytes, resets,
// heartbeats and errors, pages by result, the snapshot's size and
// notices, GET /rotation by answer) and /probe. No metric is registered
// globally, and none is labelled by proxy.
//
// Events are decoded leniently about unknown fields (a newer worker may add
// some) and strictly about the version and the id against the subject's.
//
// # Repairs
//
// Health creates no stream and no bucket: a set-up step with the right to
// (proxyfleet setup, which serve runs on its embedded server) does. Run
// binds PROXY_EVENTS, PROXY_ROTATION and PROXY_LEASES if they are there;
// each one missing is logged at error level (and again every minute while
// it stays missing), named by /readyz and counted in
// proxyfleet_health_topology_missing, and a keeper goroutine binds them
// once they are back. PROXY_CHECKS is treated alike by a keeper of its
// own, except that its absence holds nothing else up: the rotation is
// consumed, probed and published without it, and the records are written
// once it is there (created anew, it is filled again from the fold). Only
// a setting that disagrees with what exists (a lease longer than the
// leases bucket's TTL) keeps Run from starting.
//
// The keeper then looks every CheckInterval at the buckets, the stream and
// the consumer, and at once when the consumer reports trouble. It makes
// the consumer anew when it was deleted (the server says so to the pending
// pull; or, if that word was lost, missing heartbeats or a pull nobody
// answers make it look, and the consumer's info is not found), when
// deliveries skip or delivered events never arrive (lost in transit), and
// when the stream was created anew (its creation time changed; logged at
// error level, since its sequences may have started again). A stream that
// is gone stops the consumer; the rotation is kept as it is until the
// stream is back. Each repair starts from the last event of every proxy
// again, which is a valid resume at any point: the fold ignores what it
// has seen newer. It is logged at error level and counted in
// proxyfleet_health_consumer_repairs_total. A bucket deleted and created
// anew needs no repair: the next publish, which fails while it is gone,
// reads it again; a leases bucket created anew has no lease, and the
// holder takes it again.
//
// # Lifecycle
//
// Run is a process's whole life: it listens, binds, consumes, probes and
// publishes until its context ends, then deletes its consumer, releases
// the lease and shuts HTTP down, and returns nil. It returns early the
// error that kept it from starting, and after stopping what ended it: a
// server of its that stopped serving, or its NATS connection closed for
// good. The defaults live in Config.WithDefaults (package config takes
// its own from there).
//
// Left open: the leak check knows the client's address only as this end
// of the prober's connection, so a network that rewrites it on the way to
// the proxy (a NAT between health and the guests) hides an X-Forwarded-For
// of the rewritten address; telling forwarding headers by their name alone
// was left out, because a proxy chain or an HTTP ingress in front of the
// target adds them legitimately. A TCP prober checks neither credentials
// nor anything else. A probe is not spread over the interval (a round
// starts all at once, bounded by Concurrency); a request in flight when a
// paused holder's validity ends may still land (the margin is a tenth of
// the TTL); a leases bucket deleted and created anew restarts the
// revisions: a process that publishes on keeps its versions growing from
// the last one it knows, but one that starts afresh after that may go
// back.
package health
