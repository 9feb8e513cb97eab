package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// The base image cache of one host entry. Every image
// artifact a proxy boots from (its disk, and the kernel and initrd of a
// direct kernel boot) is uploaded once per host entry into a volume of the
// entry's pool, named by entry and digest (names.go: pf-base-<host>-<d16>.fmt,
// pf-kernel-<host>-<d16>, pf-initrd-<host>-<d16>), used only with its
// completion mark (imagemark.go), and reused by every proxy made from it:
// two entries may share one pool, and a volume named for the image alone let
// one entry use what another had uploaded from another URL, or had not
// finished uploading. This file holds the cache and its single flight; the
// upload is in imageupload.go, its sources in imagesource.go. A cached
// volume that no configured image names and nothing uses is removed after a
// grace by the volume sweep (sweep.go).
//
// # Single flight
//
// Across processes: StorageVolCreateXML is atomic in libvirtd (the pool
// object is locked while the name is checked and the volume added), so the
// process whose create succeeds is the uploader; every other one gets
// "storage volume already exists" and waits, polling for the mark, bounded by
// its ctx. An uploader that dies leaves a volume without a mark that stops
// changing; a waiter that sees its allocation and mtime unchanged for
// imageCache.stale (default twice the transfer-stall budget: a live uploader's
// own watchdog cuts it after one stall budget) presumes it dead, deletes the
// mark (if any) and the volume, and tries to become the uploader itself.
// Within one process, goroutines wanting the same volume are serialised by
// a per-name lock, so the second finds the first one's mark.
//
// The stale takeover re-reads the volume's allocation and mtime in the same
// libvirt call that deletes it, so a volume that moved, or was replaced by a
// fresh upload, is left alone. What is left is a window of one round trip
// between that re-read and the delete, in which a second waiter would have
// to have deleted and re-created the volume: two waiters judging one dead
// upload stale within the same millisecond. The loser's stream then goes
// on into a deleted file; it can mark the new volume only before that
// volume's own uploader is done, and readers accept that mark only if the
// new volume is not written to after it, that is if its uploader died at
// that very moment. That residue is accepted, and documented here.

// volRef is a cached volume, as libvirt reports it.
type volRef struct {
	Name   string
	Path   string // StorageVolGetPath
	Format string // "qcow2" or "raw"
	// Capacity is the volume's size as libvirt sees it: for a qcow2 image
	// its virtual size (the floor of an overlay's capacity), else its
	// length.
	Capacity uint64
}

// imageVolumes are the cached volumes of one image on one host entry.
type imageVolumes struct {
	Base           volRef
	Kernel, Initrd *volRef // nil when the image has none
}

// Progress is a report on one upload into the cache.
type Progress struct {
	Image  string // ImageSource.Name
	Volume string // the volume being filled
	Done   int64  // bytes uploaded so far
	Total  int64  // bytes to upload
	// Rate is the average rate since the upload started, in bytes/s.
	Rate float64
}

// imageCache keeps the cached volumes of one host entry. Its zero tuning
// fields take the defaults named on them. Its methods are safe for
// concurrent use; it must not be copied after first use.
type imageCache struct {
	host       string // host ENTRY name (HostOptions.Name), part of every volume name
	pool       string // libvirt storage pool name
	link       *Link  // the host's shared link; uploads go through link.transfer
	budgets    Budgets
	httpClient *http.Client // nil: http.DefaultClient
	log        *slog.Logger // names the host already (the provider's); nil: slog.Default()
	// onProgress, if set, hears of every upload: once as it starts (Done
	// 0), at most every progressEvery while it runs, and once when all
	// bytes are through (Done == Total). It is called from the
	// transfer's goroutine and must not block.
	onProgress func(Progress)
	// stale: a volume without a mark whose allocation and mtime have not
	// changed for this long is an abandoned upload. Default
	// 2×Budgets.TransferStall.
	stale time.Duration

	// poll is how often a waiter looks for the mark; default 1s (at most
	// stale/4).
	poll time.Duration
	// transferLimit bounds one artifact's download and upload; default
	// 20 minutes. The caller's ctx bounds it too.
	transferLimit time.Duration
	// downloadMargin: the download's deadline is this far inside the
	// transfer's (at most a quarter of what is left); default 1 minute.
	downloadMargin time.Duration
	// progressEvery is the least time between two progress reports;
	// default 500ms.
	progressEvery time.Duration
	// discardWait is how long a discard retries a volume that libvirtd
	// still holds; default 10s.
	discardWait time.Duration
	// trace, if set, hears of decisions (tests): "upload", "direct",
	// "stream", "wait", "takeover", "discard", each with the volume's
	// name.
	trace func(event, volume string)
	// streamOnly: upload through the libvirt stream even into a
	// directory pool (tests of the stream; directupload.go).
	streamOnly bool

	mu      sync.Mutex
	flights map[string]*flight
}

// Defaults of imageCache's tuning fields.
const (
	defaultImagePoll      = time.Second
	defaultTransferLimit  = 20 * time.Minute
	defaultDownloadMargin = time.Minute
	defaultProgressEvery  = 500 * time.Millisecond
	defaultDiscardWait    = 10 * time.Second
	markSuffix            = ".ok"
)

func (c *imageCache) logger() *slog.Logger {
	if c.log == nil {
		return slog.Default()
	}
	return c.log
}

func (c *imageCache) staleAfter() time.Duration {
	if c.stale > 0 {
		return c.stale
	}
	return 2 * c.budgets.WithDefaults().TransferStall
}

func (c *imageCache) pollEvery() time.Duration {
	p := c.poll
	if p <= 0 {
		p = defaultImagePoll
	}
	return max(min(p, c.staleAfter()/4), time.Millisecond)
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (c *imageCache) note(event, volume string) {
	if c.trace != nil {
		c.trace(event, volume)
	}
}

// artifact is one file of an image to cache.
type artifact struct {
	image  string // ImageSource.Name
	kind   string // "base", "kernel" or "initrd"
	name   string // volume name
	url    string
	sha    string // lowercase hex
	format string
}

// artifacts lists img's files with their volume names. A bad config is
// permanent.
func (c *imageCache) artifacts(img ImageSource) ([]artifact, error) {
	img = img.WithDefaults()
	bad := func(err error) error {
		return fleet.Permanent(fmt.Errorf("image %s on %s: %w", img.Name, c.host, err))
	}
	base, err := baseVolumeName(c.host, img.SHA256, img.Format)
	if err != nil {
		return nil, bad(err)
	}
	arts := []artifact{{image: img.Name, kind: "base", name: base, url: img.URL, sha: strings.ToLower(img.SHA256), format: img.Format}}
	for _, x := range []struct {
		a    *ArtifactSource
		kind string
		name func(host, sha string) (string, error)
	}{{img.Kernel, "kernel", kernelVolumeName}, {img.Initrd, "initrd", initrdVolumeName}} {
		if x.a == nil {
			continue
		}
		n, err := x.name(c.host, x.a.SHA256)
		if err != nil {
			return nil, bad(fmt.Errorf("%s: %w", x.kind, err))
		}
		arts = append(arts, artifact{image: img.Name, kind: x.kind, name: n, url: x.a.URL, sha: strings.ToLower(x.a.SHA256), format: "raw"})
	}
	for _, a := range arts {
		if _, err := sourceKind(a.url); err != nil {
			return nil, bad(err)
		}
	}
	return arts, nil
}

// ensure returns img's volumes on this host entry, uploading whatever is
// not there yet with a completion mark (imagemark.go), one uploader at a
// time (single flight, above). It returns once every volume is verified and
// marked, or with a classified error: permanent for a wrong config or a
// digest that does not match what the mirror serves, transient for network,
// libvirt and ctx trouble.
func (c *imageCache) ensure(ctx context.Context, img ImageSource) (imageVolumes, error) {
	arts, err := c.artifacts(img)
	if err != nil {
		return imageVolumes{}, err
	}
	var vols imageVolumes
	for _, a := range arts {
		ref, err := c.ensureArtifact(ctx, a)
		if err != nil {
			return imageVolumes{}, err
		}
		switch a.kind {
		case "base":
			vols.Base = ref
		case "kernel":
			vols.Kernel = &ref
		case "initrd":
			vols.Initrd = &ref
		}
	}
	return vols, nil
}

// flight serialises the goroutines of one process that want one volume.
type flight struct {
	sem     chan struct{}
	waiters int
}

// acquire takes the per-volume lock of this process.
func (c *imageCache) acquire(ctx context.Context, name string) (release func(), err error) {
	c.mu.Lock()
	if c.flights == nil {
		c.flights = map[string]*flight{}
	}
	f := c.flights[name]
	if f == nil {
		f = &flight{sem: make(chan struct{}, 1)}
		c.flights[name] = f
	}
	f.waiters++
	c.mu.Unlock()
	done := func() {
		c.mu.Lock()
		if f.waiters--; f.waiters == 0 {
			delete(c.flights, name)
		}
		c.mu.Unlock()
	}
	select {
	case f.sem <- struct{}{}:
		return func() { <-f.sem; done() }, nil
	case <-ctx.Done():
		done()
		return nil, fleet.Transient(fmt.Errorf("volume %s: waiting for another upload in this process: %w", name, ctx.Err()))
	}
}

// errLostRace says another process created the volume first.
var errLostRace = errors.New("volume created by another uploader")

// ensureArtifact makes sure one artifact's volume is there and marked.
func (c *imageCache) ensureArtifact(ctx context.Context, a artifact) (volRef, error) {
	release, err := c.acquire(ctx, a.name)
	if err != nil {
		return volRef{}, err
	}
	defer release()
	log := c.logger().With("image", a.image, "volume", a.name) // the logger names the host
	stale, poll := c.staleAfter(), c.pollEvery()

	var (
		seen        volState  // the unmarked volume as last seen changing
		seenSince   time.Time // when it was last seen changing
		waiting     bool
		blockWarned bool
	)
	for {
		st, err := c.inspect(ctx, a)
		if err != nil {
			return volRef{}, err
		}
		switch {
		case st.ready:
			return st.ref, nil
		case !st.exists:
			err := c.upload(ctx, a, log)
			if errors.Is(err, errLostRace) {
				// Someone else is uploading: wait for their mark.
				if err := sleepCtx(ctx, poll); err != nil {
					return volRef{}, fleet.Transient(fmt.Errorf("volume %s: waiting for its completion mark: %w", a.name, err))
				}
				continue
			}
			if err != nil {
				return volRef{}, err
			}
			// Read back what was just written: the mark is trusted only
			// as libvirt returns it.
			st, err := c.inspect(ctx, a)
			if err != nil {
				return volRef{}, err
			}
			if !st.ready {
				return volRef{}, fleet.Transient(fmt.Errorf("volume %s: uploaded and marked, but the mark does not read back (%s)", a.name, st.why))
			}
			return st.ref, nil
		}
		// The volume is there without a valid mark: an upload in
		// progress, or an abandoned one.
		now := time.Now()
		if !waiting {
			waiting = true
			c.note("wait", a.name)
			log.Info("image volume present without a completion mark; waiting for its uploader", "why", st.why)
		}
		if seenSince.IsZero() || st.allocation != seen.allocation || st.mtime != seen.mtime {
			seen, seenSince = st, now
		} else if now.Sub(seenSince) >= stale && !seen.fileVol {
			// A block volume (LVM, a disk) is fully allocated when made
			// and has no mtime: nothing shows an upload is alive, so
			// none is presumed dead. An operator removes it.
			if !blockWarned {
				blockWarned = true
				log.Warn("unmarked image volume is not a file; cannot tell a dead upload from a live one, not taking it over")
			}
		} else if now.Sub(seenSince) >= stale {
			took, err := c.takeOver(ctx, a, seen)
			if err != nil {
				log.Warn("taking over an abandoned upload failed; still waiting", "err", err)
			}
			if took {
				c.note("takeover", a.name)
				log.Warn("abandoned upload taken over", "unchanged_for", now.Sub(seenSince).Round(time.Millisecond),
					"allocation", seen.allocation)
				seenSince = time.Time{}
				continue
			}
			seenSince = time.Time{}
		}
		if err := sleepCtx(ctx, poll); err != nil {
			return volRef{}, fleet.Transient(fmt.Errorf("volume %s: waiting for its completion mark: %w", a.name, err))
		}
	}
}

// sleepCtx waits d or until ctx is done (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// takeOver deletes an abandoned upload: the mark (if any) and then the
// volume, in the same call that checks the volume is still the one seen
// unchanged and still has no valid mark. It reports whether it deleted.
func (c *imageCache) takeOver(ctx context.Context, a artifact, seen volState) (bool, error) {
	took := false
	err := c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		vol, err := l.StorageVolLookupByName(pool, a.name)
		if isNoVolume(err) {
			took = true // gone already: someone else took it over
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", a.name, err)
		}
		var st volState
		if err := readVolState(l, vol, &st); err != nil {
			return fmt.Errorf("volume %s: %w", a.name, err)
		}
		if st.allocation != seen.allocation || st.mtime != seen.mtime {
			return nil // it moved after all
		}
		why, err := checkMark(l, pool, a, &st)
		if err != nil {
			return fmt.Errorf("mark of %s: %w", a.name, err)
		}
		if why == "" {
			return nil // marked meanwhile
		}
		if err := deleteByName(l, pool, markName(a)); err != nil {
			return fmt.Errorf("delete mark of %s: %w", a.name, err)
		}
		if err := l.StorageVolDelete(vol, 0); err != nil && !isNoVolume(err) {
			return fmt.Errorf("delete abandoned volume %s: %w", a.name, err)
		}
		took = true
		return nil
	})
	if err != nil {
		return false, err // an abandoned call may still write took
	}
	return took, nil
}
