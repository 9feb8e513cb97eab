package health_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"proxyfleet/health"
	"proxyfleet/messages"
)

// httpRotation reads GET /rotation with its headers.
func httpRotation(t *testing.T, h *health.Health, query string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+h.Addr()+"/rotation"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestPageRequests: pages of a given size, in order; a bad request is
// answered with its field named; no process holding the lease, no
// answer at all.
func TestPageRequests(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	waitPublishing(t, h)
	for i := range 10 {
		r.publish(event(fmt.Sprintf("p%d", i), 1, messages.StateRunning, fmt.Sprintf("198.18.100.%d", i+1)))
	}
	waitFor(t, "10 proxies published", func() bool { return h.Metrics().FeedChanges == 10 })
	req := func(body string) messages.RotationPage {
		msg, err := r.nc.Request(subj.RotationGet(), []byte(body), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var p messages.RotationPage
		if err := json.Unmarshal(msg.Data, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := req(`{"v":1,"limit":4}`)
	if len(p.Proxies) != 4 || p.Next != "p3" || p.Size != 10 || p.Proxies[0].ID != "p0" {
		t.Fatalf("first page: %+v", p)
	}
	p = req(`{"v":1,"after":"p3","limit":4}`)
	if len(p.Proxies) != 4 || p.Next != "p7" || p.Proxies[0].ID != "p4" {
		t.Fatalf("second page: %+v", p)
	}
	p = req(`{"v":1,"after":"p7"}`)
	if len(p.Proxies) != 2 || p.Next != "" {
		t.Fatalf("last page: %+v", p)
	}
	if p := req(`{"v":1,"limit":-1}`); !strings.HasPrefix(p.Error, "limit:") || p.Proxies != nil {
		t.Fatalf("a bad request: %+v", p)
	}
	if got := h.Metrics().Pages; got[health.PageServed] != 3 || got[health.PageInvalid] != 1 {
		t.Fatalf("pages %v", got)
	}
	if err := r.stop(h); err != nil {
		t.Fatal(err)
	}
	if _, err := r.nc.Request(subj.RotationGet(), []byte(`{"v":1}`), 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no publisher: %v, want no responders", err)
	}
}

// TestRotationETagAndSince: GET /rotation carries the version as its
// ETag and answers 304 to it; ?since=V answers the changes after V, which
// bring the rotation at V to the current one; a version it does not know
// is answered with the whole rotation, and the header says which.
func TestRotationETagAndSince(t *testing.T) {
	r := newRig(t)
	h := r.start(health.Config{})
	waitPublishing(t, h)
	r.publishFolded(h, event("p1", 1, messages.StateRunning, "198.18.100.1"), event("p2", 1, messages.StateRunning, "198.18.100.2"))
	waitFor(t, "p1 and p2 published", func() bool { return h.Metrics().FeedChanges == 2 })
	resp, body := httpRotation(t, h, "", nil)
	var before messages.Rotation
	if err := messages.Decode(body, &before); err != nil || len(before.Proxies) != 2 {
		t.Fatalf("GET /rotation: %v %s", err, body)
	}
	etag := resp.Header.Get("ETag")
	if etag != `"`+strconv.FormatUint(before.Version, 10)+`"` || resp.Header.Get("X-Proxyfleet-Rotation") != "snapshot" {
		t.Fatalf("ETag %q for version %d; headers %v", etag, before.Version, resp.Header)
	}
	if resp, _ := httpRotation(t, h, "", map[string]string{"If-None-Match": etag}); resp.StatusCode != http.StatusNotModified {
		t.Fatalf("If-None-Match the version: %d", resp.StatusCode)
	}
	r.publishFolded(h, event("p1", 2, messages.StateDeleted, ""), event("p3", 1, messages.StateRunning, "198.18.100.3"))
	waitFor(t, "p1 and p3 published", func() bool { return h.Metrics().FeedChanges == 4 })
	resp, body = httpRotation(t, h, "?since="+strconv.FormatUint(before.Version, 10), map[string]string{"If-None-Match": etag})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Proxyfleet-Rotation") != "changes" {
		t.Fatalf("since %d: %d %v", before.Version, resp.StatusCode, resp.Header)
	}
	changes, err := messages.DecodeRotationChanges(body)
	if err != nil || changes.Prev != before.Version || resp.Header.Get("ETag") != `"`+strconv.FormatUint(changes.Version, 10)+`"` {
		t.Fatalf("since %d: %+v %v", before.Version, changes, err)
	}
	state := map[string]string{}
	for _, e := range before.Proxies {
		state[e.ID] = e.Addr
	}
	for _, c := range changes.Changes {
		if c.Op == messages.ChangeLeft {
			delete(state, c.ID)
		} else {
			state[c.ID] = c.Proxy.Addr
		}
	}
	want := map[string]string{"p2": "198.18.100.2:3128", "p3": "198.18.100.3:3128"}
	if !maps.Equal(state, want) || changes.Size != 2 {
		t.Fatalf("the rotation at %d with the changes since: %v, want %v", before.Version, state, want)
	}
	resp, body = httpRotation(t, h, "?since=1", nil)
	var all messages.Rotation
	if err := messages.Decode(body, &all); err != nil || resp.Header.Get("X-Proxyfleet-Rotation") != "snapshot" || !maps.Equal(addrs(all.Proxies), want) {
		t.Fatalf("since a version it does not know: %v %v %s", err, resp.Header, body)
	}
	resp, body = httpRotation(t, h, "?since="+strconv.FormatUint(changes.Version, 10), nil)
	if c, err := messages.DecodeRotationChanges(body); err != nil || resp.Header.Get("X-Proxyfleet-Rotation") != "changes" || len(c.Changes) != 0 {
		t.Fatalf("since the current version: %v %s", err, body)
	}
	if resp, _ := httpRotation(t, h, "?since=x", nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("since=x: %d", resp.StatusCode)
	}
	if m := h.Metrics().HTTP; m[health.HTTPNotModified] != 1 || m[health.HTTPChanges] != 2 || m[health.HTTPSnapshot] < 2 {
		t.Fatalf("http answers %v", m)
	}
}
