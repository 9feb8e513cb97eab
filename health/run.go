package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
)

// stopTimeout bounds the HTTP shutdown and the wait for the goroutines
// when Run stops.
const stopTimeout = 10 * time.Second

// Run runs the health process until ctx is done, then stops it.
//
// It listens on HTTPAddr (and ProbeListen), binds the stream and the
// buckets and starts consuming, probing and publishing; Started is closed
// then. It does not create the stream or the buckets (a set-up step with
// the right to, proxyfleet setup, does): one that is missing is logged at
// error level and waited for in the background. CaughtUp tells when the
// initial picture is complete.
//
// Once ctx is done it stops consuming (deleting its consumer), releases
// the lease and shuts HTTP down. It returns nil then (also when ctx ends
// before it started); at once, the error that kept it from starting (an
// address it cannot listen on, a config that disagrees with what exists:
// a lease longer than the leases bucket's TTL); or, after stopping, what
// ended it: a server that stopped serving, or its NATS connection closed
// for good. A Health runs once.
func (h *Health) Run(ctx context.Context) error {
	if !h.ran.CompareAndSwap(false, true) {
		return errors.New("health: run twice")
	}
	if err := h.start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	close(h.started)
	err := h.wait(ctx)
	if err != nil {
		err = fmt.Errorf("health: %w", err)
		h.log.Error("stopping", "err", err)
	}
	h.stop()
	return err
}

// Started is closed once Run listens and consumes (or waits for what it
// consumes): Addr and ProbeAddr are known then.
func (h *Health) Started() <-chan struct{} { return h.started }

// wait returns nil once ctx is done, or what failed: a server, or the
// NATS connection, closed for good.
func (h *Health) wait(ctx context.Context) error {
	t := time.NewTicker(h.cfg.CheckInterval)
	defer t.Stop()
	for {
		if h.nc != nil && h.nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-h.serveErr:
			return err
		case <-t.C:
		}
	}
}

// start listens, binds what is there and starts the goroutines; on an
// error it leaves nothing open or running.
func (h *Health) start(ctx context.Context) error {
	var err error
	closeListeners := func() {
		for _, ln := range []net.Listener{h.ln, h.probeLn, h.probeLn6} {
			if ln != nil {
				ln.Close()
			}
		}
	}
	if h.cfg.HTTPAddr != NoHTTP {
		if h.ln, err = net.Listen("tcp", h.cfg.HTTPAddr); err != nil {
			return fmt.Errorf("health: listen on %s: %w", h.cfg.HTTPAddr, err)
		}
		h.srv = &http.Server{Handler: h.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	}
	if h.cfg.ProbeListen != "" {
		if h.probeLn, h.probeSrv, err = listenProbes(h.cfg.ProbeListen); err != nil {
			closeListeners()
			return err
		}
	}
	if h.cfg.ProbeListenIPv6 != "" {
		if h.probeLn6, h.probeSrv6, err = listenProbes(h.cfg.ProbeListenIPv6); err != nil {
			closeListeners()
			return err
		}
	}
	if err := h.bindProbers(); err != nil {
		closeListeners()
		return err
	}

	h.sched = newProbeSched(h.prober, h.cfg.Concurrency, h.cfg.Timeout, h.now, h.reportProbe)
	if err := h.subscribeReports(); err != nil {
		closeListeners()
		return fmt.Errorf("health: subscribe to %s: %w", h.subj.ReportAll(), err)
	}
	if err := h.subscribeBans(); err != nil {
		h.unsubscribeReports()
		closeListeners()
		return fmt.Errorf("health: subscribe to %s: %w", h.subj.Ban(), err)
	}
	if err := h.bind(ctx); err != nil {
		if errors.Is(err, errMismatch) || ctx.Err() != nil {
			closeListeners()
			return fmt.Errorf("health: %w", err)
		}
		h.mu.Lock()
		h.bindErr = err
		h.mu.Unlock()
		if !isGone(err) {
			h.log.Error("binding the stream and buckets: trying again in the background", "err", err)
		}
	}
	// Read before the keeper runs and may change them.
	bound, seeded := "yes", h.seeded
	if !h.bound {
		bound = "waiting for the stream and buckets"
	}
	runCtx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	serve := func(what string, srv *http.Server, ln net.Listener) {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error(what, "err", err)
				h.serveErr <- fmt.Errorf("%s on %s: %w", what, ln.Addr(), err)
			}
		}()
	}
	if h.srv != nil {
		serve("http server", h.srv, h.ln)
	}
	if h.probeSrv != nil {
		serve("probe target server", h.probeSrv, h.probeLn)
	}
	if h.probeSrv6 != nil {
		serve("ipv6 probe target server", h.probeSrv6, h.probeLn6)
	}
	h.wg.Add(5)
	go func() {
		defer h.wg.Done()
		h.probeLoop(runCtx)
	}()
	go func() {
		defer h.wg.Done()
		h.keep(runCtx)
	}()
	go func() {
		defer h.wg.Done()
		h.loop(runCtx)
	}()
	go func() {
		defer h.wg.Done()
		h.keepChecks(runCtx)
	}()
	go func() {
		defer h.wg.Done()
		h.writeChecksLoop(runCtx)
	}()
	h.mu.Lock()
	checkOpen, egress := h.fold.CheckOpen, h.fold.EgressFamilies
	h.mu.Unlock()
	// The user is no secret; the password is never logged.
	h.log.Info("health started", "http", h.Addr(), "grace", h.cfg.Grace, "seeded", seeded, "bound", bound,
		"probe_target", h.probeTarget(), "interval", h.cfg.Interval, "timeout", h.cfg.Timeout,
		"rise", h.cfg.Rise, "fall", h.cfg.Fall, "lease_ttl", h.cfg.LeaseTTL, "egress_families", familiesText(egress),
		"proxy_user", h.cfg.ProxyUser, "open_check", checkOpen, "open_check_interval", h.cfg.OpenCheckInterval)
	if h.tcpOnly {
		h.log.Warn("probing by TCP connect only: configure health.probe_listen or health.target to probe through the proxies",
			"credentials_unchecked", h.cfg.ProxyUser != "")
	} else if egress&FamilyIPv6 == 0 {
		h.log.Info("no IPv6 probe target: the proxies' IPv6 egress addresses are not checked one by one (set health.target_ipv6 or health.probe_listen_ipv6)")
	}
	if !h.tcpOnly && h.cfg.ProxyUser != "" && !checkOpen {
		h.log.Warn("proxy credentials are configured but the prober cannot leave them out: no proxy is checked to refuse a request without credentials",
			"prober", h.probeTarget())
	}
	return nil
}

// stop stops consuming, publishing and serving, and waits for the
// goroutines (at most stopTimeout).
func (h *Health) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	h.unsubscribeReports()
	h.unsubscribeBans()
	// The keeper stops consuming and deletes its consumer; the loop
	// releases the lease.
	h.cancel()
	for _, srv := range []*http.Server{h.srv, h.probeSrv, h.probeSrv6} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(ctx); err != nil {
			h.log.Warn("http shutdown", "err", err)
			srv.Close()
		}
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		h.log.Warn("health stop: goroutines still running", "err", ctx.Err())
	}
	h.log.Info("health stopped")
}

// listenProbes listens on addr and returns the server of the probe target
// there (GET /probe, ProbeHandler), not yet serving.
func listenProbes(addr string) (net.Listener, *http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("health: listen on %s for probes: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+ProbePath, ProbeHandler())
	return ln, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}, nil
}

// familiesText names the families of fs for a log line.
func familiesText(fs Families) string {
	switch fs {
	case FamilyIPv4:
		return "ipv4"
	case FamilyIPv6:
		return "ipv6"
	case FamilyIPv4 | FamilyIPv6:
		return "ipv4,ipv6"
	}
	return "none"
}
