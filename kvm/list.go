package kvm

import (
	"context"
	"errors"
	"fmt"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// entry never touches another's.
func (p *Provider) List(ctx context.Context) ([]fleet.Instance, error) {
	var doms []libvirt.Domain
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		var err error
		doms, _, err = l.ConnectListAllDomains(1, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []fleet.Instance
	for _, d := range doms {
		id, ok := parseDomainName(d.Name)
		if !ok {
			continue
		}
		_, m, err := p.lookup(ctx, id)
		if fleet.ClassOf(err) == fleet.ClassNotFound || errors.Is(err, ErrNotOurs) {
			continue // gone meanwhile, or not ours: another host entry's, say
		}
		if err != nil {
			return nil, err
		}
		in := m.instance()
		var state int32
		err = p.call(ctx, func(l *libvirt.Libvirt) error {
			var err error
			state, _, err = l.DomainGetState(d, 0)
			return err
		})
		if fleet.ClassOf(err) == fleet.ClassNotFound {
			continue
		}
		if err != nil {
			return nil, fleet.Transient(fmt.Errorf("state of %s: %w", id, err))
		}
		switch libvirt.DomainState(state) {
		case libvirt.DomainRunning, libvirt.DomainBlocked, libvirt.DomainPaused:
			in.State = messages.StateProvisioning // active; Get reads whether it has an address
			if m.static() {
				in.IP, in.Source = m.Addr.String(), messages.SourcePlan
			}
		default:
			in.State, in.Reason = messages.StateFailed, "domain is not running"
		}
		out = append(out, in)
	}
	return out, nil
}

// ListVolumes returns the names of every volume in the host's pool that
// this project made (proxies' overlays and seeds, cached images).
func (p *Provider) ListVolumes(ctx context.Context) ([]string, error) {
	pool := p.opts.Host.Pool
	var names []string
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		if err := l.StoragePoolRefresh(sp, 0); err != nil {
			return err
		}
		vols, _, err := l.StoragePoolListAllVolumes(sp, 1, 0)
		if err != nil {
			return err
		}
		for _, v := range vols {
			if isOurs(v.Name) {
				names = append(names, v.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return names, nil
}
