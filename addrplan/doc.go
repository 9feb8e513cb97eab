// Package addrplan holds hosts' address plans and the decisions of who
// gets which address: a plan (New, from a host's `addresses` config)
// numbers its addresses into slots, an IPv4 slot one address and an IPv6
// slot ipv6_per_proxy consecutive addresses; Assign, Take and Release
// change the assignments a host's record holds (messages.AddrState), one
// slot number a proxy, so no address list grows with the fleet.
//
// Everything here is pure: no I/O, no clock (callers pass now). The
// worker applies these decisions inside its compare-and-set of the host's
// record, which is what makes them safe under concurrent workers,
// crashes and redeliveries: a slot is held by at most one proxy of the
// record, and the record is the only place that says so.
package addrplan
