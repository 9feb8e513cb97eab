// Package config reads proxyfleet's YAML configuration, fills defaults and
// validates it, naming the first bad field by its YAML path.
//
// config.go holds the schema (one type per YAML section), Load, Parse and
// SetDefaults; validate.go checks a config. The package imports nothing
// of proxyfleet but the pure messages, addrplan, fleet, deny and bans, and the
// defaults of the roles (worker/defaults, topology/defaults,
// health/defaults), constants that import nothing: cmd/proxyfleet maps a
// Config onto each role's options. A deny list (proxy.deny, gateway.deny)
// is left nil when absent, so that absent (the default list) and empty
// (nothing denied) stay apart; DenyList reads it. The defaults of the
// worker's, the topology's, the repairer's and the health process's
// settings are those packages' constants, which SetDefaults fills a
// file's gaps with. Those of the gateway's and the pool controller's are
// copies of their packages' (gateway.Config.WithDefaults,
// pool.Config.WithDefaults); the rest (a proxy's size, a host's keys) are
// the file's own.
package config
