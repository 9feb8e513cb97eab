// Package config reads proxyfleet's YAML configuration, fills defaults and
// validates it, naming the first bad field by its YAML path.
//
// config.go holds the schema (one type per YAML section), Load, Parse and
// SetDefaults; validate.go checks a config. The package imports nothing
// of proxyfleet but messages: cmd/proxyfleet maps a Config onto each
// role's options.
package config
