package kvm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Reading a proxy back from its host: its domain by name and mark (lookup),
// its state and its address (Get).

// lookup returns the domain of id and its mark.
//
// A domain with our name that carries no mark of this host entry (no mark,
// an unreadable one, one for another id, or one naming another host entry
// on the same daemon, as List checks too) is ErrNotOurs, permanent: it is
// never touched, so two entries on one daemon never reach each other's
// domains through Get, Create or Delete.
//
// Once the domain is found, a failing read of its mark (other than "no
// mark", which is not ours) is transient, explicitly: the domain is there,
// and an error reading it must never look like a missing proxy (not-found)
// or a refused one (permanent), either of which could make the caller
// replace or remove it.
func (p *Provider) lookup(ctx context.Context, id string) (libvirt.Domain, mark, error) {
	name := domainName(id)
	var (
		dom libvirt.Domain
		doc string
	)
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		d, err := l.DomainLookupByName(name)
		if err != nil {
			return fmt.Errorf("look up domain %s: %w", name, err)
		}
		p.hook(hookLookedUp, id)
		x, err := l.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{markNS}, 0)
		if isCode(err, libvirt.ErrNoDomainMetadata) {
			return p.notOurs(id, "it has no proxyfleet mark")
		}
		if err != nil {
			return fleet.Transient(fmt.Errorf("read the mark of domain %s on %s: %w", name, p.opts.Host.Name, err))
		}
		dom, doc = d, x
		return nil
	})
	if err != nil {
		// Not dom: an abandoned call may still be writing it.
		return libvirt.Domain{}, mark{}, err
	}
	m, ok, err := parseMark(doc)
	switch {
	case err != nil:
		return dom, mark{}, p.notOurs(id, err.Error())
	case !ok:
		return dom, mark{}, p.notOurs(id, "it has no proxyfleet mark")
	case m.ID != id:
		return dom, mark{}, p.notOurs(id, fmt.Sprintf("its mark is for proxy %q", m.ID))
	case m.Host != p.opts.Host.Name:
		return dom, mark{}, p.notOurs(id, fmt.Sprintf("its mark names host entry %q", m.Host))
	}
	return dom, m, nil
}

// notOurs is the permanent ErrNotOurs error for id's domain, saying why.
func (p *Provider) notOurs(id, why string) error {
	return fleet.Permanent(fmt.Errorf("domain %s on %s: %w: %s", domainName(id), p.opts.Host.Name, ErrNotOurs, why))
}

// Get reads the proxy's domain state and, for an active domain, its address
// (see address: an unreadable address never looks like a missing one). Only the domain's
// lookup can say not-found; once it was found, every failing read (mark,
// state, address) is transient (see lookup).
//
// A proxy whose mark records a static network (its plan's addresses) has
// its address before its guest boots: an active domain reports the mark's
// address of record as IP, with Source plan, and the plan's Egress, and
// only the guest agent is asked, to check it (planState): running unless
// the agent answers without that address. Neither the lease nor ARP is
// read for it (the host's DHCP knows nothing of it). The link dying or ctx
// ending under that read is a transient error, as for any address read.
func (p *Provider) Get(ctx context.Context, id string) (fleet.Instance, error) {
	dom, m, err := p.lookup(ctx, id)
	if err != nil {
		return fleet.Instance{}, err
	}
	p.hook(hookMarked, id)
	in := m.instance()
	var state, reason int32
	err = p.call(ctx, func(l *libvirt.Libvirt) error {
		var err error
		state, reason, err = l.DomainGetState(dom, 0)
		return err
	})
	if err != nil {
		return fleet.Instance{}, fleet.Transient(fmt.Errorf("state of %s: %w", id, err))
	}
	switch libvirt.DomainState(state) {
	case libvirt.DomainRunning, libvirt.DomainBlocked, libvirt.DomainPaused:
	case libvirt.DomainShutoff:
		in.State = messages.StateFailed
		in.Reason = "domain is shut off"
		if libvirt.DomainShutoffReason(reason) == libvirt.DomainShutoffUnknown {
			in.Reason = reasonNeverStarted
		}
		return in, nil
	case libvirt.DomainCrashed:
		in.State, in.Reason = messages.StateFailed, "domain crashed"
		return in, nil
	default:
		in.State, in.Reason = messages.StateProvisioning, fmt.Sprintf("domain state %d", state)
		return in, nil
	}
	if m.static() {
		ifaces, agentErr := p.interfaces(ctx, dom, libvirt.DomainInterfaceAddressesSrcAgent)
		if agentErr != nil && (errors.Is(agentErr, ErrLinkDead) || ctx.Err() != nil) {
			return fleet.Instance{}, fleet.Transient(fmt.Errorf("address of %s: from %s: %w", id, messages.SourceAgent, agentErr))
		}
		in.IP, in.Source = m.Addr.String(), messages.SourcePlan
		in.State, in.Reason = planState(m.Addr, ifaces, agentErr)
		return in, nil
	}
	ip, source, err := p.address(ctx, dom)
	if err != nil {
		return fleet.Instance{}, fmt.Errorf("address of %s: %w", id, err)
	}
	if ip == "" {
		in.State, in.Reason = messages.StateProvisioning, "no address yet"
		return in, nil
	}
	in.State, in.IP, in.Source = messages.StateRunning, ip, source
	return in, nil
}

// addressSources are tried in order: the guest agent knows best, the DHCP
// lease is what the host's dnsmasq handed out, ARP is the host's guess.
var addressSources = []struct {
	name string
	src  libvirt.DomainInterfaceAddressesSource
}{
	{messages.SourceAgent, libvirt.DomainInterfaceAddressesSrcAgent},
	{messages.SourceLease, libvirt.DomainInterfaceAddressesSrcLease},
	{messages.SourceARP, libvirt.DomainInterfaceAddressesSrcArp},
}

// ErrNoAddressSource is inside the error of an address read on which every
// source failed.
var ErrNoAddressSource = errors.New("every address source failed")

// address reads the domain's IPv4 address. An unreadable address never
// looks like a missing one. A source that answers cleanly
// with nothing means "no address yet" (during a boot the agent errors while
// the lease answers empty); every source erroring, or the link dying, is an
// explicitly transient error, which classification cannot turn permanent
// whatever libvirt codes are inside it.
func (p *Provider) address(ctx context.Context, dom libvirt.Domain) (ip, source string, err error) {
	var errs []error
	for _, s := range addressSources {
		ifaces, err := p.interfaces(ctx, dom, s.src)
		if err != nil {
			if errors.Is(err, ErrLinkDead) || ctx.Err() != nil {
				return "", "", fleet.Transient(fmt.Errorf("address from %s: %w", s.name, err))
			}
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			continue
		}
		if ip := firstIPv4(ifaces); ip != "" {
			return ip, s.name, nil
		}
	}
	if len(errs) == len(addressSources) {
		return "", "", fleet.Transient(fmt.Errorf("%w: %w", ErrNoAddressSource, errors.Join(errs...)))
	}
	return "", "", nil
}

// interfaces reads the domain's interfaces and their addresses from one
// source.
func (p *Provider) interfaces(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error) {
	var ifaces []libvirt.DomainInterface
	err := p.call(ctx, func(l *libvirt.Libvirt) error {
		got, err := l.DomainInterfaceAddresses(dom, uint32(src), 0)
		if err == nil {
			ifaces = got
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return ifaces, nil
}

func firstIPv4(ifaces []libvirt.DomainInterface) string {
	for _, ifc := range ifaces {
		if ifc.Name == "lo" {
			continue
		}
		for _, a := range ifc.Addrs {
			if a.Type == int32(libvirt.IPAddrTypeIpv4) && !strings.HasPrefix(a.Addr, "127.") {
				return a.Addr
			}
		}
	}
	return ""
}
