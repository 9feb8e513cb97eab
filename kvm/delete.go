package kvm

import (
	"context"
	"fmt"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// Delete converges every artifact of id on this host entry to absent
// before it returns nil: the domain pf-<id> (found by name and checked by
// its mark) is destroyed and undefined, and the overlay pf-<id>-disk.qcow2
// and the seed pf-<id>-seed.iso are removed from the entry's pool, whether
// or not a domain is still there (a create that died before its define, a
// delete interrupted after the undefine, a domain undefined behind our
// back). Each step treats "already gone" as done, so a retried delete picks
// up where an interrupted one stopped, and a proxy with nothing left is
// success.
//
// A domain pf-<id> that is not this entry's (unmarked, another
// application's, or marked by another host entry on the same daemon) is
// refused with ErrNotOurs (permanent), and then neither the domain nor the
// volumes of its id are touched: they belong with it. Any other error
// leaves what is not yet removed for the retry.
func (p *Provider) Delete(ctx context.Context, id string) error {
	dom, _, err := p.lookup(ctx, id)
	switch {
	case fleet.ClassOf(err) == fleet.ClassNotFound:
	case err != nil:
		return err
	default:
		err := p.call(ctx, func(l *libvirt.Libvirt) error {
			if err := l.DomainDestroy(dom); err != nil && !isCode(err, libvirt.ErrOperationInvalid) && !isCode(err, libvirt.ErrNoDomain) {
				return fmt.Errorf("destroy: %w", err)
			}
			err := l.DomainUndefineFlags(dom, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineSnapshotsMetadata|libvirt.DomainUndefineNvram)
			if err != nil && !isCode(err, libvirt.ErrNoDomain) {
				return fmt.Errorf("undefine: %w", err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("delete domain %s: %w", id, err)
		}
		p.hook(hookUndefined, id)
	}
	for _, name := range []string{overlayVolumeName(id), seedVolumeName(id)} {
		if err := p.deleteVolume(ctx, name); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}
	return nil
}

// deleteVolume removes a volume of ours by name; an absent one is success.
func (p *Provider) deleteVolume(ctx context.Context, name string) error {
	pool := p.opts.Host.Pool
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		v, err := l.StorageVolLookupByName(sp, name)
		if isCode(err, libvirt.ErrNoStorageVol) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := l.StorageVolDelete(v, 0); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return nil
}

// List returns every domain this host entry made (by its mark), with its
// state (no address read: that costs a call per source; Get reads it).
// A proxy with a static network reports its plan's Egress from its mark,
// and, while its domain is active, the address of record as IP with Source
// plan; whether the guest holds it, and so whether it runs, is Get's to
// say. Domains another entry on the same daemon made are left out, so a
// sweep of one
