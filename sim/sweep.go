package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// SweepVolumes removes the volumes (volumes/<id>.disk) that have no domain
// and were last written more than grace ago, each after claim(ctx, id) said
// yes and under the id's lock, checking again there that no domain is
// there. It returns the removed volumes' file names. The simulated host has
// no image cache, so there is nothing else to sweep.
func (d *Driver) SweepVolumes(ctx context.Context, grace time.Duration,
	claim func(ctx context.Context, id string) (release func(), ok bool)) ([]string, error) {
	if err := d.pause(ctx, d.cfg.Delay); err != nil {
		return nil, err
	}
	names, err := filepath.Glob(filepath.Join(d.cfg.Dir, "volumes", "*.disk"))
	if err != nil {
		return nil, fleet.Transient(err)
	}
	sort.Strings(names)
	var removed []string
	var errs []error
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return removed, fleet.Transient(err)
		}
		id := strings.TrimSuffix(filepath.Base(n), ".disk")
		if !messages.ValidID(id) || !d.orphan(id, grace) {
			continue
		}
		release, ok := claim(ctx, id)
		if !ok {
			continue
		}
		gone, err := d.sweepOne(ctx, id, grace)
		release()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if gone {
			removed = append(removed, filepath.Base(n))
		}
	}
	return removed, errors.Join(errs...)
}

// orphan reports whether id's volume is there, has no domain, and was last
// written more than grace ago.
func (d *Driver) orphan(id string, grace time.Duration) bool {
	if _, err := os.Stat(d.domainPath(id)); !errors.Is(err, os.ErrNotExist) {
		return false // a domain, or an unreadable directory: keep
	}
	fi, err := os.Stat(VolumePath(d.cfg.Dir, id))
	return err == nil && d.cfg.Now().Sub(fi.ModTime()) >= grace
}

// sweepOne removes id's volume under the id's lock if it is still an orphan.
func (d *Driver) sweepOne(ctx context.Context, id string, grace time.Duration) (bool, error) {
	unlock, err := d.enter(ctx, "sweep", id)
	if err != nil {
		return false, err
	}
	defer unlock()
	if !d.orphan(id, grace) {
		return false, nil
	}
	if err := os.Remove(VolumePath(d.cfg.Dir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fleet.Transient(fmt.Errorf("sweep volume %s: %w", id, err))
	}
	return true, nil
}
