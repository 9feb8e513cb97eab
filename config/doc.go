// Package config reads proxyfleet's YAML configuration, fills defaults and
// validates it, naming the first bad field by its YAML path.
//
// config.go holds the schema (one type per YAML section), Load, Parse and
// SetDefaults; validate.go checks a config. The package imports nothing
// of proxyfleet but messages: cmd/proxyfleet maps a Config onto each
// role's options. The defaults of the worker's, the topology's, the
// repairer's and the health process's settings are those packages' own
// (their Config.WithDefaults); the values SetDefaults fills for them are
// copies, which cmd/proxyfleet's TestConfigDefaultsAreTheRoles holds
// equal to the roles'. The rest (a proxy's size, a host's keys, the health
// grace) are the file's own.
package config
