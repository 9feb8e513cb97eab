package console

import "net/http"

type trafficData struct {
	Traffic  trafficPicture
	Since    uint64 // the position of the live stream the page starts at
	Interval string
}

// trafficPage shows the gateways' requests by outcome, each gateway's
// and their sum, with the rates over the last minute and five, from
// the console's last reads of their /metrics; the live stream's
// "traffic" events bring each new read.
func (s *Server) trafficPage(w http.ResponseWriter, r *http.Request, sess *session) {
	d := trafficData{Since: s.hub.position(), Interval: s.cfg.GatewayInterval.String()}
	d.Traffic, _ = s.traffic.current()
	s.render(w, r, http.StatusOK, "traffic", sess, "Traffic", d)
}
