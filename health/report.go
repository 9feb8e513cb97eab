package health

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"proxyfleet/messages"
)

// Reports (messages.Report on <prefix>.report.<id>) come from consumers
// of the rotation that a proxy failed: a gateway whose CONNECT through it
// was refused, a program whose request timed out. A consumer sees the
// failure before health's next round does, but it cannot tell a dead
// proxy from a target that failed, a network of its own that failed, or a
// gateway that is wrong: so a report is only a reason to probe at once.
// The fold counts what health's own probe finds, nothing else: a report
// never takes a proxy out, and no number of reports can empty the
// rotation. A report whose probe fails is followed by probes at once
// until the proxy passes or has failed Fall in a row and left, so a dead
// proxy leaves within about Fall probe timeouts rather than Fall rounds.
//
// Probes asked for by reports are bounded twice: one per proxy per
// ReportInterval, and ReportRate a second over all proxies (a flood of
// reports, from a broken gateway or an attack on the subject, costs at
// most that many probes); the rest are counted as limited and dropped.

// Outcomes of a report (proxyfleet_health_reports_total{outcome}).
const (
	ReportProbed  = "probed"  // a probe was asked for at once
	ReportLimited = "limited" // dropped: the proxy was probed for a report within ReportInterval, or over ReportRate
	ReportStale   = "stale"   // of an address the proxy no longer has
	ReportUnknown = "unknown" // of no proxy being probed (gone, not running, or the sim driver's)
	ReportInvalid = "invalid" // a subject or body not understood
)

var reportOutcomes = []string{ReportProbed, ReportLimited, ReportStale, ReportUnknown, ReportInvalid}

// reports is what health keeps of the reports; guarded by Health.mu.
type reports struct {
	outcomes map[string]uint64
	last     map[string]time.Time // when a report last asked for a probe of the proxy
	follow   map[string]int       // proxies probed for a report: probes at once left while they fail
	limiter  *rate.Limiter
	sub      *nats.Subscription
}

func newReports(perSecond float64) reports {
	out := make(map[string]uint64, len(reportOutcomes))
	for _, o := range reportOutcomes {
		out[o] = 0
	}
	burst := max(1, int(perSecond))
	return reports{outcomes: out, last: make(map[string]time.Time), follow: make(map[string]int),
		limiter: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// subscribeReports starts taking reports; the subscription ends in stop.
func (h *Health) subscribeReports() error {
	sub, err := h.nc.Subscribe(h.subj.ReportAll(), h.onReport)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.reports.sub = sub
	h.mu.Unlock()
	return nil
}

func (h *Health) unsubscribeReports() {
	h.mu.Lock()
	sub := h.reports.sub
	h.reports.sub = nil
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// onReport runs on the connection's delivery goroutine: it only decides
// and queues, never waits.
func (h *Health) onReport(msg *nats.Msg) {
	var r messages.Report
	id, err := h.subj.ParseReport(msg.Subject)
	if err == nil {
		err = json.Unmarshal(msg.Data, &r)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	outcome := h.reportLocked(id, r, err)
	h.reports.outcomes[outcome]++
	switch outcome {
	case ReportProbed:
		h.log.Info("proxy reported: probing it now", "id", id, "addr", r.Addr, "reason", r.Reason, "by", r.By)
	case ReportInvalid:
		h.log.Debug("report not understood", "subject", msg.Subject, "err", err)
	default:
		h.log.Debug("proxy reported", "id", id, "outcome", outcome, "reason", r.Reason, "by", r.By)
	}
}

func (h *Health) reportLocked(id string, r messages.Report, err error) string {
	if err != nil || r.V != messages.Version || r.ID != id {
		return ReportInvalid
	}
	if h.sched == nil {
		return ReportUnknown
	}
	t, ok := h.fold.Target(id)
	switch {
	case !ok:
		return ReportUnknown
	case r.Addr != "" && r.Addr != t.Addr:
		return ReportStale
	}
	now := h.now()
	if at, ok := h.reports.last[id]; ok && now.Sub(at) < h.cfg.ReportInterval {
		return ReportLimited
	}
	if !h.reports.limiter.AllowN(now, 1) {
		return ReportLimited
	}
	h.pruneReportsLocked(now)
	h.reports.last[id] = now
	h.reports.follow[id] = h.cfg.Fall
	h.sched.probeSoon(t)
	return ReportProbed
}

// pruneReportsLocked keeps the map of last report probes from growing with
// every proxy ever reported: entries older than ReportInterval say
// nothing any more.
func (h *Health) pruneReportsLocked(now time.Time) {
	if len(h.reports.last) < 1024 {
		return
	}
	for id, at := range h.reports.last {
		if now.Sub(at) >= h.cfg.ReportInterval {
			delete(h.reports.last, id)
		}
	}
}

// followReportLocked is called with each probe's outcome: a proxy probed
// for a report whose probe failed is probed again at once while it stays
// in the rotation, at most Fall times in all; a pass ends it.
func (h *Health) followReportLocked(o probeOutcome) {
	left, ok := h.reports.follow[o.ID]
	if !ok {
		return
	}
	if o.OK || left <= 1 || !h.fold.InRotation(o.ID) {
		delete(h.reports.follow, o.ID)
		return
	}
	t, ok := h.fold.Target(o.ID)
	if !ok || h.sched == nil {
		delete(h.reports.follow, o.ID)
		return
	}
	h.reports.follow[o.ID] = left - 1
	h.sched.probeSoon(t)
}
