package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"proxyfleet/messages"
)

// Prober checks one proxy at addr ("ip:port"). It must return once ctx is
// done: the caller bounds every probe with a timeout and counts on it.
type Prober interface {
	Probe(ctx context.Context, addr string) error
}

// ProberFunc is a function that is a Prober.
type ProberFunc func(ctx context.Context, addr string) error

// Probe calls f.
func (f ProberFunc) Probe(ctx context.Context, addr string) error { return f(ctx, addr) }

// A Checker is a Prober that also says what a probe found besides pass or
// fail: the egress address the target saw, a leak, and on request whether
// the proxy answers a request without credentials. HTTPProber and
// TCPProber are Checkers; a plain Prober (a test's fake) finds nothing.
type Checker interface {
	Prober
	// Check probes the proxy at addr as Probe does; with checkOpen (and
	// ChecksOpen true) it also sends the same request without
	// credentials, once the probe passed.
	Check(ctx context.Context, addr string, checkOpen bool) Findings
	// ChecksOpen reports whether Check can check for an open proxy:
	// it has credentials to leave out.
	ChecksOpen() bool
}

// An EgressChecker is a Checker whose probe can name the proxy's address
// the request is to leave from (messages.HeaderEgress), for an address of
// a family in Families: the target of that family's probes reports the
// address the request came from. HTTPProber is one (its target's
// family); health's pair of targets (Config.Target, TargetIPv6) is one.
type EgressChecker interface {
	Checker
	// CheckEgress is Check with a request naming egress ("": none).
	CheckEgress(ctx context.Context, addr, egress string, checkOpen bool) Findings
	// Families are the families of the addresses it can name.
	Families() Families
}

// Findings is what one Check found.
type Findings struct {
	Err  error  // the probe's outcome, as Probe's: nil if it passed
	Kind string // KindHTTP, KindConnect or KindTCP

	// Of a passing probe:
	Egress   string // the address the target saw the request come from; "" if it did not report one
	Reported bool   // the target reported the request that reached it (health's own /probe)
	Leak     string // non-empty: why the proxy is leaky (what the report shows)
	Open     string // the open check: OpenRefused, OpenAnswered, OpenInconclusive; "" if not made
	OpenErr  error  // why the open check was refused or inconclusive, for the logs
}

// Kinds of probe (proxyfleet_probes_by_kind_total).
const (
	KindHTTP    = "http"    // a GET through the proxy, for an http target
	KindConnect = "connect" // CONNECT through the proxy, then TLS and a GET, for an https target
	KindTCP     = "tcp"     // a TCP connect to the proxy's port, when no target is configured
)

var probeKinds = []string{KindHTTP, KindConnect, KindTCP}

// Results of an open check (proxyfleet_open_checks_total).
const (
	OpenRefused      = "refused"      // the request without credentials did not reach the target
	OpenAnswered     = "open"         // it did: the proxy is open
	OpenInconclusive = "inconclusive" // no answer either way: a timeout, or no connection
)

var openResults = []string{OpenRefused, OpenAnswered, OpenInconclusive}

var verdicts = []string{messages.VerdictOpen, messages.VerdictLeaky, messages.VerdictMismatch}

// Probe outcomes, as counted in the metrics.
const (
	ResultOK      = "ok"
	ResultTimeout = "timeout" // the probe's time ran out
	ResultError   = "error"   // the proxy could not be reached or failed the request
	ResultStatus  = "status"  // an answer other than 200
	ResultBody    = "body"    // a 200 without the expected value
	ResultPanic   = "panic"   // the prober panicked (counted as a failure)
)

var probeResults = []string{ResultOK, ResultTimeout, ResultError, ResultStatus, ResultBody, ResultPanic}

// ProbeError is a failed probe with its outcome class.
type ProbeError struct {
	Result string // ResultStatus, ResultBody, ...
	Err    error
}

func (e *ProbeError) Error() string { return e.Result + ": " + e.Err.Error() }
func (e *ProbeError) Unwrap() error { return e.Err }

// classify returns the outcome of a probe's error.
func classify(err error) string {
	var pe *ProbeError
	var ne net.Error
	switch {
	case err == nil:
		return ResultOK
	case errors.As(err, &pe):
		return pe.Result
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ResultTimeout
	default:
		return ResultError
	}
}

// probeOutcome is one probe's result with its class and latency.
type probeOutcome struct {
	ProbeResult
	Result  string
	Kind    string // "" for a plain Prober
	Latency time.Duration
	Err     error
	OpenErr error
}

// probeRound probes every target once, at most concurrency at a time, each
// within timeout, and calls report (from the probing goroutines, one call
// per target) as each one ends. A probe that panics is a failure. It
// returns when every probe has ended, or, once ctx is done, when the
// probes in flight have (the probes not started are not reported).
func probeRound(ctx context.Context, p Prober, targets []Target, concurrency int, timeout time.Duration, now func() time.Time, report func(probeOutcome)) {
	if len(targets) == 0 {
		return
	}
	s := newProbeSched(p, min(concurrency, len(targets)), timeout, now, func(_ context.Context, o probeOutcome) { report(o) })
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := s.startRound(targets)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		s.run(rctx)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	cancel()
	<-ran
}

func probeOne(ctx context.Context, p Prober, t Target, timeout time.Duration, now func() time.Time) (out probeOutcome) {
	start := now()
	mono := time.Now()
	out.ProbeResult = ProbeResult{ID: t.ID, Epoch: t.Epoch, At: start}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			out.OK, out.Result, out.Err = false, ResultPanic, fmt.Errorf("probe panicked: %v", v)
		}
		out.Latency = time.Since(mono)
	}()
	var err error
	var f Findings
	checked := true
	if c, ok := p.(EgressChecker); ok && t.Egress != "" {
		out.Named = t.Egress
		f = c.CheckEgress(pctx, t.Addr, t.Egress, t.CheckOpen)
	} else if c, ok := p.(Checker); ok {
		f = c.Check(pctx, t.Addr, t.CheckOpen)
	} else {
		checked, err = false, p.Probe(pctx, t.Addr)
	}
	if checked {
		err, out.Kind = f.Err, f.Kind
		if err == nil {
			out.Egress, out.Reported, out.Leak, out.Open, out.OpenErr = f.Egress, f.Reported, f.Leak, f.Open, f.OpenErr
		}
	}
	if err != nil && pctx.Err() != nil && ctx.Err() == nil {
		// The probe's own time ran out, whatever error that caused.
		err = &ProbeError{Result: ResultTimeout, Err: err}
	}
	out.OK, out.Result, out.Err = err == nil, classify(err), err
	return out
}

// probeLoop runs the probe workers and starts a round of every target once
// per Interval (a round that takes longer delays the next one); new and
// rising candidates are probed at once in between (see Fold.Rising). A
// proxy has at most one probe in flight.
func (h *Health) probeLoop(ctx context.Context) {
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		h.sched.run(ctx)
	}()
	defer func() { <-ran }()
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		h.mu.Lock()
		targets := h.fold.Targets()
		h.mu.Unlock()
		select {
		case <-h.sched.startRound(targets):
		case <-ctx.Done():
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportProbe folds a probe's outcome in, and asks for the proxy to be
// probed again at once while it is rising. A change of the proxy's
// verdict is logged at warn level (with no credentials: the prober's
// errors carry none).
func (h *Health) reportProbe(ctx context.Context, o probeOutcome) {
	if ctx.Err() != nil {
		return // stopping: a cancelled probe says nothing of the proxy
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probeStats.add(o.Result)
	if o.Kind != "" {
		h.probeStats.kinds[o.Kind]++
	}
	h.probeStats.families[FamilyName(o.Named)]++
	if o.OK && o.Open != "" {
		h.probeStats.open[o.Open]++
	}
	h.probeLatency.Observe(o.Latency.Seconds())
	before, had := h.fold.Check(o.ID)
	checksGen := h.fold.ChecksGen()
	if h.fold.ApplyProbe(o.ProbeResult) {
		in := h.fold.InRotation(o.ID)
		if h.caughtUp {
			h.log.Info("rotation changed by a probe", "id", o.ID, "result", o.Result, "entered", in, "err", o.Err, "size", h.fold.Len())
		}
		h.signal()
	} else if !o.OK {
		h.log.Debug("probe failed", "id", o.ID, "result", o.Result, "err", o.Err, "named", o.Named)
	}
	if o.OK && o.Named != "" {
		h.log.Debug("probe named an egress address", "id", o.ID, "named", o.Named, "egress", o.Egress)
	}
	if h.fold.ChecksGen() != checksGen {
		h.signal()
		after, has := h.fold.Check(o.ID)
		switch {
		case has && after.Verdict != messages.VerdictOK && (!had || before.Verdict != after.Verdict || before.Reason != after.Reason):
			h.log.Warn("proxy refused: kept out of the rotation", "id", o.ID, "addr", after.Addr, "egress", after.Egress,
				"verdict", after.Verdict, "reason", after.Reason, "open_err", o.OpenErr)
		case has && had && before.Verdict != messages.VerdictOK && after.Verdict == messages.VerdictOK:
			h.log.Warn("proxy no longer refused: its checks pass", "id", o.ID, "addr", after.Addr, "egress", after.Egress, "was", before.Verdict)
		case has && had && before.Egress != after.Egress:
			h.log.Info("proxy egress changed", "id", o.ID, "addr", after.Addr, "egress", after.Egress, "was", before.Egress)
		}
	}
	if o.Open == OpenInconclusive {
		h.log.Debug("open check inconclusive", "id", o.ID, "err", o.OpenErr)
	}
	h.followReportLocked(o)
	h.probeIfRisingLocked(o.ID)
}

// probeIfRisingLocked asks for id to be probed at once if it is rising.
func (h *Health) probeIfRisingLocked(id string) {
	if h.sched == nil {
		return
	}
	if t, ok := h.fold.Rising(id); ok {
		h.sched.probeSoon(t)
	}
}
