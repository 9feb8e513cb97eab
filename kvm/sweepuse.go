package kvm

import (
	"context"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// What uses a volume, for the volume sweep (sweep.go): the pool's volumes
// backed by it, and the domains on the daemon that refer to its path.

// volumeUsers reads what refers to volumes by path: the backing store of
// every volume of the pool that is not a cached candidate or a mark (a
// proxy's overlay may stay although it is a candidate: its id is wanted
// here, say), and the disks (with their backing chains), kernel and initrd
// of every domain on the daemon. It returns whether a path is used.
func (p *Provider) volumeUsers(ctx context.Context, vols []string, cands []sweepCandidate) (func(string) bool, error) {
	pool := p.opts.Host.Pool
	skip := map[string]bool{}
	for _, c := range cands {
		if c.v.Kind != kindOverlay && c.v.Kind != kindSeed {
			skip[c.name] = true
		}
	}
	paths := map[string]bool{}
	for _, name := range vols {
		if skip[name] || strings.HasSuffix(name, markSuffix) {
			continue
		}
		var backing string
		err := p.call(ctx, func(l *libvirt.Libvirt) error {
			sp, err := l.StoragePoolLookupByName(pool)
			if err != nil {
				return poolErr(pool, err)
			}
			v, err := l.StorageVolLookupByName(sp, name)
			if isNoVolume(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("look up volume %s: %w", name, err)
			}
			x, err := l.StorageVolGetXMLDesc(v, 0)
			if isNoVolume(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("volume %s: xml: %w", name, err)
			}
			var def libvirtxml.StorageVolume
			if err := def.Unmarshal(x); err != nil {
				return fmt.Errorf("volume %s: xml: %w", name, err)
			}
			if def.BackingStore != nil {
				backing = def.BackingStore.Path
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if backing != "" {
			paths[backing] = true
		}
	}
	var doms []libvirt.Domain
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		ds, _, err := l.ConnectListAllDomains(1, 0)
		if err != nil {
			return fmt.Errorf("list domains: %w", err)
		}
		doms = ds
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, d := range doms {
		var x string
		err := p.call(ctx, func(l *libvirt.Libvirt) error {
			var err error
			x, err = l.DomainGetXMLDesc(d, 0)
			if isCode(err, libvirt.ErrNoDomain) {
				x, err = "", nil
			}
			if err != nil {
				return fmt.Errorf("domain %s: xml: %w", d.Name, err)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if x == "" {
			continue
		}
		var def libvirtxml.Domain
		if err := def.Unmarshal(x); err != nil {
			return nil, fmt.Errorf("domain %s: xml: %w", d.Name, err)
		}
		for _, path := range domainPaths(&def) {
			paths[path] = true
		}
	}
	return func(path string) bool { return path == "" || paths[path] }, nil
}

// domainPaths are the files a domain refers to: its disks' sources and
// backing chains, its kernel and its initrd.
func domainPaths(def *libvirtxml.Domain) []string {
	var out []string
	if def.OS != nil {
		out = append(out, def.OS.Kernel, def.OS.Initrd)
	}
	if def.Devices == nil {
		return out
	}
	for _, disk := range def.Devices.Disks {
		out = append(out, sourcePath(disk.Source))
		for bs := disk.BackingStore; bs != nil; bs = bs.BackingStore {
			out = append(out, sourcePath(bs.Source))
		}
	}
	return out
}

func sourcePath(s *libvirtxml.DomainDiskSource) string {
	switch {
	case s == nil:
		return ""
	case s.File != nil:
		return s.File.File
	case s.Block != nil:
		return s.Block.Dev
	}
	return ""
}
