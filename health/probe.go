package health

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
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

// NonceParam is the query parameter of a probe's nonce.
const NonceParam = "nonce"

// ProbePath is where a health process serves its own probe target.
const ProbePath = "/probe"

// maxProbeBody bounds what a probe reads of the target's answer.
const maxProbeBody = 64 << 10

// HTTPProber probes a proxy by sending a request through it, as an HTTP
// forward proxy, to Target: a plain GET with an absolute URI for an http
// target, CONNECT then TLS for an https one. It adds a fresh random nonce
// to the target's query (nonce=...) and passes if the answer is a 200
// whose body contains Expect or, when Expect is empty, the nonce: so a
// proxy answering from a cache, an error page or a captive portal fails,
// and so does anything that merely accepts a TCP connection.
//
// Connections are not kept alive: probing thousands of proxies must not
// hold thousands of idle sockets.
type HTTPProber struct {
	Target *url.URL
	Expect string

	transport *http.Transport // for https targets: CONNECT, then TLS
	dialer    *net.Dialer
	// For http targets, the request without its nonce: head is up to the
	// query's nonce value, tail is what follows it.
	head, tail string
}

type proxyKey struct{}

// NewHTTPProber returns a prober of target (an http or https URL) that
// checks for expect (empty: the nonce).
func NewHTTPProber(target, expect string) (*HTTPProber, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("probe target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("probe target %q: want http(s)://host[:port]/path", target)
	}
	d := &net.Dialer{KeepAlive: -1}
	// An http target is probed with a request written by hand: the same
	// bytes net/http would send for a proxy request with keep-alives off,
	// without its per-connection goroutines and buffers.
	q := u.Query()
	q.Del(NonceParam)
	query := q.Encode()
	if query != "" {
		query += "&"
	}
	uri := *u
	uri.User, uri.RawQuery, uri.ForceQuery, uri.Fragment, uri.RawFragment = nil, "", false, "", ""
	if uri.Path == "" && uri.RawPath == "" {
		uri.Path = "/"
	}
	head := "GET " + uri.String() + "?" + query + NonceParam + "="
	tail := " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: proxyfleet-health\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
	return &HTTPProber{
		Target: u,
		Expect: expect,
		dialer: d,
		head:   head,
		tail:   tail,
		transport: &http.Transport{
			Proxy: func(r *http.Request) (*url.URL, error) {
				addr, _ := r.Context().Value(proxyKey{}).(string)
				if addr == "" {
					return nil, errors.New("no proxy address")
				}
				return &url.URL{Scheme: "http", Host: addr}, nil
			},
			DialContext:        d.DialContext,
			DisableKeepAlives:  true,
			DisableCompression: true,
			ForceAttemptHTTP2:  false,
		},
	}, nil
}

// Probe sends one request through the proxy at addr.
func (p *HTTPProber) Probe(ctx context.Context, addr string) error {
	nonce, err := newNonce()
	if err != nil {
		return err
	}
	if p.Target.Scheme == "http" {
		return p.probeHTTP(ctx, addr, nonce)
	}
	u := *p.Target
	q := u.Query()
	q.Set(NonceParam, nonce)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(context.WithValue(ctx, proxyKey{}, addr), http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Cache-Control", "no-cache")
	req.Header.Set("User-Agent", "proxyfleet-health")
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return p.check(resp, addr, nonce)
}

// probeBufs are the buffers of probes of http targets.
var probeBufs = sync.Pool{New: func() any { return &probeBuf{r: bufio.NewReaderSize(nil, 4096)} }}

type probeBuf struct {
	w []byte
	r *bufio.Reader
}

// probeHTTP sends the request through the proxy at addr on a connection of
// its own, closed after the answer, and checks the answer.
func (p *HTTPProber) probeHTTP(ctx context.Context, addr, nonce string) error {
	conn, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	// A cancelled probe must return at once: wake a blocked read or write.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	b := probeBufs.Get().(*probeBuf)
	defer func() {
		b.r.Reset(nil)
		probeBufs.Put(b)
	}()
	b.w = append(append(append(b.w[:0], p.head...), nonce...), p.tail...)
	if _, err := conn.Write(b.w); err != nil {
		return p.ctxErr(ctx, err)
	}
	b.r.Reset(conn)
	resp, err := http.ReadResponse(b.r, nil)
	if err != nil {
		return p.ctxErr(ctx, err)
	}
	// The body is not closed: closing would read what is left of it,
	// and the connection is closed anyway.
	return p.ctxErr(ctx, p.check(resp, addr, nonce))
}

// ctxErr returns ctx's error for an error caused by its end (the deadline
// set on the connection), so that a probe out of time reads as one.
func (p *HTTPProber) ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		var pe *ProbeError
		if !errors.As(err, &pe) {
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
	return err
}

// check passes a 200 answer whose body holds the expected value.
func (p *HTTPProber) check(resp *http.Response, addr, nonce string) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &ProbeError{Result: ResultStatus, Err: fmt.Errorf("%s through %s: %s", p.Target.Redacted(), addr, resp.Status)}
	}
	want := p.Expect
	if want == "" {
		want = nonce
	}
	if !strings.Contains(string(body), want) {
		return &ProbeError{Result: ResultBody, Err: fmt.Errorf("%s through %s: the answer lacks the expected value", p.Target.Redacted(), addr)}
	}
	return nil
}

// Close closes the prober's idle connections (none are kept; for symmetry).
func (p *HTTPProber) Close() { p.transport.CloseIdleConnections() }

func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// ProbeHandler is the probe target a health process serves: GET
// /probe?nonce=N answers N (letters, digits, '-' and '_', up to 128).
func ProbeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.URL.Query().Get(NonceParam)
		if n == "" || len(n) > 128 || strings.TrimFunc(n, func(c rune) bool {
			return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		}) != "" {
			http.Error(w, "want ?nonce=[A-Za-z0-9_-]{1,128}", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		io.WriteString(w, n+"\n")
	})
}

// probeOutcome is one probe's result with its class and latency.
type probeOutcome struct {
	ProbeResult
	Result  string
	Latency time.Duration
	Err     error
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
	err := p.Probe(pctx, t.Addr)
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
// probed again at once while it is rising.
func (h *Health) reportProbe(ctx context.Context, o probeOutcome) {
	if ctx.Err() != nil {
		return // stopping: a cancelled probe says nothing of the proxy
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probeStats.add(o.Result)
	h.probeLatency.Observe(o.Latency.Seconds())
	if h.fold.ApplyProbe(o.ProbeResult) {
		h.changedLocked()
		in := h.fold.InRotation(o.ID)
		if h.caughtUp {
			h.log.Info("rotation changed by a probe", "id", o.ID, "result", o.Result, "entered", in, "err", o.Err, "size", h.fold.Len())
		}
		h.signal()
	} else if !o.OK {
		h.log.Debug("probe failed", "id", o.ID, "result", o.Result, "err", o.Err)
	}
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
