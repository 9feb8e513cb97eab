package kvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// The volume sweep: what proxies and images left in the entry's pool that
// nothing uses (the worker's observation pass calls it; see "Sweeps" in
// docs/ARCHITECTURE.md).
//
// Two kinds of volume are swept, found by their names alone (names.go):
//
//   - a proxy's overlay and seed, pf-<id>-disk.qcow2 and pf-<id>-seed.iso,
//     when no domain pf-<id> is on the daemon at all (ours, another entry's
//     or someone else's: a domain of that name keeps them), and the caller's
//     claim for the id says yes (the worker holds the id meanwhile, so no
//     converge of it runs);
//   - a cached image volume of THIS entry (pf-base-<entry>-…,
//     pf-kernel-<entry>-…, pf-initrd-<entry>-…) that no configured image
//     names and that nothing uses: no volume of the pool has it as its
//     backing store and no domain on the daemon refers to its path (a disk,
//     a backing store, a kernel or an initrd). Its completion marks go with
//     it, first.
//
// Nothing else is touched: not another entry's cached volumes, not a name
// without our prefix or with a shape none of our kinds has, not a mark
// whose volume is not removed here.
//
// The grace is first-seen, kept by this provider, not the volume's age: a
// volume is removed once this provider has seen it unused, with the same
// mtime and allocation, on passes spanning at least grace. It needs no
// clock of the host's (the worker's and the host's clocks may differ), a
// volume that changes (an upload in progress, one made anew) starts again,
// and a provider that restarts only starts counting again. A volume younger
// than the grace is never removed, which covers creates and uploads of
// other processes (they define their domain, or write their volume, well
// within it); the removal itself re-reads the volume in the call that
// deletes it and leaves it if it changed, or if a domain of its id came.
//
// What is left: a cached volume's users are read on the pass, not in the
// deleting call; a create in another process whose config still names a
// digest this one does not, and that makes its overlay on that volume
// between the two, would find its base gone and fail transiently (its
// retry uploads it again). Configs of one fleet's workers are meant to
// agree; a rolling change of images is the window.

// sweepSeen is a candidate for removal as this provider last saw it.
type sweepSeen struct {
	stamp string    // mtime and allocation as the host reported them
	since time.Time // when it was first seen unused with that stamp
}

// sweepCandidate is one volume that may be removed.
type sweepCandidate struct {
	name  string
	v     volumeName
	stamp string
	path  string
}

// SweepVolumes removes the entry's volumes that nothing has used for grace
// (above) and returns their names. claim is asked before a proxy's volumes
// are removed: ok false keeps them, and release is called once they are
// removed. It goes on past errors and returns them joined.
func (p *Provider) SweepVolumes(ctx context.Context, grace time.Duration,
	claim func(ctx context.Context, id string) (release func(), ok bool)) ([]string, error) {
	domains, vols, err := p.sweepListing(ctx)
	if err != nil {
		return nil, err
	}
	configured := p.configuredVolumes()
	var cands []sweepCandidate
	cached := false
	for _, name := range vols {
		v, ok := parseVolumeName(name)
		if !ok {
			continue
		}
		switch v.Kind {
		case kindOverlay, kindSeed:
			if domains[domainName(v.ID)] {
				continue
			}
		case kindBase, kindKernel, kindInitrd:
			if v.Host != p.opts.Host.Name || configured[name] {
				continue
			}
			cached = true
		default:
			continue
		}
		cands = append(cands, sweepCandidate{name: name, v: v})
	}
	var errs []error
	var unused []sweepCandidate
	if len(cands) > 0 {
		for i := range cands {
			c := &cands[i]
			c.stamp, c.path, err = p.volStamp(ctx, c.name)
			if err != nil {
				errs = append(errs, err)
				c.stamp = "" // not judged this pass
			}
		}
		var used func(string) bool
		if cached {
			used, err = p.volumeUsers(ctx, vols, cands)
			if err != nil {
				// Users unknown: no cached volume is judged this pass.
				errs = append(errs, err)
				used = func(string) bool { return true }
			}
		}
		for _, c := range cands {
			if c.stamp == "" || (c.v.Kind != kindOverlay && c.v.Kind != kindSeed && used(c.path)) {
				continue
			}
			unused = append(unused, c)
		}
	}
	due := p.sweepDue(unused, grace)

	var removed []string
	byID := map[string][]sweepCandidate{}
	var ids []string
	for _, c := range due {
		if c.v.Kind == kindOverlay || c.v.Kind == kindSeed {
			if byID[c.v.ID] == nil {
				ids = append(ids, c.v.ID)
			}
			byID[c.v.ID] = append(byID[c.v.ID], c)
			continue
		}
		ok, err := p.removeCached(ctx, c, vols)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			removed = append(removed, c.name)
		}
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		release, ok := claim(ctx, id)
		if !ok {
			continue
		}
		names, err := p.removeLeftovers(ctx, id, byID[id])
		release()
		removed = append(removed, names...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	p.forgetSeen(removed)
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("sweep volumes of %s: %w", p.opts.Host.Name, errors.Join(errs...))
	}
	return removed, nil
}

// sweepListing returns the names of every domain on the daemon and of every
// volume in the entry's pool.
func (p *Provider) sweepListing(ctx context.Context) (map[string]bool, []string, error) {
	pool := p.opts.Host.Pool
	var (
		doms  map[string]bool
		names []string
	)
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		ds, _, err := l.ConnectListAllDomains(1, 0)
		if err != nil {
			return fmt.Errorf("list domains: %w", err)
		}
		m := make(map[string]bool, len(ds))
		for _, d := range ds {
			m[d.Name] = true
		}
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		// Best effort: libvirtd refuses while a volume of the pool is
		// being built; what it knows already is enough.
		_ = l.StoragePoolRefresh(sp, 0)
		vols, _, err := l.StoragePoolListAllVolumes(sp, 1, 0)
		if err != nil {
			return fmt.Errorf("list volumes: %w", err)
		}
		ns := make([]string, len(vols))
		for i, v := range vols {
			ns[i] = v.Name
		}
		doms, names = m, ns
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("sweep volumes of %s: %w", p.opts.Host.Name, err)
	}
	return doms, names, nil
}

// configuredVolumes are the cached volume names of the configured images.
func (p *Provider) configuredVolumes() map[string]bool {
	out := map[string]bool{}
	for _, im := range p.byName {
		arts, err := p.images.artifacts(im)
		if err != nil {
			continue // Validate refused such an image already
		}
		for _, a := range arts {
			out[a.name] = true
		}
	}
	return out
}

// stampOf is what tells one version of a volume from another.
func stampOf(st volState) string {
	return st.mtime + "/" + strconv.FormatUint(st.allocation, 10)
}

// volStamp reads a volume's stamp and path; a volume gone meanwhile has
// stamp "".
func (p *Provider) volStamp(ctx context.Context, name string) (string, string, error) {
	pool := p.opts.Host.Pool
	var stamp, path string
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
		var st volState
		if err := readVolState(l, v, &st); err != nil {
			if isNoVolume(err) {
				return nil
			}
			return fmt.Errorf("volume %s: %w", name, err)
		}
		stamp, path = stampOf(st), st.ref.Path
		return nil
	})
	if err != nil {
		return "", "", err
	}
	return stamp, path, nil
}

// sweepDue records the unused candidates of this pass (forgetting every
// other) and returns those seen unused, unchanged, for at least grace.
func (p *Provider) sweepDue(unused []sweepCandidate, grace time.Duration) []sweepCandidate {
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[string]sweepSeen, len(unused))
	var due []sweepCandidate
	for _, c := range unused {
		s, ok := p.sweepSeen[c.name]
		if !ok || s.stamp != c.stamp {
			s = sweepSeen{stamp: c.stamp, since: now}
		}
		seen[c.name] = s
		if now.Sub(s.since) >= grace {
			due = append(due, c)
		}
	}
	p.sweepSeen = seen
	return due
}

func (p *Provider) forgetSeen(names []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range names {
		delete(p.sweepSeen, n)
	}
}

// removeLeftovers removes the due volumes of proxy id, in one call that
// first checks again that no domain of the id is on the daemon and that
// each volume is still the one seen. It returns what it removed.
func (p *Provider) removeLeftovers(ctx context.Context, id string, cands []sweepCandidate) ([]string, error) {
	pool := p.opts.Host.Pool
	var removed []string
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		_, err := l.DomainLookupByName(domainName(id))
		if err == nil {
			return nil // a domain came: they are its
		}
		if !isCode(err, libvirt.ErrNoDomain) {
			return fmt.Errorf("look up domain %s: %w", domainName(id), err)
		}
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		var out []string
		for _, c := range cands {
			ok, err := deleteIfSame(l, sp, c)
			if err != nil {
				return err
			}
			if ok {
				out = append(out, c.name)
			}
		}
		removed = out
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sweep %s: %w", id, err)
	}
	return removed, nil
}

// removeCached removes a due cached volume and its completion marks, in
// one call that first checks the volume is still the one seen.
func (p *Provider) removeCached(ctx context.Context, c sweepCandidate, vols []string) (bool, error) {
	pool := p.opts.Host.Pool
	var marks []string
	for _, n := range vols {
		if strings.HasPrefix(n, c.name+".") && strings.HasSuffix(n, markSuffix) {
			marks = append(marks, n)
		}
	}
	var removed bool
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		sp, err := l.StoragePoolLookupByName(pool)
		if err != nil {
			return poolErr(pool, err)
		}
		same, err := isSame(l, sp, c)
		if err != nil || !same {
			return err
		}
		// Marks first: a volume without its mark is never used, a mark
		// without its volume is harmless.
		for _, m := range marks {
			if err := deleteByName(l, sp, m); err != nil {
				return fmt.Errorf("delete mark %s: %w", m, err)
			}
		}
		ok, err := deleteIfSame(l, sp, c)
		removed = ok
		return err
	})
	if err != nil {
		return false, fmt.Errorf("sweep %s: %w", c.name, err)
	}
	return removed, nil
}

// isSame reports whether c's volume is there with the stamp it was seen
// with.
func isSame(l *libvirt.Libvirt, sp libvirt.StoragePool, c sweepCandidate) (bool, error) {
	v, err := l.StorageVolLookupByName(sp, c.name)
	if isNoVolume(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up volume %s: %w", c.name, err)
	}
	var st volState
	if err := readVolState(l, v, &st); err != nil {
		if isNoVolume(err) {
			return false, nil
		}
		return false, fmt.Errorf("volume %s: %w", c.name, err)
	}
	return stampOf(st) == c.stamp, nil
}

// deleteIfSame deletes c's volume if it is still the one seen.
func deleteIfSame(l *libvirt.Libvirt, sp libvirt.StoragePool, c sweepCandidate) (bool, error) {
	same, err := isSame(l, sp, c)
	if err != nil || !same {
		return false, err
	}
	v, err := l.StorageVolLookupByName(sp, c.name)
	if isNoVolume(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up volume %s: %w", c.name, err)
	}
	if err := l.StorageVolDelete(v, 0); err != nil {
		if isNoVolume(err) {
			return false, nil
		}
		return false, fmt.Errorf("delete volume %s: %w", c.name, err)
	}
	return true, nil
}
