package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"proxyfleet/addrplan"
	"proxyfleet/fleet"
	"proxyfleet/messages"
)

// Metrics. A worker counts what it does in the metrics below and, when
// Config.Registerer is set, registers them there (the process's registry,
// which cmd/proxyfleet serves on /metrics); nothing is registered
// globally. Labels are bounded: op, outcome, class, kind, and the hosts of
// the config; never a proxy id.
type metrics struct {
	commands *prometheus.CounterVec // op, outcome: every result published
	retries  *prometheus.CounterVec // class, stage: work handed back to be tried again
	dead     *prometheus.CounterVec // class: commands given up, with a dead letter
	inFlight *prometheus.GaugeVec   // host: work items delivered and not yet ended
	sweeps   *prometheus.CounterVec // kind: sweep passes run
	swept    *prometheus.CounterVec // kind: things sweeps removed
	redrives prometheus.Counter
	repairs  prometheus.Counter // consumers made anew or consumed again
	// strayPins counts pins no worker held that this worker released
	// (hostshare.Config.StrayUnpinned).
	strayPins prometheus.Counter
	// addrConflicts counts domains found holding an address another
	// proxy's record holds (roomknown.go, recordFound).
	addrConflicts prometheus.Counter
	// hostWrites counts compare-and-set writes of host records by
	// outcome (hostWriter.apply).
	hostWrites *prometheus.CounterVec

	// Latencies, in LatencyBuckets: a command from its acceptance to its
	// answer (done, failed), by op and outcome; a create from the start
	// of its provider call to its proxy seen running with an address.
	commandSeconds *prometheus.HistogramVec
	createRunning  prometheus.Histogram
}

// LatencyBuckets are the upper bounds, in seconds, of the worker's latency
// histograms: from 10ms (a sim host) to 10 minutes (a create that waits
// for a slot behind a host's whole room booting, a base image upload).
// health's running-to-rotation histogram has the same.
var LatencyBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600}

func newMetrics() *metrics {
	return &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_commands_total",
			Help: "Command results this worker published, by op (create, delete, other) and outcome (accepted, rejected, superseded, done, failed).",
		}, []string{"op", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_retries_total",
			Help: "Commands and work items handed back to be tried again after a failure, by error class and stage (intake, work).",
		}, []string{"class", "stage"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_dead_letters_total",
			Help: "Commands given up after their attempts ran out, dead-lettered to PROXY_DEAD, by error class of the last failure.",
		}, []string{"class"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "proxyfleet_work_in_flight",
			Help: "Work items of a host delivered to this worker and not yet ended (waiting for a slot, a lock or a quarantine, or running); observation ticks not included.",
		}, []string{"host"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_sweeps_total",
			Help: "Sweep passes run by this worker: of domains (orphans) and of volumes (unused).",
		}, []string{"kind"}),
		swept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_swept_total",
			Help: "What sweeps removed: orphan domains and unused volumes.",
		}, []string{"kind"}),
		redrives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_redrives_total",
			Help: "Proxies made again because their domain was gone.",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_worker_consumer_repairs_total",
			Help: "Consumers this worker made anew, or consumed again, after they were deleted or their consume stopped.",
		}),
		strayPins: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_worker_stray_pins_released_total",
			Help: "Pins of a host this worker is assigned that no worker held (a pull request left by a stopped consume), which it released rather than wait pinned_ttl.",
		}),
		addrConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "proxyfleet_worker_address_conflicts_total",
			Help: "Domains found on a host with no reservation whose addresses another proxy of the host's record holds, one with a domain there too (one with none gives them up): they keep their room, not the slot (the two proxies share an address until one is deleted).",
		}),
		hostWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_host_record_writes_total",
			Help: "Compare-and-set writes of host records in PROXY_HOSTS by this worker, by outcome: stored; stale, the worker's view of the record was behind (it reads the record and writes again at once); conflict, another worker wrote the record since this one read it (it reads again after a short random pause).",
		}, []string{"outcome"}),
		commandSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_command_duration_seconds",
			Help:    "Commands from their acceptance by intake (their desired record's time) to their answer by this worker's executor, by op (create, delete) and outcome (done, failed); each answer once (not a duplicate of one stored before), re-drives not counted.",
			Buckets: LatencyBuckets,
		}, []string{"op", "outcome"}),
		createRunning: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "proxyfleet_create_running_seconds",
			Help:    "Creates from the start of the provider's create call to their proxy seen running with an address (the boot, and the executor's polls).",
			Buckets: LatencyBuckets,
		}),
	}
}

// observeCommand times an answer of a command intake accepted d ago.
func (m *metrics) observeCommand(op, outcome string, d time.Duration) {
	m.commandSeconds.WithLabelValues(opLabel(op), outcome).Observe(max(d, 0).Seconds())
}

// init makes the series of every known label value, so that they are
// exported at 0 before they first move.
func (m *metrics) init(hosts []string) {
	for _, op := range []string{messages.OpCreate, messages.OpDelete} {
		for _, o := range []string{messages.OutcomeAccepted, messages.OutcomeRejected, messages.OutcomeSuperseded, messages.OutcomeDone, messages.OutcomeFailed} {
			m.commands.WithLabelValues(op, o)
		}
		for _, o := range []string{messages.OutcomeDone, messages.OutcomeFailed} {
			m.commandSeconds.WithLabelValues(op, o)
		}
	}
	m.retries.WithLabelValues(string(fleet.ClassTransient), "work")
	m.retries.WithLabelValues(string(fleet.ClassTransient), "intake")
	m.dead.WithLabelValues(string(fleet.ClassTransient))
	for _, h := range hosts {
		m.inFlight.WithLabelValues(h)
	}
	for _, o := range []string{hostWriteStored, hostWriteStale, hostWriteConflict} {
		m.hostWrites.WithLabelValues(o)
	}
	for _, k := range []string{"domains", "volumes"} {
		m.sweeps.WithLabelValues(k)
	}
	for _, k := range []string{"domain", "volume"} {
		m.swept.WithLabelValues(k)
	}
}

// opLabel bounds the op label: a rejected command's op may be anything.
func opLabel(op string) string {
	if op == messages.OpCreate || op == messages.OpDelete {
		return op
	}
	return "other"
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.commands, m.retries, m.dead, m.inFlight, m.sweeps, m.swept, m.redrives, m.repairs, m.strayPins, m.addrConflicts, m.hostWrites, m.commandSeconds, m.createRunning}
}

// register registers the worker's metrics on r: the counters, and a
// collector of what is read when scraped (hosts, pending work, ownership,
// readiness).
func (w *Worker) register(r prometheus.Registerer) error {
	for _, c := range append(w.metrics.collectors(), &scrapeCollector{w: w}) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Ready says whether the worker can do its job: it consumes (the streams
// and buckets were there, its consumers are made), its NATS connection is
// up, it is not draining, and it has read the membership once, so it owns
// its share of the hosts or is ready to take one. nil: ready.
func (w *Worker) Ready() error {
	select {
	case <-w.started:
	default:
		return errors.New("not started: waiting for the streams and buckets, or binding them")
	}
	select {
	case <-w.draining:
		return errors.New("draining")
	default:
	}
	if s := w.js.Conn().Status(); s != nats.CONNECTED {
		return errors.New("nats connection " + s.String())
	}
	if !w.members.Viewed() {
		return errors.New("no view of the other workers yet")
	}
	return nil
}

// scrapeCollector reads, when scraped, what a worker knows without
// counting it: each of its hosts' record in PROXY_HOSTS (proxies held
// against max_proxies, quarantine) and work consumer (pending items), what
// it owns and pulls, and whether it is ready. Every worker that can
// execute a host exports the host's record and pending work alike; sum
// them with max by (host).
type scrapeCollector struct{ w *Worker }

var (
	descAddresses = prometheus.NewDesc("proxyfleet_host_addresses",
		"A host's address plan, as its record says: slots of each family (ipv4, ipv6: an IPv6 slot is ipv6_per_proxy addresses) by state (held, cooling: freed within reuse_after, free).", []string{"host", "family", "state"}, nil)
	descProxies = prometheus.NewDesc("proxyfleet_host_proxies",
		"Proxies holding room on a host (its record in PROXY_HOSTS).", []string{"host"}, nil)
	descMaxProxies = prometheus.NewDesc("proxyfleet_host_max_proxies",
		"A host's room: max_proxies of the config.", []string{"host"}, nil)
	descQuarantined = prometheus.NewDesc("proxyfleet_host_quarantined",
		"1 while a host is quarantined: placement skips it and its work waits.", []string{"host"}, nil)
	descPending = prometheus.NewDesc("proxyfleet_work_pending",
		"Work items of a host waiting in PROXY_WORK, not yet delivered to its owner.", []string{"host"}, nil)
	descOwned = prometheus.NewDesc("proxyfleet_worker_host_owned",
		"1 while this worker holds the pin of a host's work consumer: it owns the host.", []string{"host"}, nil)
	descPulling = prometheus.NewDesc("proxyfleet_worker_host_pulling",
		"1 while this worker pulls a host's work: its share, or a backup.", []string{"host"}, nil)
	descReady = prometheus.NewDesc("proxyfleet_worker_ready",
		"1 while the worker is ready (as /readyz): consuming, connected, not draining, with a view of the other workers.", nil, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAddresses, descProxies, descMaxProxies, descQuarantined, descPending, descOwned, descPulling, descReady} {
		ch <- d
	}
}

// scrapeTimeout bounds what a scrape reads from NATS.
const scrapeTimeout = 2 * time.Second

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	ready := 0.0
	if w.Ready() == nil {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	select {
	case <-w.started:
	default:
		return // nothing bound yet
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	for _, r := range w.runs {
		h := r.host
		if h == "" {
			continue
		}
		b2f := func(b bool) float64 {
			if b {
				return 1
			}
			return 0
		}
		ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, b2f(r.Pin() != ""), h)
		ch <- prometheus.MustNewConstMetric(descPulling, prometheus.GaugeValue, b2f(r.pulling.Load()), h)
		ch <- prometheus.MustNewConstMetric(descMaxProxies, prometheus.GaugeValue, float64(w.catalog.maxProxies(h)), h)
		if ctx.Err() != nil {
			continue
		}
		if rec, _, err := w.readHost(ctx, h); err == nil {
			ch <- prometheus.MustNewConstMetric(descProxies, prometheus.GaugeValue, float64(len(rec.Proxies)), h)
			ch <- prometheus.MustNewConstMetric(descQuarantined, prometheus.GaugeValue, b2f(rec.Quarantined()), h)
			if plan := w.catalog.Plans[h]; plan != nil {
				if st, err := addrsOf(&rec); err == nil {
					v4, v6 := plan.Usage(&st, time.Now())
					for _, f := range []struct {
						name string
						u    addrplan.Usage
					}{{"ipv4", v4}, {"ipv6", v6}} {
						if f.u.Slots == 0 {
							continue
						}
						ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(f.u.Held), h, f.name, "held")
						ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(f.u.Cooling), h, f.name, "cooling")
						ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(f.u.Free), h, f.name, "free")
					}
				}
			}
		}
		if cons, err := w.js.Consumer(ctx, messages.StreamWork, r.name()); err == nil {
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(cons.CachedInfo().NumPending), h)
		}
	}
}
