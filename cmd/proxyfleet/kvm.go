package main

import (
	"log/slog"
	"os"
	"syscall"

	"proxyfleet/config"
	"proxyfleet/kvm"
	"proxyfleet/worker"
)

// The kvm provider sweeps the volumes nothing uses (worker.Sweeper).
var _ worker.Sweeper = (*kvm.Provider)(nil)

// newKVMProvider builds the libvirt provider of a kvm host. It dials on
// first use: a worker that is never pinned to the host opens no link.
func newKVMProvider(c *config.Config, h config.Host, log *slog.Logger, obs kvm.Observer) (worker.Provider, error) {
	opts := kvmOptions(c, h, log)
	opts.Observer = obs
	opts.OnProgress = func(p kvm.Progress) {
		log.Info("image transfer", "host", h.Name, "image", p.Image, "volume", p.Volume,
			"done", p.Done, "total", p.Total, "rate_mib_s", p.Rate/(1<<20))
	}
	opts.Hooks = crashHooks(log)
	return kvm.New(opts)
}

// kvmOptions maps a kvm host entry of the config, its images and the
// proxies' user-data onto the provider's options. The config fills no
// default of these keys: what it leaves empty, kvm fills with its own
// (kvm.DefaultBudgets and the other defaults in kvm/options.go).
func kvmOptions(c *config.Config, h config.Host, log *slog.Logger) kvm.Options {
	images := make([]kvm.ImageSource, len(c.Images))
	for i, im := range c.Images {
		images[i] = kvm.ImageSource{
			Name: im.Name, URL: im.URL, SHA256: im.SHA256, Format: im.Format,
			Kernel: artifactSource(im.Kernel), Initrd: artifactSource(im.Initrd), Cmdline: im.Cmdline,
		}
	}
	b := h.Budgets
	return kvm.Options{
		Host: kvm.HostOptions{
			Name:    h.Name,
			Address: h.SSH.Address, User: h.SSH.User, KeyFile: h.SSH.KeyFile, KnownHosts: h.SSH.KnownHosts,
			Socket: h.Socket, URI: h.URI, Pool: h.Pool, Network: h.Network, DomainType: h.DomainType,
			Budgets: kvm.Budgets{
				Call: b.Call, Connect: b.Connect, TransferStall: b.TransferStall, Close: b.Close, Keepalive: b.Keepalive,
			},
		},
		Images:   images,
		UserData: c.Proxy.UserData,
		Logger:   log,
	}
}

func artifactSource(a *config.Artifact) *kvm.ArtifactSource {
	if a == nil {
		return nil
	}
	return &kvm.ArtifactSource{URL: a.URL, SHA256: a.SHA256}
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
