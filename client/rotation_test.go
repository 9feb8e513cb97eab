package client_test

import (
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
)

// TestRotationFromHealth: with a health process publishing, Rotation is
// its rotation exactly, at its version, each entry whole (host, labels),
// also while proxies keep entering: pages and the feed agree.
func TestRotationFromHealth(t *testing.T) {
	r := newRig(t, false)
	js, err := jetstream.New(r.connect())
	if err != nil {
		t.Fatal(err)
	}
	h, err := health.New(js, health.Config{HTTPAddr: health.NoHTTP, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runtest.Start(t, h.Run, h.Started(), 10*time.Second)
	event := func(i int) {
		r.publishEvent(messages.StateEvent{ID: fmt.Sprintf("p%04d", i), State: messages.StateRunning, Host: "h1",
			IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1), Port: 3128, Source: messages.SourceSim, Seq: 1,
			Labels: map[string]string{"n": fmt.Sprint(i % 3)}})
	}
	const n = 800 // more than one page
	for i := range n / 2 {
		event(i)
	}
	// Read while the other half enters.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := n / 2; i < n; i++ {
			event(i)
		}
	}()
	rot, err := r.c.Rotation(ctxFor(t, 20*time.Second))
	<-done
	if err != nil {
		t.Fatal(err)
	}
	hr, _ := h.Rotation()
	if rot.Version > hr.Version {
		t.Fatalf("version %d, health's %d", rot.Version, hr.Version)
	}
	for _, e := range rot.Proxies {
		if e.Host != "h1" || e.Labels["n"] == "" {
			t.Fatalf("an entry not whole: %+v", e)
		}
	}
	// Once every proxy is in, a read is health's rotation at its version.
	poll.Until(t, "every proxy published", 20*time.Second, func() bool { hr, _ := h.Rotation(); return len(hr.Proxies) == n })
	rot, err = r.c.Rotation(ctxFor(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hr, _ = h.Rotation()
	if rot.Version != hr.Version || !maps.Equal(addrsOf(rot), addrsOf(hr)) || len(rot.Proxies) != n {
		t.Fatalf("client: %d proxies at version %d; health: %d at %d", len(rot.Proxies), rot.Version, len(hr.Proxies), hr.Version)
	}
}

func addrsOf(rot messages.Rotation) map[string]string {
	out := map[string]string{}
	for _, e := range rot.Proxies {
		out[e.ID] = e.Addr
	}
	return out
}
