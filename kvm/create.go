package kvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// and reported, not made again. A failed create removes what it made. The
// spec's Network is checked before anything (checkNetwork): a bad one is
// permanent; gateways it leaves out are the host network's own addresses
// (withNetworkDefaults). A static one gives the domain its MAC, the seed its
// network-config and the mark its addresses.
func (p *Provider) Create(ctx context.Context, spec fleet.Spec) (fleet.Instance, error) {
	img, ok := p.byName[spec.Image]
	if !ok {
		return fleet.Instance{}, fleet.Permanent(fmt.Errorf("create %s: unknown image %q", spec.ID, spec.Image))
	}
	if err := checkID(spec.ID); err != nil {
		return fleet.Instance{}, fleet.Permanent(fmt.Errorf("create %s: %w", spec.ID, err))
	}
	network, err := p.withNetworkDefaults(ctx, spec.Network)
	if err != nil {
		return fleet.Instance{}, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	if network, err = checkNetwork(network); err != nil {
		return fleet.Instance{}, fleet.Permanent(fmt.Errorf("create %s: %w", spec.ID, err))
	}
	spec.Network = network
	in, err := p.Get(ctx, spec.ID)
	switch {
	case err == nil:
		if in.State == messages.StateFailed && in.Reason == reasonNeverStarted {
			// A create that stopped between define and start: finish it.
			if err := p.start(ctx, spec.ID); err != nil {
				return fleet.Instance{}, err
			}
			return p.Get(ctx, spec.ID)
		}
		return in, nil
	case fleet.ClassOf(err) != fleet.ClassNotFound:
		return fleet.Instance{}, err
	}
	stop := p.listen(func(pr Progress) {
		if pr.Image == img.Name {
			fleet.ReportProgress(ctx, progressMessage(pr))
		}
	})
	vols, err := p.images.ensure(ctx, img)
	stop()
	if err != nil {
		return fleet.Instance{}, fmt.Errorf("create %s: image %s: %w", spec.ID, img.Name, err)
	}
	made := &made{}
	if err := p.create(ctx, spec, img, vols, made); err != nil {
		if !errors.Is(err, errHook) {
			p.undo(spec.ID, made)
		}
		return fleet.Instance{}, err
	}
	return p.Get(ctx, spec.ID)
}

// errHook marks a failure staged by a test hook: like a crash, it leaves
// what was made for the next create or a sweep to find.
var errHook = errors.New("stopped by a hook")

// made records what one create made, for undo.
type made struct {
	overlay, seed, domain bool
}

const reasonNeverStarted = "defined, never started"

func (p *Provider) create(ctx context.Context, spec fleet.Spec, img ImageSource, vols imageVolumes, m *made) error {
	id, pool := spec.ID, p.opts.Host.Pool
	// Leftovers of a create that died before its domain was defined carry
	// our names and no domain refers to them: remove them first.
	for _, name := range []string{overlayVolumeName(id), seedVolumeName(id)} {
		if err := p.deleteVolume(ctx, name); err != nil {
			return fmt.Errorf("create %s: remove leftover %s: %w", id, name, err)
		}
	}
	overlayXML, err := overlayVolumeXML(id, vols.Base.Capacity, vols.Base.Path, vols.Base.Format)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		_, err = l.StorageVolCreateXML(sp, overlayXML, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("create %s: overlay: %w", id, err)
	}
	m.overlay = true

	ud, err := userData(p.opts.UserData, p.opts.Proxy, id, id, spec.Network)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	iso, err := seedISO(instanceID(spec), id, ud, spec.Network)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	if err := p.uploadSeed(ctx, id, iso, m); err != nil {
		return err
	}
	if h := p.opts.Hooks.AfterOverlay; h != nil {
		if err := h(id); err != nil {
			return fmt.Errorf("create %s: %w: %w", id, errHook, err)
		}
	}

	params := domainParams{
		Type: p.opts.Host.DomainType, ID: id, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB,
		Network: p.opts.Host.Network,
		MAC:     spec.Network.MAC,
		Disk:    diskRef{Pool: pool, Volume: overlayVolumeName(id)},
		Seed:    diskRef{Pool: pool, Volume: seedVolumeName(id)},
		Cmdline: img.Cmdline,
		Mark: mark{
			Owner: markOwner, ID: id, CommandID: spec.CommandID, SpecHash: spec.SpecHash,
			CreatedAt: p.opts.Now().UTC(), Host: p.opts.Host.Name, Image: img.Name, Labels: spec.Labels,
		},
	}
	if spec.Network.Static() {
		params.Mark.Egress, params.Mark.Addr = spec.Network.Egress(), spec.Network.Addr()
	}
	if vols.Kernel != nil {
		params.Kernel = vols.Kernel.Path
	}
	if vols.Initrd != nil {
		params.Initrd = vols.Initrd.Path
	}
	xml, err := domainXML(params)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		p.hook(hookDefining, id)
		_, err := l.DomainDefineXML(xml)
		p.hook(hookDefineDone, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("define domain %s: %w", id, err)
	}
	m.domain = true
	if h := p.opts.Hooks.AfterDefine; h != nil {
		if err := h(id); err != nil {
			return fmt.Errorf("create %s: %w: %w", id, errHook, err)
		}
	}
	return p.start(ctx, id)
}

// instanceID changes whenever the proxy is made anew, so cloud-init in the
// guest runs its per-instance modules again.
func instanceID(spec fleet.Spec) string {
	h := spec.SpecHash
	if len(h) > 12 {
		h = h[:12]
	}
	if h == "" {
		return spec.ID
	}
	return spec.ID + "-" + h
}

func (p *Provider) uploadSeed(ctx context.Context, id string, iso []byte, m *made) error {
	pool, name := p.opts.Host.Pool, seedVolumeName(id)
	volXML, err := plainVolumeXML(name, uint64(len(iso)), "raw")
	if err != nil {
		return fleet.Permanent(fmt.Errorf("create %s: %w", id, err))
	}
	var vol libvirt.StorageVol
	err = p.mutate(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		vol, err = l.StorageVolCreateXML(sp, volXML, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("create %s: seed volume: %w", id, err)
	}
	m.seed = true
	err = p.link.transfer(ctx, bytes.NewReader(iso), func(l *libvirt.Libvirt, r io.Reader) error {
		return l.StorageVolUpload(vol, r, 0, uint64(len(iso)), 0)
	})
	if err != nil {
		return fmt.Errorf("create %s: upload seed: %w", id, err)
	}
	return nil
}

func (p *Provider) start(ctx context.Context, id string) error {
	err := p.mutate(ctx, func(l *libvirt.Libvirt) error {
		d, err := l.DomainLookupByName(domainName(id))
		if err != nil {
			return err
		}
		return l.DomainCreate(d)
	})
	if err != nil {
		return fmt.Errorf("start domain %s: %w", id, err)
	}
	return nil
}

// undo removes what a failed create made. It runs on its own budget: the
// create's ctx may be what failed.
func (p *Provider) undo(id string, m *made) {
	if !m.overlay && !m.seed && !m.domain {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*p.link.cfg.Budgets.Call)
	defer cancel()
	if err := p.Delete(ctx, id); err != nil {
		p.log.Error("clean up failed create", "id", id, "err", err)
	}
}
