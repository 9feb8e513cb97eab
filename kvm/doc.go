// Package kvm is the libvirt provider over SSH: per-host links to libvirtd,
// call budgets, and error classification, on which the provider's Create,
// Get, Delete and List are built.
//
// # Options
//
// New takes Options (options.go): the host entry (HostOptions: its SSH
// login, libvirt socket and URI, pool, network, domain type and Budgets),
// the images proxies boot from (ImageSource), the proxies' cloud-init
// user-data, and test seams. They are plain values; every default of what
// this package owns (DefaultBudgets, DefaultSocket, DefaultURI, the pool,
// network, domain type and disk format) is set in options.go and nowhere
// else, and Validate names the first bad field (*OptionError). The package
// imports neither config nor worker: cmd/proxyfleet maps the YAML
// configuration onto Options, leaving empty what the operator left out.
//
// Files: options.go (what New takes); link.go (the shared link: calls,
// budgets, its dial and redial backoff), conn.go (one connection: its
// death and kill, open and close), transfer.go (dedicated links with a
// watchdog), ssh.go (the SSH dialer); provider.go, create.go, get.go (with
// the address), delete.go, list.go (the provider), sweep.go and sweepuse.go
// (the volumes nothing uses); mark.go, names.go,
// domain.go, seed.go (what it writes on the host), network.go (a proxy's
// static network: its check, its network-config, planState); image.go
// (the cache and its single flight), imagemark.go, imageupload.go, directupload.go,
// imagesource.go (the base image cache); classify.go (the errors); observe.go (the Observer).
//
// Options.Observer (or LinkConfig.Observer) hears, for metrics, every
// remote procedure call by name and duration (read from the transport's
// packet headers, matched by serial; the bytes are never changed), each
// dial, the death of an open link (a polite close is none), each budget
// overrun and the bytes of images uploaded. The package imports no metrics
// library: cmd/proxyfleet implements the Observer with Prometheus.
//
// # Links
//
// Each host has one shared Link for calls. It owns a connection made of our
// own SSH client (DialSSH: TCP connect, handshake and forward under one
// deadline, host key checked against known_hosts, keepalives) forwarding to
// the host's libvirt unix socket, and a go-libvirt client on it. go-libvirt's
// own SSH dialer is not used: it never closes its SSH client and sends no
// keepalives, so a host that vanishes would hold a link for as long as TCP
// retransmits.
//
// go-libvirt calls take no context. Link.call runs each one in a goroutine
// and waits for it, its time budget, the caller's ctx and the link's death.
//
// Budget overrun kills, cancellation abandons. An overrun kills the link:
// there is no other way to stop the call, and a link that let a call overrun
// cannot be trusted. Every other call in flight on it fails transient at the
// same moment, and the next call redials (no more often than the redial
// backoff allows). So nothing ever waits on TCP retransmission, and a budget
// is a real bound. A caller whose ctx is done (an observation pass over its
// interval, a ready timeout) only stops waiting: it gets a transient error
// wrapping ctx.Err(), and its call is abandoned, not stopped. The call runs
// on in its goroutine, still counted by the link, and its budget is still
// watched (by a goroutine of the link's): an abandoned call that overruns
// kills the link like any other. One caller giving up never costs the calls
// of the host's other proxies their link. (A transfer's dedicated link is its
// caller's alone, and a cancelled transfer does kill it.)
//
// # Why killing is done the way it is
//
// Killing a link closes the SSH client's TCP socket, never the forwarded
// channel first (SSHConn.Close, ssh.go: a channel close waits on a writer
// stalled on a dead host for as long as the kernel retransmits). The link is
// marked dead before the kill runs, and the kill runs outside any lock, in
// the goroutine that won the race to mark it (conn.markDead, conn.go):
// concurrent callers see it dead at once and never wait for the kill.
//
// # Transfers
//
// Uploads run on a dedicated link opened for the transfer (Link.transfer),
// with a no-progress watchdog on the source: if no bytes move for the
// transfer-stall budget, the dedicated link is killed and the transfer fails
// transient. A slow or stalled upload never costs the host's shared link.
// Into a pool of type dir, the bytes go instead over a dedicated SSH client
// (Link.sshTransfer, the same watchdog) into a temporary file next to the
// volume, renamed over it once length and sha256 matched (directupload.go),
// because libvirt's stream is slower than SSH itself. Other pool
// types, and a host whose shell cannot write the pool's directory, use the
// stream. SSH prefers AES-GCM on a CPU with AES instructions and
// ChaCha20-Poly1305 on one without (SSHConfig.Ciphers).
//
// # The provider
//
// Provider (provider.go; create.go, get.go, delete.go, list.go) implements
// the worker's Provider interface (without importing it) for
// one host entry and keeps no per-proxy state: a proxy is the domain
// pf-<id>, its overlay pf-<id>-disk.qcow2 and its NoCloud seed
// pf-<id>-seed.iso, and the domain carries a mark in its metadata (mark.go:
// owner, proxy id, command id, spec hash, createdAt, host entry, image,
// labels, and a static network's addresses). Get, Create, Delete and List
// read that mark back. A domain is
// this provider's only if its mark is ours, for its id, and names this host
// entry: a domain with our name and no mark, another application's mark, or
// the mark of another host entry on the same daemon is never touched
// (ErrNotOurs, permanent), so two entries on one daemon never reach each
// other's domains.
//
// Do no harm on reads: only the domain's lookup by name can say not-found.
// Once the domain is found, a failing read of its mark (other than "no mark",
// which is not ours), its state or its address is explicitly transient,
// never not-found and never permanent, so no caller replaces or deletes a
// proxy because a read failed. Not-found is matched everywhere as
// fleet.ClassOf(err) == fleet.ClassNotFound, so a transient wrap around a
// not-found stays transient.
//
// Delete converges every artifact of the id on its host entry before it
// returns nil: the domain (found by name, checked by its mark), the overlay
// and the seed, whether or not a domain is still there; each step takes
// "already gone" as done, so a retry finishes an interrupted delete. If the
// domain pf-<id> is there but not this entry's, Delete returns ErrNotOurs
// and leaves the domain and the volumes of its id alone.
//
// Create finds a marked domain instead of defining another (and starts one
// a crash left defined but never started), ensures the base image (below),
// makes the overlay over it and uploads the seed, defines the domain (XML
// built with libvirtxml, domain.go) and starts it; anything failing removes
// what this create made. The calls that make something (the volumes, the
// define, the start) are the one exception to "cancellation abandons": a
// create whose ctx ends while one runs waits for it (within its budget), so
// that its undo sees, and removes, what the call made instead of racing it.
// Test hooks (Hooks) stop a create at named points as a crash would.
//
// Get maps the domain state to a proxy state and reads the address from
// the guest agent, the DHCP lease and ARP, in that order, and an unreadable
// address never looks like a missing one: a source answering cleanly with nothing while others
// error means "no address yet" (a booting guest); every source erroring, or
// the link dying under the read, is an explicitly transient error
// (ErrNoAddressSource, ErrLinkDead) that classification cannot turn
// permanent.
//
// A proxy with a static network (fleet.Spec.Network, from its host's
// address plan; network.go) has a domain whose interface carries the
// plan's MAC, a seed with a network-config (cloud-init v2: the interface
// matched by that MAC, a /32 and /128s, on-link default routes written as
// gateway4 and gateway6, the form cloud-init 22.4's ifupdown renderer
// turns into on-link routes), a default user-data whose squid leaves
// from the address a request names in messages.HeaderEgress (squidEgress,
// guestproxy.go), and a mark recording its egress addresses and its
// address of record. Get reports that address (Source plan) for
// an active domain without reading the lease or ARP, and asks only the
// guest agent: an agent that answers without the address holds the proxy
// in provisioning ("address mismatch"), one that errors does not (planState).
// The zero Network is the host network's DHCP: no MAC, no network-config,
// no addresses in the mark; golden files hold its definition and seed byte
// for byte (TestDomain_zeroNetworkIsUnchanged).
//
// # The base image cache
//
// Each image artifact (disk, kernel, initrd) is cached once per host ENTRY
// and digest (pf-base-<entry>-<digest16>.<fmt>): two entries naming one
// libvirt host never share a volume. Uploads are single-flight across
// processes: creating the volume is the lock, others wait for the mark, and
// an upload that stopped growing is taken over (image.go). A cached volume
// is used only with its completion mark, created after the uploaded length
// and sha256 were verified (imagemark.go). A failed upload's volume is
// discarded after its dedicated connection is closed, and a source error
// reaches go-libvirt only as EOF (eofReader), because a real error can wedge
// its stream sender (imageupload.go). Sources are file:// and http(s)://
// URLs; an HTTP one must send a Content-Length (imagesource.go).
//
// A cached volume lives as long as something may use it. SweepVolumes
// (sweep.go, called by the worker's observation pass) removes one of this
// entry's cached volumes, its marks first, once no configured image names
// its digest and nothing has used it for the grace: no volume of the pool
// is backed by it and no domain on the daemon refers to its path (disk,
// backing chain, kernel, initrd). It removes a proxy's overlay and seed
// that have had no domain pf-<id> (of anyone) for the grace, after the
// caller's claim of the id. The grace is first-seen by the provider: a
// volume seen unused, with the same mtime and allocation, on passes
// spanning the grace, so a volume younger than the grace is never removed
// and no host clock is compared with ours. Another entry's cached volumes,
// names that are not ours, and marks whose volume stays are never touched.
//
// # Errors
//
// Every error leaving the package is classed for package fleet in one place
// (Classify, classify.go): libvirt error codes and transport errors map to
// transient, permanent or not-found; an explicit class set closer to the
// caller always wins. Errors carry short lowercase context
// ("define domain p1: ...") and name the host.
//
// A dial refused for good, a host key that does not match known_hosts
// (ErrHostKey) or a login the host refuses (ErrAuthRefused, naming the user,
// the host and the key), is permanent, and the link keeps that class for the
// calls that meet it inside its redial backoff: a create on such a host
// fails at once instead of spending its retries on a "link down".
package kvm
