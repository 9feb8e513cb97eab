package main

import (
	"encoding/json"
	"net/http"
)

// Switch is something the control server can stop and start.
type Switch interface {
	Start() error
	Stop()
	Running() bool
}

// StatusSource adds fields to /healthz.
type StatusSource interface{ Status() map[string]any }

// agentSwitch adapts Agent (whose Start cannot fail) to Switch.
type agentSwitch struct{ a *Agent }

func (s agentSwitch) Start() error  { s.a.Start(); return nil }
func (s agentSwitch) Stop()         { s.a.Stop() }
func (s agentSwitch) Running() bool { return s.a.Running() }

// ControlHandler serves the test control API:
//
//	GET  /healthz       JSON status (with the proxy's effective configuration
//	                    when proxy has a Status method)
//	GET  /instance-id   the seed's instance-id, plain text
//	GET  /meta-data     the seed's meta-data file as read
//	GET  /user-data     the seed's user-data file as read
//	POST /proxy/stop, /proxy/start, /agent/stop, /agent/start
//
// Each of extra adds its Status to /healthz (the network's set-up).
func ControlHandler(seeds *SeedStore, proxy, agent Switch, extra ...StatusSource) http.Handler {
	mux := http.NewServeMux()
	seedOr503 := func(w http.ResponseWriter) *Seed {
		s, err := seeds.Get()
		if s == nil {
			msg := "no seed"
			if err != nil {
				msg = err.Error()
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
		}
		return s
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		st := map[string]any{"ok": true, "proxy": proxy.Running(), "agent": agent.Running()}
		if ps, ok := proxy.(interface{ Status() map[string]any }); ok {
			for k, v := range ps.Status() {
				st[k] = v
			}
		}
		for _, x := range extra {
			for k, v := range x.Status() {
				st[k] = v
			}
		}
		if s, err := seeds.Get(); s != nil {
			st["instance_id"] = s.InstanceID
			st["local_hostname"] = s.LocalHostname
			st["seed_source"] = s.Source
		} else if err != nil {
			st["seed_error"] = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("GET /instance-id", func(w http.ResponseWriter, r *http.Request) {
		if s := seedOr503(w); s != nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte(s.InstanceID))
		}
	})
	mux.HandleFunc("GET /meta-data", func(w http.ResponseWriter, r *http.Request) {
		if s := seedOr503(w); s != nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write(s.MetaDataRaw)
		}
	})
	mux.HandleFunc("GET /user-data", func(w http.ResponseWriter, r *http.Request) {
		if s := seedOr503(w); s != nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write(s.UserData)
		}
	})
	toggle := func(sw Switch, start bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if start {
				if err := sw.Start(); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			} else {
				sw.Stop()
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if sw.Running() {
				w.Write([]byte("running\n"))
			} else {
				w.Write([]byte("stopped\n"))
			}
		}
	}
	mux.HandleFunc("POST /proxy/stop", toggle(proxy, false))
	mux.HandleFunc("POST /proxy/start", toggle(proxy, true))
	mux.HandleFunc("POST /agent/stop", toggle(agent, false))
	mux.HandleFunc("POST /agent/start", toggle(agent, true))
	return mux
}
