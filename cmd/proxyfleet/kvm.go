package main

import (
	"log/slog"

	"proxyfleet/config"
	"proxyfleet/kvm"
	"proxyfleet/worker"
)

// The kvm provider sweeps the volumes nothing uses (worker.Sweeper).
var _ worker.Sweeper = (*kvm.Provider)(nil)

// newKVMProvider builds the libvirt provider of a kvm host. It dials on
// first use: a worker that is never pinned to the host opens no link.
func newKVMProvider(c *config.Config, h config.Host, log *slog.Logger, obs kvm.Observer) (worker.Provider, error) {
	opts, err := kvmOptions(c, h, log)
	if err != nil {
		return nil, err
	}
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
func kvmOptions(c *config.Config, h config.Host, log *slog.Logger) (kvm.Options, error) {
	images := make([]kvm.ImageSource, len(c.Images))
	for i, im := range c.Images {
		images[i] = kvm.ImageSource{
			Name: im.Name, URL: im.URL, SHA256: im.SHA256, Format: im.Format,
			Kernel: artifactSource(im.Kernel), Initrd: artifactSource(im.Initrd), Cmdline: im.Cmdline,
		}
	}
	gp, err := guestProxy(c.Proxy)
	if err != nil {
		return kvm.Options{}, err
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
		Proxy:    gp,
		Logger:   log,
	}, nil
}

// guestProxy maps proxy: onto the guests' proxy configuration. The
// password is the one LoadSecrets read (Validate refused an allow entry
// that does not parse, so none is dropped here). proxy.deny becomes the
// list it means (the default when absent); an entry that does not parse
// is an error, never a destination let through.
func guestProxy(p config.Proxy) (kvm.GuestProxy, error) {
	gp := kvm.GuestProxy{Port: p.Port, User: p.Auth.User, Password: p.Auth.Password.Reveal(), Open: p.Open}
	for _, s := range p.Allow {
		if a, err := config.ParseAllow(s); err == nil {
			gp.Allow = append(gp.Allow, a)
		}
	}
	denied, err := p.DenyList()
	if err != nil {
		return kvm.GuestProxy{}, err
	}
	gp.Deny = &denied
	return gp, nil
}

func artifactSource(a *config.Artifact) *kvm.ArtifactSource {
	if a == nil {
		return nil
	}
	return &kvm.ArtifactSource{URL: a.URL, SHA256: a.SHA256}
}
