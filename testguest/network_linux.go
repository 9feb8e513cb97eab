//go:build linux

package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"sync"
)

// guestNet brings up the guest's one NIC: from the seed's network-config
// when it has an entry for the NIC (static addresses and routes, busybox
// ip), otherwise with DHCP (busybox udhcpc), as before network-config.
type guestNet struct {
	r      *reaper
	log    *log.Logger
	status *NetStatus
	ip     string // busybox's ip applet
	udhcpc string
	script string

	mu       sync.Mutex
	iface    string        // the NIC's name (after set-name)
	dhcpStop chan struct{} // non-nil while udhcpc runs
	dhcpDone chan struct{} // closed when runDHCP has returned
	static   bool          // a network-config was applied
}

// errNoEntry: the network-config has no entry for the NIC.
var errNoEntry = errors.New("no ethernets entry matches")

// entryFor returns the network-config entry for iface (nil, nil: the seed
// has no network-config).
func entryFor(iface string, seed *Seed) (*Ethernet, *NetworkConfig, error) {
	if seed == nil || seed.NetworkConfig == nil {
		return nil, nil, nil
	}
	nc, err := ParseNetworkConfig(seed.NetworkConfig)
	if err != nil {
		return nil, nil, err
	}
	mac := ifaceMAC(iface)
	e := nc.Select(iface, mac)
	if e == nil {
		return nil, nc, fmt.Errorf("network-config: %w %s (MAC %s)", errNoEntry, iface, mac)
	}
	return e, nc, nil
}

func ifaceMAC(iface string) net.HardwareAddr {
	b, err := os.ReadFile("/sys/class/net/" + iface + "/address")
	if err != nil {
		return nil
	}
	mac, _ := net.ParseMAC(strings.TrimSpace(string(b)))
	return mac
}

// Start configures iface from seed. final says the seed search is over (a
// nil seed: there is none); when it is not, DHCP runs until SeedArrived
// brings a network-config.
func (g *guestNet) Start(iface string, seed *Seed, final bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.iface = iface
	if !final {
		g.log.Printf("net: seed not read yet: DHCP on %s until it is", iface)
		g.status.Set("dhcp", iface, "", nil, nil)
		g.startDHCP()
		return
	}
	g.configure(seed)
}

// SeedArrived applies a network-config that came after DHCP started.
func (g *guestNet) SeedArrived(seed *Seed) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.iface == "" || g.static || seed == nil || seed.NetworkConfig == nil {
		return
	}
	g.log.Printf("net: the seed came late with a network-config: stopping DHCP on %s", g.iface)
	g.stopDHCP()
	g.runIP("-4", "addr", "flush", "dev", g.iface)
	g.runIP("-4", "route", "flush", "dev", g.iface)
	g.configure(seed)
}

// configure applies seed's network-config entry for the NIC, or runs DHCP.
// A network-config that is malformed or has no entry for the NIC is logged
// and reported (network_error), and the guest takes a DHCP lease instead,
// so that it stays reachable to debug.
func (g *guestNet) configure(seed *Seed) {
	e, nc, err := entryFor(g.iface, seed)
	var ignored []string
	if nc != nil {
		ignored = nc.Ignored
	}
	if err != nil {
		g.log.Printf("net: %v; DHCP instead", err)
		g.status.Set("dhcp", g.iface, "", ignored, err)
		g.startDHCP()
		return
	}
	if e == nil {
		g.status.Set("dhcp", g.iface, "", nil, nil)
		g.startDHCP()
		return
	}
	if len(ignored) > 0 {
		g.log.Printf("net: network-config: ignored %s", strings.Join(ignored, ", "))
	}
	steps, iface := e.Plan(g.iface)
	g.log.Printf("net: network-config entry %q for %s: %s", e.ID, g.iface, e.Summary())
	var errs []error
	for _, s := range steps {
		var err error
		if s.IP != nil {
			err = g.runIP(s.IP...)
		} else {
			err = os.WriteFile(s.Path, []byte(s.Value), 0o644)
		}
		if err != nil {
			g.log.Printf("net: %s: %v", s, err)
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
	}
	g.iface = iface
	g.static = true
	g.status.Set("network-config", iface, e.Summary(), ignored, errors.Join(errs...))
	if e.DHCP4 {
		g.startDHCP()
	}
}

func (g *guestNet) runIP(args ...string) error {
	return g.r.run(append([]string{g.ip}, args...)...)
}

func (g *guestNet) startDHCP() {
	if g.dhcpStop != nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	g.dhcpStop, g.dhcpDone = stop, done
	go func() {
		defer close(done)
		runDHCP(g.r, g.udhcpc, g.script, g.iface, stop, g.log)
	}()
}

func (g *guestNet) stopDHCP() {
	if g.dhcpStop == nil {
		return
	}
	close(g.dhcpStop)
	<-g.dhcpDone
	g.dhcpStop, g.dhcpDone = nil, nil
}

// Iface is the NIC's current name.
func (g *guestNet) Iface() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.iface
}
