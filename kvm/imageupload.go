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
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// The upload of one artifact into its volume; a failed upload leaves no
// volume that is ever used.
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
// Into a pool of type dir the same reader feeds a direct transfer over SSH
// instead (directupload.go), under the same deadlines and watchdog; the
// volume is claimed, verified, marked and discarded the same way.

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
		report: c.reporter(a, src.size, start, log), obs: c.link.cfg.Observer,
	}
	// verify checks length and digest once every byte is through. The
	// direct path calls it in the transfer's goroutine, which a cut
	// transfer leaves running: its error is handed over atomically.
	var verifyErr atomic.Pointer[error]
	verify := func() error {
		n, sum := cr.n.Load(), hex.EncodeToString(cr.h.Sum(nil))
		var err error
		if n != src.size {
			err = fleet.Transient(fmt.Errorf("image %s: %s gave %d bytes, want %d", a.image, a.url, n, src.size))
		} else if sum != a.sha {
			err = fleet.Permanent(fmt.Errorf("image %s: %s has sha256 %s, the config says %s", a.image, a.url, sum, a.sha))
		}
		if err != nil {
			verifyErr.Store(&err)
		}
		return err
	}
	cr.report(0, false)

	target, why, err := c.directTarget(ctx, a)
	if err != nil {
		return fail(err)
	}
	if target != nil {
		d := &direct{t: *target, tmp: tempName(*target), size: src.size, verify: verify,
			every: max(c.staleAfter()/4, time.Millisecond)}
		c.note("direct", a.name)
		err = c.link.sshTransfer(tctx, cr, d.run)
		if d.mayBeLeft() {
			if rmErr := c.removeLeft(ctx, d); rmErr != nil {
				log.Warn("could not remove a failed direct upload's temporary file", "dir", d.t.dir, "file", d.tmp, "err", rmErr)
			}
		}
		switch {
		case errors.Is(err, errNoDirect) && cr.n.Load() == 0:
			log.Info("direct upload refused by the host; using the libvirt stream", "err", err)
		case verifyErr.Load() != nil:
			return fail(*verifyErr.Load())
		case err != nil:
			return fail(c.transferError(a, err))
		default:
			return c.finish(ctx, a, src.size, start, cr, log, fail)
		}
	} else {
		log.Debug("uploading through the libvirt stream", "why", why)
	}
	c.note("stream", a.name)
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
	if err := verify(); err != nil {
		return fail(err)
	}
	return c.finish(ctx, a, src.size, start, cr, log, fail)
}

// finish marks a's verified volume of n bytes.
func (c *imageCache) finish(ctx context.Context, a artifact, n int64, start time.Time, cr *countingReader, log *slog.Logger, fail func(error) error) error {
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
// stream the normal way, and is kept for Err. Why: a non-EOF
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
	obs    Observer // hears the bytes read
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.obs.ImageBytes(int64(n))
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
