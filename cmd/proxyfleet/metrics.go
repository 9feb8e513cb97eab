package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"proxyfleet/kvm"
)

// Metrics: each process has one registry, made here, with the Go and
// process collectors and proxyfleet_build_info; the libraries register
// their own metrics on it (worker.Config.Registerer, health.Config.Registry)
// or are heard through an observer (kvm.Options.Observer, below). Nothing
// is registered on client_golang's global registry.

// newRegistry is a process's registry, for role.
func newRegistry(role string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(role),
	)
	return reg
}

// buildInfo is proxyfleet_build_info: 1, with the version, the VCS
// revision, the Go version and the role as labels.
func buildInfo(role string) prometheus.Collector {
	v := readVersion() // what `proxyfleet version` says
	version, revision := v.Version, v.Commit
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "proxyfleet_build_info",
		Help: "1, labelled with the binary's version, VCS revision and Go version, and the process's role.",
		ConstLabels: prometheus.Labels{
			"version": version, "revision": revision, "goversion": runtime.Version(), "role": role,
		},
	})
	g.Set(1)
	return g
}

// kvmMetrics are what the kvm providers' links tell their observers.
type kvmMetrics struct {
	calls    *prometheus.HistogramVec // host, procedure, result
	dials    *prometheus.CounterVec   // host, result
	deaths   *prometheus.CounterVec   // host
	overruns *prometheus.CounterVec   // host
	bytes    *prometheus.CounterVec   // host
}

func newKVMMetrics(reg prometheus.Registerer) *kvmMetrics {
	m := &kvmMetrics{
		calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "proxyfleet_libvirt_call_duration_seconds",
			Help:    "libvirt remote procedure calls, from request to reply, by host, procedure (go-libvirt's name, or other) and result (ok, or error when the daemon answered one).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"host", "procedure", "result"}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_libvirt_link_dials_total",
			Help: "Dials of a libvirt link (the shared one or a transfer's) over SSH, by host and result (ok, error).",
		}, []string{"host", "result"}),
		deaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_libvirt_link_deaths_total",
			Help: "Open libvirt links that died: killed over a budget, transport failure, failed keepalive, transfer cut.",
		}, []string{"host"}),
		overruns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_libvirt_budget_overruns_total",
			Help: "libvirt calls that ran over their time budget (each kills its link).",
		}, []string{"host"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "proxyfleet_image_transferred_bytes_total",
			Help: "Bytes of base images (and kernels, initrds) read and uploaded to a host's pool.",
		}, []string{"host"}),
	}
	reg.MustRegister(m.calls, m.dials, m.deaths, m.overruns, m.bytes)
	return m
}

// observer is the kvm.Observer of one host entry: its series exist, at 0,
// from the start.
func (m *kvmMetrics) observer(host string) kvm.Observer {
	o := &kvmObserver{
		m: m, host: host,
		dialOK: m.dials.WithLabelValues(host, "ok"), dialErr: m.dials.WithLabelValues(host, "error"),
		death: m.deaths.WithLabelValues(host), overrun: m.overruns.WithLabelValues(host), bytes: m.bytes.WithLabelValues(host),
	}
	return o
}

type kvmObserver struct {
	m                                      *kvmMetrics
	host                                   string
	dialOK, dialErr, death, overrun, bytes prometheus.Counter
}

func (o *kvmObserver) Call(procedure string, d time.Duration, failed bool) {
	result := "ok"
	if failed {
		result = "error"
	}
	o.m.calls.WithLabelValues(o.host, procedure, result).Observe(d.Seconds())
}

func (o *kvmObserver) Dial(err error) {
	if err != nil {
		o.dialErr.Inc()
		return
	}
	o.dialOK.Inc()
}

func (o *kvmObserver) Death(error)        { o.death.Inc() }
func (o *kvmObserver) Overrun()           { o.overrun.Inc() }
func (o *kvmObserver) ImageBytes(n int64) { o.bytes.Add(float64(n)) }

// opsHandler serves a role's /metrics (reg), /healthz (200 while the
// process serves) and /readyz (200 once ready() is nil; 503 and why not).
func opsHandler(reg *prometheus.Registry, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	return mux
}

// roleOpsHandler is opsHandler, with Go's profiles (pprofHandler) when
// withPprof: a role's --http listener as its --pprof flag asks.
func roleOpsHandler(reg *prometheus.Registry, ready func() error, withPprof bool) http.Handler {
	h := opsHandler(reg, ready)
	if withPprof {
		h = pprofHandler(h)
	}
	return h
}

// pprofHandler is h with Go's profiles (net/http/pprof) under
// /debug/pprof/: only with a role's --pprof (the profiles show the process's
// insides and cost CPU while one is taken), so that `go tool pprof` can
// profile a worker or a gateway under load (make bench does).
func pprofHandler(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// withStats is h with the gateway's per-site statistics at /stats: on
// the ops listener and nowhere else, as guarded as /metrics (loopback by
// default), since it names the sites the gateway's clients reach.
func withStats(h, stats http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("GET /stats", stats)
	return mux
}

// opsComponents serve h on ln until ctx is done: one serves, the other
// shuts the server down once ctx is done, giving the requests in flight
// 5s. Serving stops with an error only if the listener fails.
func opsComponents(ln net.Listener, h http.Handler, log *slog.Logger) []component {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	serve := func(context.Context) error {
		log.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http on %s: %w", ln.Addr(), err)
		}
		return nil
	}
	shutdown := func(ctx context.Context) error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	}
	return []component{{"http", serve}, {"http", shutdown}}
}
