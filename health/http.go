package health

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"proxyfleet/messages"
)

// Handler serves:
//
//	GET /rotation  the current snapshot (messages.Rotation JSON); 503 until caught up
//	GET /checks    the check records of this process's fold (a JSON list of
//	               messages.CheckRecord, sorted by id): why a proxy is
//	               refused, and every egress; 503 until caught up
//	GET /healthz   liveness: 200 "ok" while the process serves
//	GET /readyz    readiness: 200 "ok" once caught up and publishing (or
//	               standing by), and Config.ReadyCheck passes; 503 and the
//	               reason if not
//	GET /metrics   Prometheus exposition of Config.Registry (client_golang)
//	GET /probe     the probe target: ?nonce=N answers N (see ProbeHandler)
//
// /rotation and /checks are this process's own fold; on a standby they are
// what it would publish, and the rotation's version is the last one it
// knows to be published.
// The header X-Proxyfleet-Lease says "holder" or "standby".
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rotation", h.serveRotation)
	mux.HandleFunc("GET /checks", h.serveChecks)
	mux.HandleFunc("GET /healthz", h.serveHealthz)
	mux.HandleFunc("GET /readyz", h.serveReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(h.registry, promhttp.HandlerOpts{}))
	mux.Handle("GET "+ProbePath, ProbeHandler())
	return mux
}

func (h *Health) role() string {
	if h.Holder() {
		return "holder"
	}
	return "standby"
}

func (h *Health) serveRotation(w http.ResponseWriter, _ *http.Request) {
	snap, ok := h.Rotation()
	if !ok {
		// A partial picture would look like proxies leaving.
		http.Error(w, "catching up", http.StatusServiceUnavailable)
		return
	}
	h.writeJSON(w, snap)
}

// writeJSON answers v as JSON, never cached, saying this process's role.
func (h *Health) writeJSON(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Proxyfleet-Lease", h.role())
	w.Write(append(body, '\n'))
}

// Checks returns the check records of this process's fold, sorted by id,
// and whether it is caught up (before that they are partial).
func (h *Health) Checks() ([]messages.CheckRecord, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fold.Checks(), h.caughtUp
}

func (h *Health) serveChecks(w http.ResponseWriter, _ *http.Request) {
	recs, ok := h.Checks()
	if !ok {
		http.Error(w, "catching up", http.StatusServiceUnavailable)
		return
	}
	h.writeJSON(w, recs)
}

func (h *Health) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Proxyfleet-Lease", h.role())
	io.WriteString(w, "ok\n")
}

func (h *Health) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	err := h.Ready()
	if err == nil && h.cfg.ReadyCheck != nil {
		err = h.cfg.ReadyCheck()
	}
	if err != nil {
		w.Header().Set("X-Proxyfleet-Lease", h.role())
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Proxyfleet-Lease", h.role())
	io.WriteString(w, "ok\n")
}
