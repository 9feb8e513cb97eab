// Package health is proxyfleet's health consumer: it folds the proxies'
// state events and its own probes of them into the rotation, the set of
// proxies clients may use right now, and publishes it.
//
// # What it reads, what it writes
//
// Health reads PROXY_EVENTS with a consumer of its own (named
// health-<instance>-<n>, in memory, without acks, delivering the last event
// of every proxy first), so a process that starts late rebuilds the whole
// picture. Events are decoded leniently about unknown fields and strictly
// about the version and the id against the subject's. It publishes nothing
// until it has caught up with what the stream held when it started. Every
// health process folds and probes; only the holder of the lease (key
// LeaseKey of PROXY_LEASES) writes PROXY_ROTATION and PROXY_CHECKS,
// publishes the feed and the snapshot, and answers the pages.
//
// # The fold
//
// Fold is the rotation as a pure function of the events and probe results
// seen so far. The doc of Fold, in fold.go, is the one statement of its
// rules (who enters and leaves, grace, epochs, verdicts, the egress
// addresses probes name, seeding at start and adoption on a takeover);
// everything else in the package is the I/O around it.
//
// # Probing
//
// A Prober checks one proxy; tests give the fold a fake. Which prober a
// process uses is Config's "Probing". An HTTPProber sends a request
// through the proxy, with the fleet's credentials, to a target that must
// answer a fresh nonce (Target, or this process's own GET /probe served on
// ProbeListen; see ProbeHandler), and can check for an open proxy and read
// the egress and the headers the target saw. IPv6 egress addresses are
// probed through TargetIPv6 or ProbeListenIPv6's /probe; with neither (the
// default) they are not named, and the gauge
// proxyfleet_health_egress_target{family="ipv6"} is 0. With no target at
// all, a TCP connect is all that is probed (TCPProber, logged at warn
// level, proxyfleet_health_probing 0).
//
// Probing goes in rounds, one per Interval: every candidate once, at most
// Concurrency probes at a time, each bounded by Timeout, a panic counted
// as a failure. Rounds never overlap; a long round delays the next. A
// rising candidate (Fold.Rising) is probed as soon as its event is folded
// and again after each pass, ahead of the round, so a new proxy enters
// after Rise passes, not Rise intervals. A proxy never has two probes in
// flight. A report (report.go, <prefix>.report.<id>) asks for a probe at
// once, bounded by ReportInterval per proxy and ReportRate over all; only
// the probe counts.
//
// # Checks
//
// The lease holder writes a messages.CheckRecord per checked candidate to
// PROXY_CHECKS (key = id) when its address, egress, verdict or reason
// changes, never per probe, and deletes it when the proxy stops being a
// candidate. After taking the lease (or a failure) it reconciles the whole
// bucket with its fold, keeping the record of a candidate it has not
// checked yet. Standbys compute the same records (their /checks) and write
// nothing. The keeper and the writer of PROXY_CHECKS run on their own: a
// bucket that is missing, slow or refused never holds up the rotation.
//
// # Publishing
//
// The lease holder publishes the rotation three ways, each costing
// O(change) per change whatever the size of the fleet (the fold marks the
// ids that may have changed, Fold.TakeDirty; the view in view.go keeps
// each published entry with its encoding):
//
//   - The feed, <prefix>.rotation.changes (messages.RotationChanges): the
//     changes in messages of at most MaxBodySize, each with the version it
//     brings and the one it follows. Per message: a lease write (its
//     version), the puts and deletes of PROXY_ROTATION for its changes,
//     then the message, so the bucket is never behind the feed. The first
//     message of a lease, and the one after a message that could not be
//     sent, follows no version (prev 0), after the bucket was reconciled
//     with the whole rotation: consumers read the pages again. With nothing
//     to say for a third of the lease's TTL, a heartbeat repeats the
//     version. The last 1 MiB of messages are kept for GET /rotation?since=V.
//   - The pages, <prefix>.rotation.get (pages.go): request/reply, the
//     published view's proxies after an id, sorted, at most MaxBodySize a
//     page; answered only by a holder that has published, so with none a
//     request finds no responders at once.
//   - The snapshot, <prefix>.rotation (messages.Rotation, v1): at most once
//     per SnapshotInterval, and after one of B bytes not before
//     B/SnapshotRate; one larger than the server's max_payload (or
//     SnapshotMaxBytes) is replaced by a notice (Truncated, Size, Bytes,
//     Feed; Proxies null), counted and logged once when it starts and once
//     when it ends. Never a silent stale snapshot.
//
// A failed publish is retried after reading the bucket again; changes
// marked meanwhile go out together, each proxy's latest once.
//
// # One publisher, versions that never go back
//
// The lease is taken with Create, renewed every third of LeaseTTL by
// compare-and-set on its revision, and released when Run stops. Expiry is
// read from the lease itself: a standby that sees the same revision for the
// TTL the holder wrote, by its own clock (clocks need not agree), takes it
// over; the bucket's TTL only clears a lease nobody renews. Before each
// publish the holder renews once more, and every request of the publish
// ends before the lease's validity (the renewal's send time plus the TTL
// less a tenth), so a paused holder stops writing before a standby can take
// over. Standbys probe too, so a new holder has counters and removes no
// passing proxy.
//
// A version (of a feed message, a page, a snapshot) is the revision of the
// lease write that allowed its publish, or one more than the last version
// the lease's value records if that is higher. Stream sequences only grow,
// across processes, takeovers and restarts, so published versions strictly
// grow; they skip, and that is all a client may rely on.
//
// # HTTP
//
// Handler serves the rotation, the checks, liveness, readiness, metrics
// (Config.Registry; nothing registered globally, no metric labelled by
// proxy) and the probe target; its doc lists them.
//
// # Repairs
//
// Health creates no stream and no bucket (proxyfleet setup does). Each of
// PROXY_EVENTS, PROXY_ROTATION and PROXY_LEASES that is missing is logged
// at error level (again every minute), named by /readyz and counted in
// proxyfleet_health_topology_missing, and bound once it is back;
// PROXY_CHECKS likewise, without holding anything else up. Only a setting
// that disagrees with what exists (a lease longer than the leases bucket's
// TTL) keeps Run from starting. The keeper makes the consumer anew when it
// was deleted, when deliveries skip, or when the stream was created anew
// (its creation time changed; logged at error level); each repair starts
// from the last event of every proxy again, which the fold ignores where it
// has seen newer, and is counted in proxyfleet_health_consumer_repairs_total.
//
// # Lifecycle
//
// Run is a process's whole life, from listening to releasing the lease
// (its doc says what it returns when). The defaults are the constants of
// package health/defaults, applied by Config.WithDefaults; package config
// fills a file's gaps with the same constants.
//
// # Limits
//
// The leak check knows the client's address only as this end of the
// prober's connection, so a NAT between health and the guests hides an
// X-Forwarded-For of the rewritten address (forwarding headers are not
// refused by name: a proxy chain or an ingress in front of the target adds
// them legitimately). A TCP prober checks nothing but the connect. A round
// starts all its probes at once, bounded by Concurrency. A request in
// flight when a paused holder's validity ends may still land (the margin is
// a tenth of the TTL). A leases bucket deleted and created anew restarts
// the revisions: a process that publishes on keeps its versions growing,
// but one that starts afresh after that may go back.
package health
