package main

import (
	"log/slog"
	"os"
	"syscall"

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
		Hooks: crashHooks(log),
	})
}

// crashHooks is a test seam: with PROXYFLEET_TEST_KILL_AT set to
// "after-overlay" (volumes made, domain not defined) or "after-define"
// (defined, not started), the process SIGKILLs itself at that point of a
// create, once per marker file PROXYFLEET_TEST_KILL_ONCE (the first process
// to create the file dies; later ones carry on). Unset, it does nothing.
func crashHooks(log *slog.Logger) kvm.Hooks {
	at, once := os.Getenv("PROXYFLEET_TEST_KILL_AT"), os.Getenv("PROXYFLEET_TEST_KILL_ONCE")
	if at == "" || once == "" {
		return kvm.Hooks{}
	}
	kill := func(id string) error {
		f, err := os.OpenFile(once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return nil // someone died here already
		}
		f.WriteString(id + "\n")
		f.Close()
		log.Warn("test seam: SIGKILL", "at", at, "id", id)
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	switch at {
	case "after-overlay":
		return kvm.Hooks{AfterOverlay: kill}
	case "after-define":
		return kvm.Hooks{AfterDefine: kill}
	}
	return kvm.Hooks{}
}
