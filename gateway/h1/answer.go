package h1

import (
	"net/http"
	"strconv"
	"time"
)

// AppendStart appends the start of an answer to b: the HTTP/1.1 status
// line of status (with its standard reason phrase) and a Date field of
// now; the caller appends the other fields and the empty line.
func AppendStart(b []byte, status int, now time.Time) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(status)...)
	b = append(b, "\r\nDate: "...)
	b = now.UTC().AppendFormat(b, http.TimeFormat)
	return append(b, "\r\n"...)
}
