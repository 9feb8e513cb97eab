// Package bans holds what the fleet knows of bans: a ban is an (egress
// address, site) pair with an end, and the picker passes over an address
// banned for the site a request goes to. A site is the registrable domain
// of a host (eTLD+1, Site), or an address literal on its own; a ban is
// never for every site.
//
// The package is pure: the site of a host, the key of a ban in the
// PROXY_BANS bucket (Key, ParseKey), the Ban record and the Request a
// client sends on <prefix>.ban (strict decoding, validation naming the
// field), the in-memory Set a follower keeps, and the gateway's rules
// (RuleSpec as configured, Rules compiled, Match the decision). Package
// rotation keeps a Set current from the bucket; health stores the bans
// asked for.
package bans
