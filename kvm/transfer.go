package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
)

// transfer runs fn on a dedicated link of its own, never the shared one,
// with src wrapped in a no-progress watchdog: if no bytes are read from src
// for Budgets.TransferStall, the dedicated link is killed (which unblocks a
// stalled network write) and src is closed if it is an io.Closer (which
// unblocks a stalled source), and transfer returns a transient error. A
// slow transfer never costs the shared link, and a stalled one is cut
// within the stall window. The dedicated link is closed before transfer
// returns.
//
// A source that can block forever must be an io.Closer whose Close
// unblocks its Read (an HTTP body is), or go-libvirt's stream sender stays
// parked in Read until it returns.
func (k *Link) transfer(ctx context.Context, src io.Reader, fn func(l *libvirt.Libvirt, r io.Reader) error) error {
	leave, err := k.enterTransfer(ctx)
	if err != nil {
		return err
	}
	defer leave()
	// The dedicated link's dial is this caller's alone: it ends with the
	// caller's ctx as well as with the link.
	dialCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(k.ctx, cancel)
	c, err := k.connect(dialCtx)
	stop()
	cancel()
	if err != nil {
		return fmt.Errorf("transfer link: %w", err)
	}
	drop, err := k.holdDedicated(c, 0)
	if err != nil {
		return err
	}
	defer drop()

	return k.watch(ctx, c, src, func(r io.Reader) error { return fn(c.l, r) },
		func(err error) error {
			first := c.markDead(err) // the stream's state is unknown: never reuse it
			if isTransport(err) {
				if first {
					return fmt.Errorf("transfer: %w", c.deadErr())
				}
				return fleet.Transient(fmt.Errorf("transfer: %w (%w)", c.deadErr(), err))
			}
			return Classify(fmt.Errorf("transfer: %w", err))
		},
		func() {
			// The upload is complete (libvirtd acknowledged the
			// stream's end); a failing polite close of the dedicated
			// link cannot undo that, and closeConn kills it anyway.
			_ = k.closeConn(c, k.cfg.Budgets.Close)
		})
}

// enterTransfer counts a transfer (the libvirt stream's or the direct
// upload's) in the link's WaitGroup, so Close waits for it, and refuses one
// on a closed link or a done ctx. The caller runs leave when it returns.
func (k *Link) enterTransfer(ctx context.Context) (leave func(), err error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, k.closedErr()
	}
	k.wg.Add(1)
	k.mu.Unlock()
	if err := ctx.Err(); err != nil {
		k.wg.Done()
		return nil, fleet.Transient(fmt.Errorf("transfer on %s: %w", k.name, err))
	}
	return k.wg.Done, nil
}

// holdDedicated puts a transfer's dedicated connection c among those Close
// kills, and adds goroutines to the link's WaitGroup under the same lock
// (one the caller starts for c), unless the link closed while c was
// dialled: then c is killed and the link's closed error returned. drop
// takes c off the list.
func (k *Link) holdDedicated(c *conn, goroutines int) (drop func(), err error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		c.markDead(ErrLinkClosed)
		return nil, k.closedErr()
	}
	k.dedicated[c] = struct{}{}
	k.wg.Add(goroutines)
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		delete(k.dedicated, c)
		k.mu.Unlock()
	}, nil
}

// watch runs fn on src, wrapped in the no-progress watchdog, in a goroutine
// counted by the link, and waits for it, for ctx and for c's death: a
// stall, a done ctx or c's death kill c and close src. fn's error goes
// through failed (which must mark c dead); success runs ok (which must end
// c).
func (k *Link) watch(ctx context.Context, c *conn, src io.Reader, fn func(r io.Reader) error,
	failed func(error) error, ok func()) error {
	w := &watchReader{r: src}
	done := make(chan error, 1)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		done <- fn(w)
	}()

	stall := k.cfg.Budgets.TransferStall
	tick := time.NewTicker(max(stall/10, time.Millisecond))
	defer tick.Stop()
	last, lastMove := w.n.Load(), time.Now()
	for {
		select {
		case err := <-done:
			if err != nil {
				return failed(err)
			}
			ok()
			return nil
		case <-c.dead:
			w.stop(src)
			select {
			case err := <-done:
				if err == nil {
					return nil // it finished as the link died
				}
			default:
			}
			return fmt.Errorf("transfer: %w", c.deadErr())
		case <-ctx.Done():
			c.markDead(fmt.Errorf("transfer abandoned: %w", context.Cause(ctx)))
			w.stop(src)
			return fleet.Transient(fmt.Errorf("transfer on %s: %w", k.name, ctx.Err()))
		case <-tick.C:
			if n := w.n.Load(); n != last {
				last, lastMove = n, time.Now()
				continue
			}
			if time.Since(lastMove) >= stall {
				c.markDead(fmt.Errorf("transfer stalled: no progress for %s after %d bytes", stall, last))
				w.stop(src)
				return fmt.Errorf("transfer: %w", c.deadErr())
			}
		}
	}
}

// errTransferStopped is what the watched reader returns once the watchdog
// has cut its transfer.
var errTransferStopped = errors.New("transfer stopped")

// watchReader counts the bytes read through it for the watchdog.
type watchReader struct {
	r       io.Reader
	n       atomic.Int64
	stopped atomic.Bool
	once    sync.Once
}

func (w *watchReader) Read(p []byte) (int, error) {
	if w.stopped.Load() {
		return 0, errTransferStopped
	}
	n, err := w.r.Read(p)
	w.n.Add(int64(n))
	if w.stopped.Load() {
		return 0, errTransferStopped
	}
	return n, err
}

// stop makes later reads fail and closes src if it can be closed, which is
// how a Read blocked in a stalled source is released.
func (w *watchReader) stop(src io.Reader) {
	w.stopped.Store(true)
	w.once.Do(func() {
		if cl, ok := src.(io.Closer); ok {
			_ = cl.Close()
		}
	})
}
