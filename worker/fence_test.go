package worker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"proxyfleet/internal/natstest"
	"proxyfleet/internal/poll"
)

// TestFenceAbandonsWorkWhenCutOff: work delivered before the connection to
// NATS was lost for longer than the fence's limit is cancelled; work
// delivered after the connection is back is not.
func TestFenceAbandonsWorkWhenCutOff(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	f := newFence(nc, 200*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	defer func() { cancel(); <-done }()

	before, release := f.bind(context.Background())
	defer release()
	time.Sleep(400 * time.Millisecond) // connected: nothing is cut however long
	if before.Err() != nil {
		t.Fatal("work cut while connected")
	}
	srv.Stop()
	cutAt := time.Now()
	poll.Until(t, "in-flight work cut off", 10*time.Second, func() bool { return before.Err() != nil })
	t.Logf("work abandoned %s after the server went", time.Since(cutAt).Round(time.Millisecond))
	srv.Start(t)
	poll.Until(t, "reconnected", 10*time.Second, nc.IsConnected)
	after, release2 := f.bind(context.Background())
	defer release2()
	time.Sleep(400 * time.Millisecond)
	if after.Err() != nil {
		t.Fatal("work delivered after the reconnect was cut")
	}
}
