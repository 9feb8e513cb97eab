package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"proxyfleet/messages"
)

const observePoll = 50 * time.Millisecond

// guestRotation is one guest's way from its create command to the rotation.
type guestRotation struct {
	sent     time.Time // the create published
	started  time.Time // the domain first seen running
	lease    time.Time // its DHCP lease first seen
	running  time.Time // the `running` event
	rotation time.Time // the first message of the rotation's feed holding it
}

// overhead is what the system adds to the guest's own boot.
func (r guestRotation) overhead() time.Duration {
	return r.rotation.Sub(r.sent) - r.lease.Sub(r.started)
}

func (r guestRotation) String() string {
	s := func(a, b time.Time) string { return fmt.Sprintf("%.2f s", b.Sub(a).Seconds()) }
	return fmt.Sprintf("create→domain running %s, boot→lease %s, lease→running event %s, running event→rotation %s, overhead %.2f s",
		s(r.sent, r.started), s(r.started, r.lease), s(r.lease, r.running), s(r.running, r.rotation), r.overhead().Seconds())
}

// rotation creates one guest with the health process running, watches
// its domain and lease through libvirt's local socket, waits until it is in
// the rotation, and deletes it.
func (f *fleet) rotation(ctx context.Context, id, extra string) (guestRotation, error) {
	var r guestRotation
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(cmp.Or(os.Getenv("TESTHOST_LIBVIRT_SOCKET"), "/run/libvirt/libvirt-sock"))))
	if err := l.Connect(); err != nil {
		return r, fmt.Errorf("libvirt: %w", err)
	}
	defer func() { _ = l.Disconnect() }()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	r.sent = time.Now()
	c, err := f.commandWith(rctx, messages.OpCreate, id, extra)
	if err != nil {
		return r, err
	}
	t := time.NewTicker(observePoll)
	defer t.Stop()
	name := "pf-" + id
	for r.lease.IsZero() || r.rotation.IsZero() {
		select {
		case <-rctx.Done():
			return r, fmt.Errorf("%s not in the rotation: %w (so far %+v)", id, rctx.Err(), r)
		case <-t.C:
		}
		now := time.Now()
		if r.lease.IsZero() {
			d, err := l.DomainLookupByName(name)
			if err == nil && r.started.IsZero() {
				if st, _, err := l.DomainGetState(d, 0); err == nil && libvirt.DomainState(st) == libvirt.DomainRunning {
					r.started = now
				}
			}
			if err == nil && !r.started.IsZero() {
				ifs, err := l.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0)
				if err == nil && len(ifs) > 0 && len(ifs[0].Addrs) > 0 {
					r.lease = now
				}
			}
		}
		f.mu.Lock()
		r.rotation = f.inRotation[id]
		for _, te := range f.events[id] {
			if te.ev.State == messages.StateRunning && r.running.IsZero() {
				r.running = te.at
			}
		}
		f.mu.Unlock()
	}
	if err := f.waitDone(ctx, time.Minute, []string{c}); err != nil {
		return r, err
	}
	d, err := f.command(ctx, messages.OpDelete, id)
	if err != nil {
		return r, err
	}
	return r, f.waitDone(ctx, 2*time.Minute, []string{d})
}
