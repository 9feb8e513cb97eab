package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"proxyfleet/config"
	"proxyfleet/fleet"
)

// The base image cache of one host entry.
//
// Every image a proxy boots from (its disk, and the kernel and initrd of a
// direct kernel boot) is downloaded once per host entry into a volume of the
// entry's pool, named by entry and digest (names.go: pf-base-<host>-<d16>.fmt,
// pf-kernel-<host>-<d16>, pf-initrd-<host>-<d16>), and reused by every proxy
// made from it. Review finding H4 is why the name holds the entry and the
// digest and why a volume is only used with a completion mark: two entries
// may share one libvirt pool, and a volume from the image name alone let one
// entry use what another had uploaded from another URL, or had not finished
// uploading.
//
// # The completion mark
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
// The ".<sha256>.ok" tail is not a shape parseVolumeName knows, so a sweep
// that removes volumes of ours leaves marks alone; a mark without its
// volume is harmless (ignored, and removed by the next upload of that
// volume).
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
//
// # Transfers (review finding H2)
//
// A download streams straight into StorageVolUpload on the link's dedicated
// transfer connection (Link.transfer), through a reader that counts and
// hashes. Under go-libvirt sits eofReader: any error of the source reaches
// go-libvirt as io.EOF (the one outcome that ends its stream sender the
// normal way) and is kept, to be returned once StorageVolUpload has
// returned. The download has its own deadline, downloadMargin inside the
// transfer's own, so a slow mirror ends the stream through the reader, not
// through a killed connection. A failed upload's volume is discarded after
// Link.transfer has returned, that is after its dedicated connection is
// closed, and the delete is retried while libvirtd still holds the volume.
//
// HTTP sources must send a Content-Length: a volume is created with the
// artifact's size before any byte is read, and staging multi-gigabyte images
// on the worker's disk first would cost what the streaming saves. A mirror
// that does not send one is refused (permanent), as is one that compresses
// the body (identity encoding is asked for).

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
	Image  string // config image name
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
	host       string // host ENTRY name (config hosts[].name), part of every volume name
	pool       string // libvirt storage pool name
	link       *Link  // the host's shared link; uploads go through link.transfer
	budgets    Budgets
	httpClient *http.Client // nil: http.DefaultClient
	log        *slog.Logger // nil: slog.Default()
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
	// trace, if set, hears of decisions (tests): "upload", "wait",
	// "takeover", "discard", each with the volume's name.
	trace func(event, volume string)

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
	return 2 * c.budgets.withDefaults().TransferStall
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
	image  string // config image name
	kind   string // "base", "kernel" or "initrd"
	name   string // volume name
	url    string
	sha    string // lowercase hex
	format string
}

// artifacts lists img's files with their volume names. A bad config is
// permanent.
func (c *imageCache) artifacts(img config.Image) ([]artifact, error) {
	bad := func(err error) error {
		return fleet.Permanent(fmt.Errorf("image %s on %s: %w", img.Name, c.host, err))
	}
	base, err := baseVolumeName(c.host, img.SHA256, img.Format)
	if err != nil {
		return nil, bad(err)
	}
	arts := []artifact{{image: img.Name, kind: "base", name: base, url: img.URL, sha: strings.ToLower(img.SHA256), format: img.Format}}
	for _, x := range []struct {
		a    *config.Artifact
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
// not there yet with a completion mark (see the comment at the top of this
// file). It returns once every volume is verified and marked, or with a
// classified error: permanent for a wrong config or a digest that does not
// match what the mirror serves, transient for network, libvirt and ctx
// trouble.
func (c *imageCache) ensure(ctx context.Context, img config.Image) (imageVolumes, error) {
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
	log := c.logger().With("host", c.host, "image", a.image, "volume", a.name)
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

// upload tries to become a's uploader: it opens the source, creates the
// volume (errLostRace if another process did first), streams the source
// into it, verifies length and sha256, and writes the mark. On any failure
// after the create it discards the volume (and the mark), after the
// transfer's dedicated connection is closed.
func (c *imageCache) upload(ctx context.Context, a artifact, log *slog.Logger) error {
	// The transfer's deadline, and the download's a margin inside it.
	tctx, cancel := context.WithTimeout(ctx, orDefault(c.transferLimit, defaultTransferLimit))
	defer cancel()
	deadline, _ := tctx.Deadline()
	margin := min(orDefault(c.downloadMargin, defaultDownloadMargin), time.Until(deadline)/4)
	dctx, dcancel := context.WithDeadline(tctx, deadline.Add(-margin))
	defer dcancel()

	src, err := c.open(dctx, a.url)
	if err != nil {
		return fmt.Errorf("image %s: %w", a.image, err)
	}
	defer src.Close()

	if err := c.create(ctx, a, uint64(src.size)); err != nil {
		return err
	}
	c.note("upload", a.name)
	start := time.Now()
	log.Info("uploading image", "url", a.url, "bytes", src.size)

	fail := func(err error) error {
		c.discard(ctx, a, log)
		log.Warn("image upload failed; volume discarded", "err", err, "after", time.Since(start).Round(time.Millisecond))
		return err
	}
	// We hold the volume: a mark of that name is left over from an earlier
	// upload and goes before a byte moves (readers reject it anyway: it is
	// older than the volume).
	if err := c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return err
		}
		return deleteByName(l, pool, markName(a))
	}); err != nil {
		return fail(fmt.Errorf("image cache %s: delete stale mark of %s: %w", c.host, a.name, err))
	}

	cr := &countingReader{
		r: io.LimitReader(src, src.size), closer: src, h: sha256.New(),
		report: c.reporter(a, src.size, start, log),
	}
	cr.report(0, false)
	var uploadErr atomic.Pointer[error] // libvirt's answer, when the source failed too
	err = c.link.transfer(tctx, cr, func(l *libvirt.Libvirt, r io.Reader) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		vol, err := l.StorageVolLookupByName(pool, a.name)
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", a.name, err)
		}
		er := &eofReader{r: r}
		err = l.StorageVolUpload(vol, er, 0, uint64(src.size), 0)
		if srcErr := er.Err(); srcErr != nil {
			if err != nil {
				uploadErr.Store(&err)
			}
			return fmt.Errorf("download: %w", srcErr)
		}
		if err != nil {
			return fmt.Errorf("upload %s: %w", a.name, err)
		}
		return nil
	})
	// Link.transfer has returned: its dedicated connection is closed (or
	// killed), so libvirtd is letting go of the volume.
	if err != nil {
		if p := uploadErr.Load(); p != nil {
			log.Info("libvirt's answer to the aborted stream", "err", *p)
		}
		return fail(c.transferError(a, err))
	}
	n, sum := cr.n.Load(), hex.EncodeToString(cr.h.Sum(nil))
	if n != src.size {
		return fail(fleet.Transient(fmt.Errorf("image %s: %s gave %d bytes, want %d", a.image, a.url, n, src.size)))
	}
	if sum != a.sha {
		return fail(fleet.Permanent(fmt.Errorf("image %s: %s has sha256 %s, the config says %s", a.image, a.url, sum, a.sha)))
	}
	cr.report(n, true)
	if err := c.mark(ctx, a, n); err != nil {
		return fail(err)
	}
	took := time.Since(start)
	log.Info("image uploaded, verified and marked", "bytes", n, "took", took.Round(time.Millisecond),
		"rate_mib_s", fmt.Sprintf("%.1f", float64(n)/took.Seconds()/(1<<20)))
	return nil
}

// transferError classes a failed transfer transient, whatever failed: the
// source (a mirror or the network), the link or libvirtd mid-stream. A
// wrong config or a wrong digest is caught before (open) or after (the
// verification), never here.
func (c *imageCache) transferError(a artifact, err error) error {
	return fleet.Transient(fmt.Errorf("image %s: upload %s from %s: %w", a.image, a.name, a.url, err))
}

// create makes a's volume of size bytes. errLostRace: it was there.
func (c *imageCache) create(ctx context.Context, a artifact, size uint64) error {
	x, err := plainVolumeXML(a.name, size, a.format)
	if err != nil {
		return fleet.Permanent(fmt.Errorf("image %s: %w", a.image, err))
	}
	lost := false
	err = c.link.call(ctx, 0, func(l *libvirt.Libvirt) error {
		pool, err := l.StoragePoolLookupByName(c.pool)
		if err != nil {
			return fmt.Errorf("look up pool %s: %w", c.pool, err)
		}
		_, err = l.StorageVolCreateXML(pool, x, 0)
		if err == nil {
			return nil
		}
		if isVolExists(err) {
			lost = true
			return nil
		}
		// A file of that name unknown to libvirt (made behind its back)
		// fails the create otherwise: refresh and look again, and if it
		// is there now, it is an unmarked volume like any other.
		createErr := err
		if err := l.StoragePoolRefresh(pool, 0); err == nil {
			if _, err := l.StorageVolLookupByName(pool, a.name); err == nil {
				lost = true
				return nil
			}
		}
		return fmt.Errorf("create volume %s: %w", a.name, createErr)
	})
	if err != nil {
		return fmt.Errorf("image cache %s: %w", c.host, err)
	}
	if lost {
		return errLostRace
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
			// Left by an upload that lost a takeover race (see the
			// top of this file): the bytes verified here are newer.
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

// discard deletes a's mark and volume after a failed upload, retrying for
// discardWait while libvirtd still holds the volume (the stream of a cut
// transfer ends on its side a moment after our connection closed). It runs
// even when ctx is done: a failed upload must not leave a volume behind.
// Each attempt is a call under the call budget with a ctx that is never
// cancelled, so that running out of discardWait never kills the shared link
// in the middle of a delete; the wait is checked between attempts.
func (c *imageCache) discard(ctx context.Context, a artifact, log *slog.Logger) {
	c.note("discard", a.name)
	wait := orDefault(c.discardWait, defaultDiscardWait)
	cctx := context.WithoutCancel(ctx)
	dctx, cancel := context.WithTimeout(cctx, wait)
	defer cancel()
	var err error
	for {
		err = c.link.call(cctx, 0, func(l *libvirt.Libvirt) error {
			pool, err := l.StoragePoolLookupByName(c.pool)
			if err != nil {
				return err
			}
			if err := deleteByName(l, pool, markName(a)); err != nil {
				return err
			}
			return deleteByName(l, pool, a.name)
		})
		if err == nil {
			return
		}
		t := time.NewTimer(min(wait/20+time.Millisecond, 200*time.Millisecond))
		select {
		case <-t.C:
			continue
		case <-dctx.Done():
			t.Stop()
		}
		break
	}
	log.Error("could not discard a failed upload's volume; a waiter will take it over as stale", "err", err)
}

// eofReader sits between go-libvirt's stream sender and a source: any error
// of the source reaches go-libvirt as io.EOF, the one outcome that ends a
// stream the normal way, and is kept for Err. Review finding H2: a non-EOF
// error makes go-libvirt send an error packet and, in revisions with
// unbuffered stream channels (v0.0.0-20260217163227-273eaa321819), wedges
// StorageVolUpload for good when libvirtd answers it with an error. The
// short stream this ends instead leaves a volume that is never marked and is
// discarded.
type eofReader struct {
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (e *eofReader) Read(p []byte) (int, error) {
	e.mu.Lock()
	failed := e.err != nil
	e.mu.Unlock()
	if failed {
		return 0, io.EOF
	}
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.mu.Lock()
		e.err = err
		e.mu.Unlock()
		return n, io.EOF
	}
	return n, err
}

// Err is the source's error, if it had one.
func (e *eofReader) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// countingReader counts and hashes what is read through it and reports
// progress. Close closes the source (the transfer watchdog's way to unblock
// a stalled read).
type countingReader struct {
	r      io.Reader
	closer io.Closer
	h      hash.Hash
	n      atomic.Int64
	report func(done int64, final bool)
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.h.Write(p[:n])
		r.report(r.n.Add(int64(n)), false)
	}
	return n, err
}

func (r *countingReader) Close() error { return r.closer.Close() }

// reporter returns the progress callback of one upload: it calls
// onProgress and logs at most every progressEvery, and always for the
// start and the end.
func (c *imageCache) reporter(a artifact, total int64, start time.Time, log *slog.Logger) func(int64, bool) {
	every := orDefault(c.progressEvery, defaultProgressEvery)
	var last time.Time
	return func(done int64, final bool) {
		now := time.Now()
		if done != 0 && !final && now.Sub(last) < every {
			return
		}
		last = now
		rate := 0.0
		if el := now.Sub(start).Seconds(); el > 0 {
			rate = float64(done) / el
		}
		p := Progress{Image: a.image, Volume: a.name, Done: done, Total: total, Rate: rate}
		log.Debug("image upload progress", "done", done, "total", total, "rate_mib_s", fmt.Sprintf("%.1f", rate/(1<<20)))
		if c.onProgress != nil {
			c.onProgress(p)
		}
	}
}

// source is an opened artifact with its size.
type source struct {
	io.ReadCloser
	size int64
}

func sourceKind(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("url %q: %w", raw, err)
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" && u.Host != "localhost" {
			return "", fmt.Errorf("url %q: want file:///absolute/path", raw)
		}
		return "file", nil
	case "http", "https":
		return "http", nil
	}
	return "", fmt.Errorf("url %q: scheme %q is not file, http or https", raw, u.Scheme)
}

// open opens an artifact's source under ctx (the download's deadline):
// reads fail once ctx is done. A wrong URL, a missing file, an HTTP answer
// that will not change on retry, or a missing Content-Length are
// permanent; the network is transient.
func (c *imageCache) open(ctx context.Context, raw string) (*source, error) {
	kind, err := sourceKind(raw)
	if err != nil {
		return nil, fleet.Permanent(err)
	}
	if kind == "file" {
		u, _ := url.Parse(raw)
		f, err := os.Open(u.Path)
		if err != nil {
			return nil, fleet.Permanent(fmt.Errorf("open %s: %w", raw, err))
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fleet.Transient(fmt.Errorf("stat %s: %w", raw, err))
		}
		if !fi.Mode().IsRegular() || fi.Size() == 0 {
			f.Close()
			return nil, fleet.Permanent(fmt.Errorf("%s: not a non-empty regular file", raw))
		}
		return &source{ReadCloser: &ctxReader{ctx: ctx, r: f}, size: fi.Size()}, nil
	}
	hc := c.httpClient
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, fleet.Permanent(fmt.Errorf("get %s: %w", raw, err))
	}
	// A compressed answer would have no usable length; Go's transport
	// decompresses only what it asked for itself.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fleet.Transient(fmt.Errorf("get %s: %w", raw, err))
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		err := fmt.Errorf("get %s: %s", raw, resp.Status)
		switch {
		case resp.StatusCode >= 500, resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests:
			return nil, fleet.Transient(err)
		}
		return nil, fleet.Permanent(err)
	}
	if resp.ContentLength <= 0 {
		resp.Body.Close()
		return nil, fleet.Permanent(fmt.Errorf("get %s: no Content-Length (the cache streams into a volume of the artifact's size; use a mirror that sends one)", raw))
	}
	return &source{ReadCloser: &ctxReader{ctx: ctx, r: resp.Body}, size: resp.ContentLength}, nil
}

// ctxReader fails reads once ctx is done (an HTTP body does that itself;
// a file does not), with the context's error.
type ctxReader struct {
	ctx context.Context
	r   io.ReadCloser
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, fmt.Errorf("deadline: %w", context.Cause(r.ctx))
	}
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.ctx.Err() != nil && !errors.Is(err, r.ctx.Err()) {
		err = fmt.Errorf("%w (%w)", context.Cause(r.ctx), err)
	}
	return n, err
}

func (r *ctxReader) Close() error { return r.r.Close() }
