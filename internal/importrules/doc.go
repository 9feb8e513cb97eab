// Package importrules holds the test of the package map in
// docs/ARCHITECTURE.md: which proxyfleet packages each package may import,
// and which outside families (NATS, libvirt, SSH) it must not. It has no
// code of its own.
package importrules
