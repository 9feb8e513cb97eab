package worker

import (
	"context"
	"time"

	"proxyfleet/fleet"
)

// Provider runs proxies on one host. Worker declares it; the kvm and sim
// packages implement it without importing worker.
//
// Errors are classed with package fleet and read with fleet.ClassOf: class
// not-found from Get when the proxy is not there, transient for what a retry
// may fix (a dead link, a budget overrun, a busy host), anything else
// permanent. A failed read of a proxy that exists (its mark, state or
// address) must be transient, never not-found: the executor acts on
// not-found (it creates), and a read error must never look like absence.
// Every method must return once ctx is done.
type Provider interface {
	// Create makes the proxy and starts it. It is idempotent: a proxy
	// already made for spec.ID is found by its mark, not made again. A
	// failed create removes what it made before returning.
	Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error)
	// Get reads the proxy's state and address.
	Get(ctx context.Context, id string) (fleet.Instance, error)
	// Delete removes the proxy and everything made for it (domain and
	// volumes, whether or not the domain is still there). A proxy that is
	// not there is success. It never touches what another host entry or
	// someone else made.
	Delete(ctx context.Context, id string) error
	// List returns every proxy this project made on the host, each as a
	// summary: its ID and mark (CommandID, SpecHash, CreatedAt) and
	// whether its domain runs. What only Get reads for certain (the
	// address, Egress) may be left out. A summary that says running with
	// an address must give it as Get would have read it at that moment:
	// the observation pass takes such a one, when it matches the last
	// event, for the proxy's read; a provider that cannot tell for
	// certain says provisioning, and the pass reads the proxy with Get.
	List(ctx context.Context) ([]fleet.Instance, error)
	// Close releases the provider's connections.
	Close() error
}

// Sweeper is what a Provider may also implement so that its host's
// observation pass removes volumes nothing uses (docs/ARCHITECTURE.md,
// "Sweeps"). kvm and sim implement it.
type Sweeper interface {
	// SweepVolumes removes, and returns by name, the host entry's volumes
	// that nothing has used for at least grace: a proxy's volumes with no
	// domain of its id on the host, and cached image volumes that no
	// configured image names and nothing backs. It never touches what
	// another host entry or someone else made, nor a volume it cannot
	// prove unused.
	//
	// Before it removes a proxy's volumes it calls claim with the proxy's
	// id: ok false keeps them; with ok, the id is held (no converge of it
	// runs) until the sweeper calls release, which it does once it has
	// checked again that no domain is there and removed them.
	SweepVolumes(ctx context.Context, grace time.Duration,
		claim func(ctx context.Context, id string) (release func(), ok bool)) ([]string, error)
}
