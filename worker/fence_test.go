package worker

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
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
	// The fence reads its clock once a check: this one counts the checks
	// and makes each an hour after the last, far past the limit.
	var checks atomic.Int64
	start := time.Now()
	f.now = func() time.Time { return start.Add(time.Duration(checks.Add(1)) * time.Hour) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx) }()
	defer func() { cancel(); <-done }()
	// checked waits for n more checks of the fence: n chances to cut.
	checked := func(what string, n int64) {
		t.Helper()
		from := checks.Load()
		poll.Until(t, what, 10*time.Second, func() bool { return checks.Load() >= from+n })
	}

	before, release := f.bind(context.Background())
	defer release()
	checked("checks while connected", 5) // connected: nothing is cut however long
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
	checked("checks after the reconnect", 5)
	if after.Err() != nil {
		t.Fatal("work delivered after the reconnect was cut")
	}
}
