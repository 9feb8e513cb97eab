package health

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"proxyfleet/health/defaults"
)

// Which prober a process probes with, made of its Config: the probe
// targets, their families and the credentials. probe.go runs the probes.

// initProber chooses how New's process probes (see Config, "Probing"):
// Config.Prober; else an HTTPProber of Target; else, once ProbeListen is
// bound, one of the /probe served there (bindProbers); else a TCP connect.
// Settings a prober cannot be made of are an error now, not at Run.
func (h *Health) initProber() error {
	cfg := h.cfg
	h.prober = cfg.Prober
	if h.prober == nil && cfg.Target != "" {
		p, err := NewHTTPProber(cfg.Target, cfg.Expect, h.proberOptions()...)
		if err != nil {
			return fmt.Errorf("health: %w", err)
		}
		h.prober = p
	}
	if h.prober == nil && cfg.ProbeListen != "" {
		host, _, err := net.SplitHostPort(cfg.ProbeListen)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
			return fmt.Errorf("health: probe listen address %q: with no target, it must be an IP the guests can reach (or set a target)", cfg.ProbeListen)
		}
		// The prober is made once the listener is bound (its port may be 0).
		if _, err := NewHTTPProber("http://"+cfg.ProbeListen+ProbePath, cfg.Expect, h.proberOptions()...); err != nil {
			return fmt.Errorf("health: %w", err) // the credentials, checked now
		}
	}
	if err := h.checkIPv6Target(); err != nil {
		return err
	}
	if h.prober == nil && cfg.ProbeListen == "" {
		// Nothing to probe through the proxies: at least something must
		// listen on a proxy's port before it enters.
		h.prober, h.tcpOnly = TCPProber{}, true
	}
	return nil
}

// bindProbers makes the probers of the targets this process serves once
// their listeners are bound (a port may have been 0): ProbeListen's, paired
// with TargetIPv6's if New made one, and ProbeListenIPv6's, paired with an
// HTTPProber of this process's own making when TargetIPv6 is empty.
func (h *Health) bindProbers() error {
	if h.probeLn != nil && h.prober == nil {
		p, err := h.probeListenProber(h.probeLn)
		if err != nil {
			return err
		}
		h.mu.Lock()
		h.prober = p
		if h.pendingV6 != nil {
			h.prober = familyProber{v4: p, v6: h.pendingV6}
		}
		h.setCheckOpen()
		h.mu.Unlock()
	}
	if h.probeLn6 != nil {
		if v4, ok := h.prober.(*HTTPProber); ok && h.cfg.TargetIPv6 == "" && h.cfg.Prober == nil {
			p6, err := h.probeListenProber(h.probeLn6)
			if err != nil {
				return err
			}
			h.mu.Lock()
			h.prober = familyProber{v4: v4, v6: p6}
			h.setCheckOpen()
			h.mu.Unlock()
		}
	}
	return nil
}

// proberOptions are the options of the HTTPProbers health makes.
func (h *Health) proberOptions() []ProberOption {
	return []ProberOption{WithCredentials(h.cfg.ProxyUser, h.cfg.ProxyPassword)}
}

// setCheckOpen tells the fold whether candidates must pass an open check
// (the prober can make one: it has credentials to leave out), and the
// families of the egress addresses probes name (those the prober has a
// target for).
func (h *Health) setCheckOpen() {
	c, ok := h.prober.(Checker)
	h.fold.CheckOpen = ok && c.ChecksOpen()
	h.fold.EgressFamilies = 0
	if e, ok := h.prober.(EgressChecker); ok {
		h.fold.EgressFamilies = e.Families()
	}
}

// checkIPv6Target checks TargetIPv6 and ProbeListenIPv6, and with an HTTP
// prober of Target, pairs it with one of TargetIPv6 (ProbeListenIPv6's is
// made once its listener is bound).
func (h *Health) checkIPv6Target() error {
	cfg := h.cfg
	t := defaults.Targets{Target: cfg.Target, ProbeListen: cfg.ProbeListen, TargetIPv6: cfg.TargetIPv6, ProbeListenIPv6: cfg.ProbeListenIPv6}
	if field, reason := t.CheckIPv6(); field != "" {
		return fmt.Errorf("health: %s: %s", field, reason)
	}
	if cfg.TargetIPv6 == "" && cfg.ProbeListenIPv6 == "" {
		return nil
	}
	if cfg.ProbeListenIPv6 != "" && cfg.TargetIPv6 == "" {
		if _, err := NewHTTPProber("http://"+cfg.ProbeListenIPv6+ProbePath, cfg.Expect, h.proberOptions()...); err != nil {
			return fmt.Errorf("health: %w", err)
		}
	}
	if cfg.TargetIPv6 == "" {
		return nil
	}
	p6, err := NewHTTPProber(cfg.TargetIPv6, cfg.Expect, h.proberOptions()...)
	if err != nil {
		return fmt.Errorf("health: ipv6 %w", err)
	}
	h.pairIPv6(p6)
	return nil
}

// pairIPv6 makes the prober one that sends probes naming an IPv6 address
// to p6, if it is an HTTP prober of its own target (not a Config.Prober).
func (h *Health) pairIPv6(p6 *HTTPProber) {
	if v4, ok := h.prober.(*HTTPProber); ok && h.cfg.Prober == nil {
		h.prober = familyProber{v4: v4, v6: p6}
	} else if h.prober == nil {
		h.pendingV6 = p6 // paired once ProbeListen's prober is made
	}
}

func (h *Health) probeTarget() string {
	switch p := h.prober.(type) {
	case *HTTPProber:
		return p.Target.Redacted()
	case familyProber:
		return p.v4.Target.Redacted() + " (IPv4), " + p.v6.Target.Redacted() + " (IPv6)"
	case TCPProber:
		return "a TCP connect to each proxy"
	}
	return fmt.Sprintf("%T", h.prober)
}

// probeListenProber is the prober of the probe target served on ln.
func (h *Health) probeListenProber(ln net.Listener) (*HTTPProber, error) {
	p, err := NewHTTPProber("http://"+ln.Addr().String()+ProbePath, h.cfg.Expect, h.proberOptions()...)
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	return p, nil
}

// familyProber probes through a proxy to the target of the family of the
// address a request names: v4 for IPv4 addresses, v6 for IPv6 ones (either
// may be nil, not both). A request naming none goes to v4 if there is one.
type familyProber struct {
	v4, v6 *HTTPProber
}

// first is the prober of a request that names no address.
func (p familyProber) first() *HTTPProber {
	if p.v4 != nil {
		return p.v4
	}
	return p.v6
}

func (p familyProber) Probe(ctx context.Context, addr string) error {
	return p.first().Probe(ctx, addr)
}

func (p familyProber) Check(ctx context.Context, addr string, checkOpen bool) Findings {
	return p.first().Check(ctx, addr, checkOpen)
}

// CheckEgress sends the probe to the target of egress's family; one of a
// family without a target names nothing (the fold names none such).
func (p familyProber) CheckEgress(ctx context.Context, addr, egress string, checkOpen bool) Findings {
	for _, q := range []*HTTPProber{p.v4, p.v6} {
		if a, err := netip.ParseAddr(egress); err == nil && q != nil && q.Families().has(a) {
			return q.CheckEgress(ctx, addr, egress, checkOpen)
		}
	}
	return p.Check(ctx, addr, checkOpen)
}

func (p familyProber) ChecksOpen() bool { return p.first().ChecksOpen() }

func (p familyProber) Families() Families {
	var fs Families
	for _, q := range []*HTTPProber{p.v4, p.v6} {
		if q != nil {
			fs |= q.Families()
		}
	}
	return fs
}
