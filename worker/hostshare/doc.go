// Package hostshare shares the hosts over the live workers, so that each
// host's work is pulled by few of them and owned by one at a time.
//
// Every worker keeps a record in PROXY_WORKERS (Membership: renewed every
// Heartbeat; active or draining; the hosts it can execute, pulls and owns,
// and its pin on each) and follows everyone's. From the live, active
// records every worker computes the same assignment, rendezvous hashing
// with bounded load (share.go), and tells each of its hosts whether to
// pull it (Host.Want): its share, and, so that no host is left without an
// owner, any host whose assigned worker has not pulled it for Liveness.
// The pin of a host's work consumer decides among the pullers.
//
// Taking a host is a claim (Claim), which settles the pin without real
// work; handing one over keeps the pin (HoldPin) until the work already
// delivered has ended, then unpins it (Unpinner), so a host never has two
// owners at once. A pin no worker's record holds at two looks a heartbeat
// apart is a stray, unpinned by the host's assigned worker (straypin.go).
// Owners and WorkerRecords read who owns each host as the server sees it.
//
// The worker is the one user: it implements Host with its consumers of
// the hosts' work and uses a Membership through an interface it declares.
// The package leans on the contract (messages), the consumers' names
// (topology) and the JetStream seam (internal/jsapi), never on the worker.
package hostshare
