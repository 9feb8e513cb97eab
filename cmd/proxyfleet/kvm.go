package main

import (
	"errors"
	"log/slog"

	"proxyfleet/config"
	"proxyfleet/worker"
)

// newKVMProvider builds the libvirt provider of a kvm host.
func newKVMProvider(c *config.Config, h config.Host, log *slog.Logger) (worker.Provider, error) {
	return nil, errors.New("driver kvm: the libvirt provider is not wired into this build yet; use driver: sim")
}
