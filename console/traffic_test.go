package console_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"proxyfleet/console"
	"proxyfleet/internal/poll"
)

// A gateway the console cannot read shows its error on the traffic
// page and in the live stream's traffic events; without a health
// process the rotation page says the rotation is not read. Neither page
// is served before a login.
func TestTrafficAndRotationPagesWithoutTheirSources(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	r := newRig(t, func(c *console.Config) {
		c.Gateways = []string{closed}
		c.GatewayInterval = 100 * time.Millisecond
	})
	b := r.browser()
	for _, p := range []string{"/traffic", "/rotation"} {
		if resp, _ := b.do("GET", p, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
			t.Errorf("GET %s before login: %s to %q", p, resp.Status, resp.Header.Get("Location"))
		}
	}
	b.login("viewer", viewerPW)
	poll.Until(t, "the traffic page to show the failed read", 30*time.Second, func() bool {
		resp, body := b.do("GET", "/traffic", nil)
		return resp.StatusCode == http.StatusOK && strings.Contains(body, closed) && strings.Contains(body, "connection refused") &&
			countOf(body, "traffic-total") == "0"
	})
	resp, body := b.do("GET", "/rotation", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="rotation-waiting"`) || countOf(body, "rotation-now") != "0" {
		t.Errorf("GET /rotation without health: %s\n%s", resp.Status, body)
	}

	// The stream ends at once while the console does not follow the
	// events yet: open it again, as the browser's EventSource does.
	var got string
	poll.Until(t, "a traffic event on the live stream", 30*time.Second, func() bool {
		got = trafficEvent(t, b, r.base+"/events?want=traffic&since="+b.since("/traffic"))
		return got != ""
	})
	if !strings.Contains(got, "connection refused") || !strings.Contains(got, `"gateway":"`+closed+`"`) {
		t.Fatalf("a traffic event: %s", got)
	}
}

// trafficEvent reads the stream at u until its first traffic event and
// returns its data; "" if the stream ended first.
func trafficEvent(t *testing.T, b *browser, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "traffic":
			return strings.TrimPrefix(line, "data: ")
		}
	}
	return ""
}
