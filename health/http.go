package health

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"proxyfleet/messages"
)

// Handler serves:
//
//	GET /rotation  the rotation (messages.Rotation JSON), with an ETag; with
//	               ?since=V the changes after version V if they are still
//	               known (see serveRotation); 503 until caught up
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

// httpCache is the body of GET /rotation for one state of the view (its
// ETag): built when first asked for, not per change.
type httpCache struct {
	etag string
	body []byte
}

// Answers of GET /rotation (proxyfleet_rotation_http_total).
const (
	HTTPSnapshot    = "snapshot"
	HTTPChanges     = "changes"
	HTTPNotModified = "not_modified"
)

var httpAnswers = []string{HTTPSnapshot, HTTPChanges, HTTPNotModified}

// serveRotation answers GET /rotation: the whole rotation
// (messages.Rotation), or with ?since=V the changes after version V
// (messages.RotationChanges from V to the current version) when this
// process publishes, still keeps them and they fit in one message, else
// the whole rotation; the header X-Proxyfleet-Rotation says which
// (snapshot or changes). The ETag is the version ("V"; on a standby,
// whose rotation changes between versions, "V-sG"); a request whose
// If-None-Match holds it is answered 304.
func (h *Health) serveRotation(w http.ResponseWriter, r *http.Request) {
	var since uint64
	sinceStr := r.URL.Query().Get("since")
	if sinceStr != "" {
		v, err := strconv.ParseUint(sinceStr, 10, 64)
		if err != nil {
			http.Error(w, "since: want a version (an unsigned integer)", http.StatusBadRequest)
			return
		}
		since = v
	}
	h.mu.Lock()
	if !h.caughtUp {
		h.mu.Unlock()
		// A partial picture would look like proxies leaving.
		http.Error(w, "catching up", http.StatusServiceUnavailable)
		return
	}
	v := h.viewLocked()
	published := h.holder && !h.feedReset // the view is a published version
	etag := `"` + strconv.FormatUint(v.version, 10) + `"`
	if !published {
		etag = `"` + strconv.FormatUint(v.version, 10) + "-s" + strconv.FormatUint(v.gen, 10) + `"`
	}
	role := "standby"
	if h.holder {
		role = "holder"
	}
	if etagMatch(r.Header.Get("If-None-Match"), etag) {
		h.httpAnswers[HTTPNotModified]++
		h.mu.Unlock()
		w.Header().Set("ETag", etag)
		w.Header().Set("X-Proxyfleet-Lease", role)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	var body []byte
	kind := HTTPSnapshot
	if sinceStr != "" && published && since != 0 {
		var changes []change
		ok := since == v.version
		if !ok {
			changes, ok = h.ring.since(since)
		}
		if ok {
			if b := appendFeed(nil, v.version, since, v.Len(), changes, v.at); len(b) <= messages.MaxBodySize {
				body, kind = b, HTTPChanges
			}
		}
	}
	if body == nil {
		if h.http.etag != etag {
			h.http = httpCache{etag: etag, body: v.appendSnapshot(make([]byte, 0, v.snapshotSize()))}
		}
		body = h.http.body
	}
	h.httpAnswers[kind]++
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", etag)
	w.Header().Set("X-Proxyfleet-Lease", role)
	w.Header().Set("X-Proxyfleet-Rotation", kind)
	w.Write(body)
	w.Write([]byte{'\n'})
}

// etagMatch reports whether an If-None-Match header holds etag (or *).
func etagMatch(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
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
