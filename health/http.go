package health

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Handler serves:
//
//	GET /rotation  the current snapshot (messages.Rotation JSON); 503 until caught up
//	GET /healthz   200 "ok" once caught up and publishing; 503 and the reason if not
//	GET /metrics   Prometheus text format
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rotation", h.serveRotation)
	mux.HandleFunc("GET /healthz", h.serveHealthz)
	mux.HandleFunc("GET /metrics", h.serveMetrics)
	return mux
}

func (h *Health) serveRotation(w http.ResponseWriter, _ *http.Request) {
	snap, ok := h.Rotation()
	if !ok {
		// A partial picture would look like proxies leaving.
		http.Error(w, "catching up", http.StatusServiceUnavailable)
		return
	}
	body, err := json.Marshal(snap)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(append(body, '\n'))
}

func (h *Health) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	if err := h.Ready(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

func (h *Health) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	m := h.Metrics()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(w, m)
}

// writeMetrics writes m in the Prometheus text exposition format.
func writeMetrics(w io.Writer, m Metrics) {
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	for _, x := range []struct {
		name, typ, help string
		value           any
	}{
		{"proxyfleet_rotation_size", "gauge", "Proxies in the rotation.", m.RotationSize},
		{"proxyfleet_rotation_in_grace", "gauge", "Proxies in the rotation kept on grace after reporting provisioning.", m.InGrace},
		{"proxyfleet_rotation_version", "gauge", "Version of the current rotation snapshot (in this process).", m.RotationVersion},
		{"proxyfleet_rotation_changes_total", "counter", "Changes of the rotation folded from events and grace expiries.", m.Changes},
		{"proxyfleet_events_total", "counter", "State events received.", m.Events},
		{"proxyfleet_events_ignored_total", "counter", "State events ignored: stale, duplicate or not understood.", m.Ignored},
		{"proxyfleet_rotation_publish_errors_total", "counter", "Failed attempts to publish the rotation.", m.PublishErrors},
		{"proxyfleet_health_caught_up", "gauge", "1 once the initial events are folded.", b2i(m.CaughtUp)},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", x.name, x.help, x.name, x.typ, x.name, x.value)
	}
}
