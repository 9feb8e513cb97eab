// Package sim is a simulated host driver: "domains" are JSON files in a
// directory, calls take configurable delays, and faults can be injected from
// outside the process by writing a file. It implements worker.Provider so
// that tests across real processes, demos and load runs at thousands of
// proxies need no VMs. It is used only for hosts whose config says
// `driver: sim`.
//
// Every call holds an exclusive lock on the proxy's byte of locks/ids.lock
// (an open file description's lock, F_OFD_SETLK, at an offset hashed from
// the id) and, within one driver, the id itself, so calls for one id are
// serialised across drivers and processes; a call that finds the lock
// taken records the overlap in overlaps.log before waiting, which is how
// tests prove the worker never runs two calls for one id at once. Every create
// that makes a domain appends "id command-id" to creates.log.
//
// Like a real host, a proxy is more than its domain: a create first makes
// the proxy's volume (volumes/<id>.disk), then its domain, and a delete
// removes the domain, then the volume. The fault op "delete-volumes" fails
// a delete between the two, as a call abandoned on a deadline would, so
// tests can prove a later delete still removes the volume. SweepVolumes
// removes a volume with no domain that is older than a grace, as the kvm
// provider's sweep does, so the worker's volume sweep runs on sim hosts too.
package sim
