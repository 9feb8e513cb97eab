// Package config reads proxyfleet's YAML configuration, fills defaults and
// validates it, naming the first bad field by its YAML path.
//
// config.go holds the schema (one type per YAML section), Load, Parse and
// SetDefaults; validate.go checks a config. The package imports nothing
// of proxyfleet but the pure messages, addrplan, fleet, deny and bans, and the
// defaults of the roles (worker/defaults, topology/defaults,
// health/defaults, pool/defaults, gateway/defaults, rotation/defaults),
// constants that import nothing: cmd/proxyfleet maps a Config onto each
// role's options. A deny list (proxy.deny, gateway.deny) is left nil when
// absent, so that absent (the default list) and empty (nothing denied)
// stay apart; DenyList reads it. Every default of a role's setting is
// that role's constant, which SetDefaults fills a file's gaps with (or
// leaves zero for the role to fill, as gateway.first_byte_timeout); the
// rest (a proxy's size, a host's driver and room) are the file's own.
package config
