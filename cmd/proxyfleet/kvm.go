package main

import (
	"log/slog"

	"proxyfleet/config"
	"proxyfleet/kvm"
	"proxyfleet/worker"
)

// newKVMProvider builds the libvirt provider of a kvm host. It dials on
// first use: a worker that is never pinned to the host opens no link.
func newKVMProvider(c *config.Config, h config.Host, log *slog.Logger) (worker.Provider, error) {
	return kvm.New(kvm.Config{
		Host: h, Images: c.Images, Proxy: c.Proxy, Logger: log,
		OnProgress: func(p kvm.Progress) {
			log.Info("image transfer", "host", h.Name, "image", p.Image, "volume", p.Volume,
				"done", p.Done, "total", p.Total, "rate_mib_s", p.Rate/(1<<20))
		},
	})
}
