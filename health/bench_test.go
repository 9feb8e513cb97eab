package health_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"proxyfleet/health"
	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
	"proxyfleet/internal/runtest"
	"proxyfleet/messages"
	"proxyfleet/topology"
)

var changeProfile = flag.String("changeprofile", "", "BenchmarkChange50k: write a CPU profile of the changes alone (not the fill) to this file")

// BenchmarkFill50k feeds the running events of 50,000 sim proxies through a
// health process on an embedded server, as fast as the stream takes them,
// and measures the time until all of them are in the rotation and in
// PROXY_ROTATION.
func BenchmarkFill50k(b *testing.B) {
	for range b.N {
		b.StopTimer()
		c := startChurn(b, 50000)
		b.StartTimer()
		start := time.Now()
		c.fill()
		b.StopTimer()
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(c.n), "ns/change")
		c.stop()
	}
}

// BenchmarkChange50k fills the rotation with 50,000 sim proxies (not
// timed), then changes the address of 2,000 of them one at a time, each
// once the one before is in PROXY_ROTATION, and measures the time per
// change: what one change costs health with 50,000 proxies in the
// rotation. With -changeprofile, a CPU profile of the changes alone.
func BenchmarkChange50k(b *testing.B) {
	for range b.N {
		b.StopTimer()
		c := startChurn(b, 50000)
		c.fill()
		const changes = 2000
		if *changeProfile != "" {
			f, err := os.Create(*changeProfile)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		for i := range changes {
			id := fmt.Sprintf("p%05d", i*(c.n/changes))
			ev := c.event(id, 2, fmt.Sprintf("198.19.%d.%d", i/250, i%250+1))
			if _, err := c.js.Publish(context.Background(), subj.State(id), ev); err != nil {
				b.Fatal(err)
			}
			select {
			case <-c.puts:
			case <-time.After(time.Minute):
				b.Fatalf("change %d not in %s after a minute", i, messages.BucketRotation)
			}
		}
		took := time.Since(start)
		b.StopTimer()
		if *changeProfile != "" {
			pprof.StopCPUProfile()
		}
		b.ReportMetric(float64(took.Nanoseconds())/changes, "ns/change")
		c.stop()
	}
}

// churn is a health process on an embedded server, fed sim proxies.
type churn struct {
	b    *testing.B
	n    int
	js   jetstream.JetStream
	h    *health.Health
	run  *runtest.Running
	puts chan struct{} // a put in PROXY_ROTATION
}

func startChurn(b *testing.B, n int) *churn {
	srv := natstest.Start(b)
	nc, js := srv.Connect(b)
	ctx := context.Background()
	if err := (topology.Topology{Subjects: subj}).Ensure(ctx, js, []string{"h1"}); err != nil {
		b.Fatal(err)
	}
	c := &churn{b: b, n: n, js: js, puts: make(chan struct{}, n+1)}
	sub, err := nc.Subscribe("$KV."+messages.BucketRotation+".>", func(*nats.Msg) { c.puts <- struct{}{} })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	c.h, err = health.New(js, health.Config{Subjects: subj, HTTPAddr: health.NoHTTP,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	c.run = runtest.Start(b, c.h.Run, c.h.Started(), time.Minute)
	<-c.h.CaughtUp()
	return c
}

func (c *churn) event(id string, seq uint64, ip string) []byte {
	ev := messages.StateEvent{V: 1, ID: id, State: messages.StateRunning, Host: "h1", IP: ip, Port: 3128,
		Source: messages.SourceSim, Seq: seq, At: time.Now().UTC(), Labels: map[string]string{"pool": id[len(id)-1:]}}
	body, err := json.Marshal(ev)
	if err != nil {
		c.b.Fatal(err)
	}
	return body
}

// fill publishes the running events of n proxies and waits until all are
// in PROXY_ROTATION.
func (c *churn) fill() {
	bodies := make([][]byte, c.n)
	for i := range c.n {
		bodies[i] = c.event(fmt.Sprintf("p%05d", i), 1, fmt.Sprintf("198.18.%d.%d", i/250, i%250+1))
	}
	for i := 0; i < c.n; i += 500 {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(c.n, i+500); j++ {
			f, err := c.js.PublishAsync(subj.State(fmt.Sprintf("p%05d", j)), bodies[j])
			if err != nil {
				c.b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				c.b.Fatal(err)
			}
		}
	}
	for i := range c.n {
		select {
		case <-c.puts:
		case <-time.After(5 * time.Minute):
			c.b.Fatalf("%d of %d proxies in %s after 5 minutes", i, c.n, messages.BucketRotation)
		}
	}
	// Looked at seldom: a look costs health a scrape of its metrics.
	if !poll.WaitEvery(time.Minute, 250*time.Millisecond, func() bool { return c.h.Metrics().RotationSize == c.n }) {
		c.b.Fatal("the rotation does not hold every proxy")
	}
}

func (c *churn) stop() {
	if err := c.run.Stop(); err != nil {
		c.b.Fatal(err)
	}
}
