package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

type rotationData struct {
	Chart chartPicture
	Since uint64 // the position of the live stream the page starts at
}

// rotationPage charts the rotation's size and its entries and exits per
// minute over the last hour, drawn by the server (an inline SVG); the
// live stream's "rotation" events redraw it.
func (s *Server) rotationPage(w http.ResponseWriter, r *http.Request, sess *session) {
	d := rotationData{Since: s.hub.position()}
	d.Chart, _ = s.chart.current()
	s.render(w, r, http.StatusOK, "rotation", sess, "Rotation", d)
}

// sendPicture writes a live stream's event of a page's picture (the
// rotation's chart, the traffic's table): its JSON, which the page's
// script puts in place.
func sendPicture(w io.Writer, event string, p any) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	return err
}
