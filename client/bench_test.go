package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/client"
	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

// BenchmarkRead50k times the reads of `proxyfleet rotation` and `proxyfleet
// watch` over 50,000 sim proxies, published by a health process on an
// embedded server (the fill is not timed): the rotation as the verb reads
// it (pages and feed; and, for comparison, from PROXY_ROTATION, the latest
// events and PROXY_CHECKS, what it did before and does when no health
// answers) and printed; a watch's first picture (the latest event of
// every proxy) printed as lines and as a table.
func BenchmarkRead50k(b *testing.B) {
	const n = 50000
	srv := natstest.Start(b)
	nc, js := srv.Connect(b)
	ctx := context.Background()
	subj := messages.NewSubjects("")
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		b.Fatal(err)
	}
	_, hjs := srv.Connect(b)
	h, err := health.New(hjs, health.Config{HTTPAddr: health.NoHTTP, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	runtest.Start(b, h.Run, h.Started(), time.Minute)
	for i := 0; i < n; i += 500 {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(n, i+500); j++ {
			id := fmt.Sprintf("proxy-%05d", j)
			body, _ := json.Marshal(messages.StateEvent{V: 1, ID: id, State: messages.StateRunning, Host: "h1",
				IP: fmt.Sprintf("198.18.%d.%d", j/250, j%250+1), Port: 3128, Source: messages.SourceSim, Seq: 1,
				At: time.Now().UTC(), Labels: map[string]string{"pool": fmt.Sprint(j % 8)}})
			f, err := js.PublishAsync(subj.State(id), body)
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
	if !poll.WaitEvery(5*time.Minute, 250*time.Millisecond, func() bool { rot, _ := h.Rotation(); return len(rot.Proxies) == n }) {
		b.Fatal("the rotation never held every proxy")
	}
	c, err := client.New(nc, "")
	if err != nil {
		b.Fatal(err)
	}
	for _, how := range []struct {
		name string
		read func(context.Context) (messages.Rotation, error)
	}{{"pages", c.Rotation}, {"bucket", c.RotationFromBucket}} {
		b.Run("rotation-"+how.name, func(b *testing.B) {
			for b.Loop() {
				rot, err := how.read(ctx)
				if err != nil || len(rot.Proxies) != n {
					b.Fatalf("%d proxies, %v", len(rot.Proxies), err)
				}
				if err := client.PrintRotation(io.Discard, rot); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// watch: the latest event of every proxy, then its lines, until the
	// watch is stopped.
	for name, mode := range map[string]client.WatchMode{"lines": client.WatchLines, "table": client.WatchTable} {
		b.Run("watch-"+name, func(b *testing.B) {
			for b.Loop() {
				wctx, stop := context.WithCancel(ctx)
				wt, err := c.Watch(wctx)
				if err != nil || len(wt.Initial()) != n {
					b.Fatalf("watch: %v", err)
				}
				stop()
				if err := client.PrintWatch(io.Discard, wt, time.Second, client.WithWatchMode(mode)); err != nil {
					b.Fatal(err)
				}
				wt.Stop()
			}
		})
	}
}
