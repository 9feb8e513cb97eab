// Package deny is the list of destination networks the fleet refuses to
// reach: the gateway refuses a target whose host is an address in it
// (gateway.deny), and the proxies' squid refuses a destination that is in
// it or whose name resolves into it (proxy.deny).
//
// Default is the list used when the config names none: the networks of
// the machines the fleet runs on and beside (loopback, this host, link-
// local with a cloud's metadata service at 169.254.169.254, private and
// shared address space, IPv6 unique local addresses). A List is pure: it
// resolves no name and does no I/O.
package deny
