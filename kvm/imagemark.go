package kvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/fleet"
)

// The completion mark of a cached volume: a volume is used only with one.
//
// The mark of volume V is a second volume in the same pool, named
// "V.<sha256>.ok" (the artifact's whole digest) and made, empty and sparse,
// with the verified length as its capacity. It is created last, in one
// atomic StorageVolCreateXML, only after the bytes streamed into V were
// counted and hashed on the way and matched the config's sha256 and size.
// It is read back with plain calls: found by its name (so its sha256 is the
// artifact's, or it is not found), its capacity (the length) equal to V's
// size on disk, and its mtime not before V's (both are stamped by the
// host's file system, one clock). A volume alone, a mark alone (its volume
// swept away), a mark left over from an earlier upload of the same name
// (older than the new volume), or a volume written to after its mark was
// made (newer than the mark), is never used.
//
// Why a volume, and why nothing is written into it: storage volumes have no
// metadata element (domains have, volumes do not), and a mark must live on
// the host, next to its volume, so that every process and every worker reads
// the same truth (DESIGN.md, semantics 6: read back, not remembered). A mark
// holding JSON would need StorageVolUpload and StorageVolDownload on the
// shared link, and the pinned go-libvirt's download can wedge a whole link:
// its socket reader delivers a stream's trailing reply to the caller's
// channel while holding the callback lock, after the caller has stopped
// reading and is waiting for that lock to deregister. Seen here as a call
// on the shared link stuck past its budget, with goroutines that a kill
// could not end. So a mark is only created, looked up, stat'ed and deleted.
//
// The ".<sha256>.ok" tail is not a shape parseVolumeName knows, so the
// volume sweep (sweep.go) never takes a mark for a volume: it removes a
// mark only with the cached volume it vouches for (the mark first). A mark
// without its volume is harmless (ignored, and removed by the next upload
// of that volume).

// markName is the completion mark's name of a's volume.
func markName(a artifact) string { return a.name + "." + a.sha + markSuffix }

// volState is what inspect found.
type volState struct {
	exists     bool
	ready      bool   // exists with a valid mark: ref is usable
	why        string // why not ready
	ref        volRef
	allocation uint64
	physical   uint64 // 0 if not reported
	fileVol    bool   // a plain file, whose physical size is its length
	mtime      string
}

// inspect reads a's volume and its mark, in one call on the shared link.
func (c *imageCache) inspect(ctx context.Context, a artifact) (volState, error) {
	var st volState
	err := c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		st = volState{}
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		vol, err := l.StorageVolLookupByName(pool, a.name)
		if isNoVolume(err) {
			st.why = "no volume"
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", a.name, err)
		}
		if err := readVolState(l, vol, &st); err != nil {
			if isNoVolume(err) { // deleted under us
				st = volState{why: "no volume"}
				return nil
			}
			return fmt.Errorf("volume %s: %w", a.name, err)
		}
		st.ref.Name, st.ref.Format = a.name, a.format
		st.why, err = checkMark(l, pool, a, &st)
		if err != nil {
			return fmt.Errorf("mark of %s: %w", a.name, err)
		}
		st.ready = st.why == ""
		return nil
	})
	if err != nil {
		return volState{}, fmt.Errorf("image cache %s: %w", c.host, err)
	}
	return st, nil
}

// readVolState fills st from vol's info, XML and path.
func readVolState(l *libvirt.Libvirt, vol libvirt.StorageVol, st *volState) error {
	// StorageVolGetInfo and GetXMLDesc stat the volume afresh (libvirt's
	// refreshVol), so sizes and mtime are current without a pool refresh.
	typ, capacity, allocation, err := l.StorageVolGetInfo(vol)
	if err != nil {
		return fmt.Errorf("info: %w", err)
	}
	x, err := l.StorageVolGetXMLDesc(vol, 0)
	if err != nil {
		return fmt.Errorf("xml: %w", err)
	}
	var def libvirtxml.StorageVolume
	if err := def.Unmarshal(x); err != nil {
		return fmt.Errorf("xml: %w", err)
	}
	path, err := l.StorageVolGetPath(vol)
	if err != nil {
		return fmt.Errorf("path: %w", err)
	}
	st.exists = true
	st.ref.Path, st.ref.Capacity = path, capacity
	st.allocation = allocation
	st.fileVol = libvirt.StorageVolType(typ) == libvirt.StorageVolFile
	if def.Physical != nil {
		st.physical = sizeBytes(def.Physical)
	}
	if def.Target != nil && def.Target.Timestamps != nil {
		st.mtime = def.Target.Timestamps.Mtime
	}
	return nil
}

func sizeBytes(s *libvirtxml.StorageVolumeSize) uint64 {
	switch s.Unit {
	case "", "b", "B", "bytes":
		return s.Value
	}
	return 0 // libvirt reports bytes; anything else is not compared
}

// checkMark reads a's mark and says why it does not vouch for a's volume
// as st found it, or "" if it does.
func checkMark(l *libvirt.Libvirt, pool libvirt.StoragePool, a artifact, st *volState) (string, error) {
	mv, err := l.StorageVolLookupByName(pool, markName(a))
	if isNoVolume(err) {
		return "no completion mark", nil
	}
	if err != nil {
		return "", err
	}
	var m volState
	if err := readVolState(l, mv, &m); err != nil {
		if isNoVolume(err) {
			return "no completion mark", nil
		}
		return "", err
	}
	if st.fileVol && st.physical != 0 && st.physical != m.ref.Capacity {
		return fmt.Sprintf("volume is %d bytes, its mark says %d", st.physical, m.ref.Capacity), nil
	}
	if newer(st.mtime, m.mtime) {
		return fmt.Sprintf("volume (mtime %s) is newer than its mark (%s)", st.mtime, m.mtime), nil
	}
	return "", nil
}

// newer reports whether file time a ("seconds.nanoseconds", as libvirt
// formats it) is after b. Times that do not parse (a pool that reports
// none) are never newer.
func newer(a, b string) bool {
	as, an, ok1 := parseFileTime(a)
	bs, bn, ok2 := parseFileTime(b)
	if !ok1 || !ok2 {
		return false
	}
	return as > bs || as == bs && an > bn
}

func parseFileTime(t string) (sec, nsec int64, ok bool) {
	s, n, _ := strings.Cut(t, ".")
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if n != "" {
		if len(n) > 9 {
			n = n[:9]
		}
		n += strings.Repeat("0", 9-len(n))
		if nsec, err = strconv.ParseInt(n, 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return sec, nsec, true
}

func isNoVolume(err error) bool {
	var le libvirt.Error
	return errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrNoStorageVol
}

func isVolExists(err error) bool {
	var le libvirt.Error
	return errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrStorageVolExist
}

// deleteByName deletes a volume of pool if it is there.
func deleteByName(l *libvirt.Libvirt, pool libvirt.StoragePool, name string) error {
	vol, err := l.StorageVolLookupByName(pool, name)
	if isNoVolume(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := l.StorageVolDelete(vol, 0); err != nil && !isNoVolume(err) {
		return err
	}
	return nil
}

// mark makes a's completion mark: after a pool refresh (best effort) and a
// last look at the volume's size on disk, one StorageVolCreateXML of an
// empty, sparse volume named for the digest with the length as capacity.
// There is nothing to write into it, so there is no half-made mark.
func (c *imageCache) mark(ctx context.Context, a artifact, length int64) error {
	x, err := (&libvirtxml.StorageVolume{
		Name:       markName(a),
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(length)},
		Target:     &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}).Marshal()
	if err != nil {
		return fleet.Permanent(fmt.Errorf("mark xml: %w", err))
	}
	err = c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		// Best effort: libvirtd refreshes the pool itself after an
		// upload, and refuses while another volume of the pool is being
		// built; the volume's own info is read afresh below anyway.
		_ = l.StoragePoolRefresh(pool, 0)
		vol, err := l.StorageVolLookupByName(pool, a.name)
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", a.name, err)
		}
		var st volState
		if err := readVolState(l, vol, &st); err != nil {
			return fmt.Errorf("volume %s: %w", a.name, err)
		}
		if st.fileVol && st.physical != 0 && st.physical != uint64(length) {
			return fleet.Transient(fmt.Errorf("volume %s is %d bytes after an upload of %d", a.name, st.physical, length))
		}
		_, err = l.StorageVolCreateXML(pool, x, 0)
		if isVolExists(err) {
			// Left by an upload that lost a takeover race (image.go,
			// single flight): the bytes verified here are newer.
			if err := deleteByName(l, pool, markName(a)); err != nil {
				return fmt.Errorf("replace mark %s: %w", markName(a), err)
			}
			_, err = l.StorageVolCreateXML(pool, x, 0)
		}
		if err != nil {
			return fmt.Errorf("create mark %s: %w", markName(a), err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("image cache %s: %w", c.host, err)
	}
	return nil
}
