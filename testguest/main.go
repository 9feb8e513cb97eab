package main

import (
	"flag"
	"log"
	"os"
	"strings"
	"time"
)

func main() {
	proxyAddr := flag.String("proxy-addr", ":3128", "forward proxy listen address")
	controlAddr := flag.String("control-addr", ":9090", "control API listen address")
	seedDir := flag.String("seed-dir", "", "read the seed from this directory instead of a disk")
	asInit := flag.Bool("init", os.Getpid() == 1, "run the VM init sequence (default when PID 1)")
	flag.Parse()

	if *asInit {
		mountBase(log.Default())
		useConsole()
	}
	logger := log.New(os.Stdout, "testguest: ", log.Lmicroseconds)
	logger.Printf("starting (pid %d)", os.Getpid())

	seeds := &SeedStore{}
	proxy := &ProxyService{Handler: NewProxyHandler(logger), DefaultAddr: *proxyAddr, Log: logger}
	agent := &Agent{
		Handler: &AgentHandler{Interfaces: SystemInterfaces, Hostname: func() string { h, _ := os.Hostname(); return h }},
		Locate:  func() (string, error) { return FindVirtioPort("/sys/class/virtio-ports", "/dev", AgentPortName) },
		Log:     logger,
	}
	if *asInit {
		agent.Handler.Shutdown = func(mode string) { shutdown(mode, logger) }
	}
	netStatus := &NetStatus{}
	control := &Server{Name: "control", Addr: *controlAddr, Handler: ControlHandler(seeds, proxy, agentSwitch{agent}, netStatus), Log: logger}

	if !*asInit {
		var seed *Seed
		if *seedDir != "" {
			var err error
			seed, err = ReadSeedDir(*seedDir)
			seeds.Set(seed, err)
			if err != nil {
				logger.Printf("seed: %s: %v", *seedDir, err)
			}
		}
		proxy.Start()
		if err := configureProxy(proxy, seed, logger); err != nil {
			logger.Fatal(err)
		}
		if err := control.Start(); err != nil {
			logger.Fatal(err)
		}
		select {}
	}

	runInit(logger, seeds, proxy, control, agent, netStatus)
	select {} // PID 1 must never exit
}

// earlyModules are loaded before the network comes up; the rest (storage
// for the seed) load while DHCP runs.
var earlyModules = map[string]bool{
	"virtio_ring": true, "virtio": true, "virtio_pci_legacy_dev": true, "virtio_pci_modern_dev": true,
	"virtio_pci": true, "failover": true, "net_failover": true, "virtio_net": true, "virtio_console": true,
}

// configureProxy derives the proxy's policy from the seed (nil: none) and
// hands it to proxy, logging what it is; the error is the listener's.
func configureProxy(proxy *ProxyService, seed *Seed, logger *log.Logger) error {
	pol, note, err := LoadProxyPolicy(seed, guestHostname())
	switch {
	case err != nil:
		// Configure logs it.
	case pol.Squid == nil:
		logger.Printf("proxy: open, adding no header (%s)", note)
	default:
		logger.Printf("proxy: from %s: %s", SquidConfPath, note)
	}
	return proxy.Configure(pol, err)
}

func runInit(logger *log.Logger, seeds *SeedStore, proxy *ProxyService, control *Server, agent *Agent, netStatus *NetStatus) {
	t0 := time.Now()
	var early, late []string
	for _, m := range moduleList("/etc/testguest/modules") {
		if earlyModules[m] {
			early = append(early, m)
		} else {
			late = append(late, m)
		}
	}
	loadModules("/lib/modules", early, logger)
	r := newReaper()
	if err := ifUp("lo"); err != nil {
		logger.Printf("init: lo up: %v", err)
	}
	// Listeners bind to the wildcard address, so they can start before the
	// lease. The proxy's waits for its configuration, from the seed.
	if err := control.Start(); err != nil {
		logger.Printf("init: control: %v", err)
	}
	proxy.Start()

	agent.Start()

	// The seed before the network (its network-config says static addresses
	// or DHCP), so that a guest with an address always knows its
	// instance-id; without a seed, DHCP waits at most 3 s.
	loadModules("/lib/modules", late, logger)
	seedDone := make(chan struct{})
	var seedRead *Seed // set before seedDone closes
	go func() {
		defer close(seedDone)
		var seed *Seed
		var err error
		waitFor(30*time.Second, func() bool {
			seed, err = readSeedFromDisks("/dev", "/run/seed", logger)
			return seed != nil
		})
		seeds.Set(seed, err)
		seedRead = seed
		if seed == nil {
			logger.Printf("seed: none: %v", err)
		} else {
			logger.Printf("seed: %s instance-id=%q local-hostname=%q user-data=%d bytes", seed.Source, seed.InstanceID, seed.LocalHostname, len(seed.UserData))
			if seed.LocalHostname != "" {
				if err := setHostname(seed.LocalHostname); err != nil {
					logger.Printf("seed: sethostname: %v", err)
				}
			}
		}
		// After the hostname: squid's Via names the host.
		if err := configureProxy(proxy, seed, logger); err != nil {
			logger.Printf("init: proxy: %v", err)
		}
	}()
	seedFinal := true
	select {
	case <-seedDone:
	case <-time.After(3 * time.Second):
		seedFinal = false
		logger.Printf("seed: not found within 3s; starting DHCP anyway")
	}

	var eth string
	waitFor(20*time.Second, func() bool { eth = firstEthernet(); return eth != "" })
	if eth == "" {
		logger.Printf("init: no network interface")
	} else {
		if err := ifUp(eth); err != nil {
			logger.Printf("init: %s up: %v", eth, err)
		}
		gn := &guestNet{r: r, log: logger, status: netStatus, ip: "/bin/ip", udhcpc: "/bin/udhcpc", script: "/etc/udhcpc.script"}
		if seedFinal {
			gn.Start(eth, seedRead, true)
		} else {
			gn.Start(eth, nil, false)
			go func() {
				<-seedDone
				gn.SeedArrived(seedRead)
			}()
		}
		go func() {
			if waitFor(60*time.Second, func() bool { return hasIPv4(gn.Iface()) }) {
				logger.Printf("init: %s has an address %.1fs after init started", gn.Iface(), time.Since(t0).Seconds())
			}
		}()
	}
	logger.Printf("init: ready after %.1fs", time.Since(t0).Seconds())
}

func hasIPv4(name string) bool {
	ifs, err := SystemInterfaces()
	if err != nil {
		return false
	}
	for _, i := range ifs {
		if i.Name != name {
			continue
		}
		for _, a := range i.IPAddresses {
			if a.Type == "ipv4" && !strings.HasPrefix(a.Address, "169.254.") {
				return true
			}
		}
	}
	return false
}
